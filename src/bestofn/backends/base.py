"""The three backend roles. Each adapter carries the facts needed to use it.

Audio convention everywhere: ``numpy.float32`` arrays, shape ``(frames,)`` for mono or
``(frames, channels)`` (soundfile's layout), values in [-1, 1], plus an integer sample rate.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from bestofn.util.spec import GroupSpec


@dataclass
class Take:
    audio: np.ndarray  # float32, (frames,) or (frames, channels)
    seed: int
    meta: dict = field(default_factory=dict)  # backend-specific per-take facts (e.g. n_frames)


class Backend:
    """Common surface: a name, a device, and provenance for every row it touches."""

    name: ClassVar[str] = "?"
    # its row of config/README.md's backend table (bestofn.backends.doc writes the table): the
    # weights it reads and its options, in markdown
    table_weights: ClassVar[str] = "–"
    table_options: ClassVar[str] = "–"

    @classmethod
    def known_options(cls) -> frozenset[str]:
        """The config keys this backend accepts, under ``options`` and ``runtime`` alike (both
        reach the constructor as keyword arguments). By default the constructor's named
        parameters, less ``device`` and private ones (``_model``...: objects that tests and
        benches inject, never config). A constructor taking ``**options`` must override this.
        Needs only the class, so config checks find typos without loading any model."""
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]  # less self
        if any(p.kind is p.VAR_KEYWORD for p in params):
            raise TypeError(f"{cls.__qualname__} takes **kwargs: override known_options()")
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return frozenset(
            p.name
            for p in params
            if p.kind in named and p.name != "device" and not p.name.startswith("_")
        )

    @classmethod
    def check_options(cls, options: dict) -> None:
        """Check the values of the config's ``options`` and ``runtime`` (merged) without
        loading anything: the plan calls it before any GPU work, the constructor again. A
        ValueError names the option. By default there is nothing to check."""

    def provenance(self) -> dict:
        """Model ids/paths, hashes and settings that made this backend's output."""
        return {"backend": self.name}

    def weights_sha256(self) -> dict:
        """sha256 of the weight files this backend read (``self._weight_files``), computed once
        per process (they can be many GB) and through the worker cache's memo
        (``self._hash_memo``, see ``hash_memo_dir``) across processes."""
        if not hasattr(self, "_hashes"):
            from bestofn.util.hashing import hash_files

            self._hashes = hash_files(self._weight_files, self._hash_memo)
        return self._hashes

    def close(self) -> None:  # release GPU memory etc.; optional
        pass


def hash_memo_dir(cache_dir) -> Path | None:
    """Where a backend memoises its weight files' hashes: under the worker's cache directory
    (``runtime.cache_dir``), none without one."""
    return Path(cache_dir).expanduser() / "hash-memo" if cache_dir else None


class Generator(Backend):
    sample_rate: int
    # What the plan and the speech path ask of a generator without naming it: whether its
    # options hold the pacing dial (bestofn.moss.budget: part of a group's identity with the
    # schema's defaults filled in, bestofn.core.pipeline), and whether it takes in new speech
    # requests while it decodes (continuous batching, bestofn.moss.stream).
    paced: ClassVar[bool] = False
    feeds_while_decoding: ClassVar[bool] = False

    @classmethod
    def measured_gpu_memory(cls, entry: dict) -> tuple[float, str] | None:
        """GiB of GPU memory one worker of a production set with this generator (``entry``: its
        config, options and runtime) was measured to need, and where the figure comes from
        (`bestofn doctor` checks each GPU's free memory against it); None: none measured."""
        return None

    def generate(self, spec: GroupSpec) -> list[Take]:
        """Return ``spec.n_takes`` takes of ``spec.text``; take i uses seed ``spec.seeds()[i]``."""
        raise NotImplementedError


class Restorer(Backend):
    # The rate its model hears, when it is below the takes' (it then makes the upper band
    # again): the plan notes a wideband generator restored through it (core.recipe_checks).
    input_sample_rate: ClassVar[int | None] = None

    def restore(self, audios: list[np.ndarray], sample_rate: int) -> tuple[list[np.ndarray], int]:
        """Return restored audio and its (possibly new) sample rate; same length list."""
        raise NotImplementedError


class Scorer(Backend):
    # column name -> DuckDB type name ("DOUBLE", "VARCHAR", "BIGINT"). May be set per
    # instance at load time when the columns depend on the weights (e.g. discovered heads);
    # then set ``dynamic_columns = True`` so config checks don't expect them up front.
    columns: ClassVar[dict[str, str]] = {}
    dynamic_columns: ClassVar[bool] = False
    # Which way is better, per column: "higher" or "lower" (a column left out has no direction:
    # an emotion's intensity, a transcript). Keys may be glob patterns for dynamic columns. The
    # trust tables read it (best possible take, held-out verdicts; bestofn.select.trust).
    better: ClassVar[dict[str, str]] = {}
    # When set, the pipeline hands this scorer mono audio at this rate, resampled once per
    # group and shared by every scorer asking for the same rate.
    input_sample_rate: ClassVar[int | None] = None
    # How the pipeline resamples for it: soxr on the host or torch on the device
    # (``runtime.resampler`` of any scorer, taken by the registry, bestofn.backends.scorer_input).
    resampler: str = "soxr"
    # What the plan asks of a scorer without naming it (bestofn.core.voice_acting,
    # recipe_checks, bestofn.select.rewards): the ASR model when it reads English only (prompts
    # in another language are refused); the columns that measure a take against the group's
    # reference voice (the group's centroid without one); whether it writes one column per
    # emotion head, ``<column_prefix><head>`` (ei_target, ei_spec).
    english_only: ClassVar[str | None] = None
    reference_columns: ClassVar[frozenset[str]] = frozenset()
    emotion_heads: ClassVar[bool] = False

    @classmethod
    def known_options(cls) -> frozenset[str]:
        return super().known_options() | {"resampler"}

    @classmethod
    def planned_columns(cls, options: dict) -> dict[str, str] | None:
        """The columns it will write, known before it loads: its ``columns``; a scorer with
        ``dynamic_columns`` says which its ``options`` give (None: not known before loading)."""
        return None if cls.dynamic_columns else dict(cls.columns)

    @classmethod
    def check_plan(cls, options: dict, groups: dict, selection_uses, sheet, base):
        """(errors, notes) about the plan's groups for this scorer, before any model loads:
        ``groups`` (emotion, prompt_id) -> GroupSpec, ``selection_uses(column)`` whether the
        selection reads a column, ``sheet`` the emotions sheet, ``base`` what relative paths
        are under."""
        return [], []

    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec) -> dict[str, list]:
        """Return one list per column in ``columns``, each ``len(audios)`` long."""
        raise NotImplementedError


# A scorer's ``runtime.resampler``: how the pipeline brings its input to the scorer's rate
# (bestofn.backends.scorer_input.scorer_input). Resolved here, where every scorer is built.
RESAMPLERS = ("auto", "soxr", "torch")


def resolve_resampler(value: str | None, device: str) -> str:
    """``runtime.resampler`` of a scorer: auto -> torch on CUDA, soxr elsewhere."""
    if value is None:
        from bestofn.schemas import schema

        backend = schema("config")["$defs"]["backend"]["properties"]["runtime"]
        value = backend["properties"]["resampler"]["default"]
    if value not in RESAMPLERS:
        raise ValueError(f"runtime.resampler must be one of {', '.join(RESAMPLERS)}; got {value!r}")
    if value == "auto":
        return "torch" if str(device).startswith("cuda") else "soxr"
    return value
