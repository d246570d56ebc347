"""The fused pipeline's stages for one group: generate -> restore -> score -> write, audio kept
in memory, and the backends they run on (``load_backends``).

Each stage is a plain function of the group's ``GroupWork`` and the loaded backends;
``bestofn.core.runner`` schedules them (one group in this process, or consecutive groups overlapped
by a warm worker), so every caller runs the same stages in the same order."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from bestofn import __version__
from bestofn.backends.base import Generator, Restorer, Scorer, Take
from bestofn.backends.registry import DEFAULT_RESTORER
from bestofn.backends.scorer_input import scorer_input
from bestofn.core.groupio import TAKES, take_name, write_group
from bestofn.util.spec import GroupSpec
from bestofn.util.torch_threads import default_cpu_threads, torch_threads

ARROW_TYPES = {
    "DOUBLE": pa.float64(),
    "FLOAT": pa.float32(),
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "VARCHAR": pa.string(),
    "BOOLEAN": pa.bool_(),
}


# How a take ended (column ``stop_reason``): the stop head fired ('eos'), the frame budget cut
# it ('budget', and ``truncated`` is true), or it has no audio at all ('empty').
STOP_REASONS = ("eos", "budget", "empty")
# An empty take is published as this much digital silence (a 0-frame FLAC does not decode);
# its row says stop_reason 'empty' and n_frames 0, and duration_s is the silence's length.
EMPTY_TAKE_S = 0.25


def take_ending(take: Take, generator: str) -> dict:
    """``n_frames``, ``truncated`` and ``stop_reason`` of one take, from its meta.

    A generator without codec frames (piper) leaves ``n_frames`` unset (NULL). A take with no
    audio samples is 'empty' whatever its meta says; a truncated one is 'budget'."""
    meta = take.meta or {}
    n_frames = meta.get("n_frames")
    truncated = bool(meta.get("truncated", False))
    reason = meta.get("stop_reason")
    if np.asarray(take.audio).shape[0] == 0:
        reason = "empty"
    elif reason is None:
        reason = "budget" if truncated else "eos"
    if reason not in STOP_REASONS or (truncated and reason == "eos"):
        raise RuntimeError(
            f"generator {generator!r}: take with seed {take.seed} says stop_reason {reason!r}, "
            f"truncated {truncated}; expected one of {STOP_REASONS} ('budget' when truncated)"
        )
    return {
        "n_frames": None if n_frames is None else int(n_frames),
        "truncated": truncated and reason == "budget",
        "stop_reason": reason,
    }


def _silence_like(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    n = max(1, int(round(EMPTY_TAKE_S * sample_rate)))
    return np.zeros((n, *np.asarray(audio).shape[1:]), dtype=np.float32)


def stable_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _strip_runtime(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "runtime"}


def models_identity(models: dict, memo_dir: Path | None = None) -> dict:
    """The models section without each backend's ``runtime`` knobs (batch sizes, threads,
    compile flags), every weights path replaced by its content identity (bestofn.weights.
    identity: no path, so moving the weights reruns nothing): what makes a take, and so what a
    group's params and hashes include. ``memo_dir``: the sha256 memo (None: the process's)."""
    from bestofn.weights.identity import models_content

    out = {}
    for role, value in models.items():
        if role == "scorers":
            out[role] = [_strip_runtime(s) for s in value]
        else:
            out[role] = _strip_runtime(value) if isinstance(value, dict) else value
    if isinstance(out.get("generator"), dict):
        out["generator"] = _with_pacing(out["generator"])
    return models_content(out, memo_dir)


def _with_pacing(entry: dict) -> dict:
    """A MOSS generator's entry with its whole pacing dial (the schema's defaults filled in):
    the dial changes the prompt and the budget, so a changed default reruns the groups too."""
    from bestofn.backends.registry import backend_class

    if not getattr(backend_class("generator", entry["backend"]), "paced", False):
        return entry
    from bestofn.moss.budget import FrameBudget

    options = entry.get("options") or {}
    return {**entry, "options": {**FrameBudget.from_options(options).as_dict(), **options}}


def backend_kwargs(entry: dict) -> dict:
    """A model entry's options and runtime knobs as one set of keyword arguments (the plan
    refuses a key set in both)."""
    return {**(entry.get("options") or {}), **(entry.get("runtime") or {})}


@dataclass
class Backends:
    generator: Generator
    restorer: Restorer
    scorers: list[Scorer]
    models: dict  # the model section of the config these were built from (identity)
    load_s: float = 0.0
    provenance: dict = field(default_factory=dict)
    # torch's intra-op threads while a group's stages run, in whichever thread runs them
    # (bestofn.util.torch_threads: some CPU kernels give other bits with another count); 0: the
    # default, fixed now from the environment
    cpu_threads: int = 0
    # where load_s went (bestofn.backends.loading.load_report): per backend its import, build
    # and provenance seconds (and a backend's own parts, e.g. moss-fast's checkpoint read)
    load_report: dict = field(default_factory=dict)

    def __post_init__(self):
        self.cpu_threads = int(self.cpu_threads) or default_cpu_threads()

    @functools.cached_property
    def models_hash(self) -> str:  # hashes the weights (memoised): once per worker
        return stable_hash(models_identity(self.models))


def load_backends(models: dict, device: str = "cpu", parallel: bool | None = None) -> Backends:
    """Build every backend named in the config's ``models`` section, once.

    The weight files' facts are compared first (nothing loads on a mismatch), the rates between
    the loaded stages after (bestofn.core.agreement): either raises AgreementError naming both.
    ``parallel`` (config ``runtime.parallel_load``; None: the schema's default): build the
    backends in threads at once (bestofn.backends.loading); the backends are the same either
    way. ``Backends.load_report`` says where the seconds went."""
    from bestofn.backends.loading import build_all
    from bestofn.core import agreement

    if parallel is None:
        from bestofn.schemas import runtime_defaults

        parallel = runtime_defaults()["parallel_load"]
    t0 = time.perf_counter()
    agreement.check_files(models)
    checked_s = time.perf_counter() - t0
    gen = models["generator"]
    rest = models.get("restorer") or {"backend": DEFAULT_RESTORER}
    entries = [("generator", gen["backend"], backend_kwargs(gen)),
               ("restorer", rest["backend"], backend_kwargs(rest))]  # fmt: skip
    entries += [("scorer", s["backend"], backend_kwargs(s)) for s in models.get("scorers", [])]
    built, provenances, report = build_all(entries, device, bool(parallel))
    generator, restorer, *scorers = built
    seen: dict[str, str] = {}
    for s in scorers:
        for col in s.columns:
            if col in seen:
                raise ValueError(f"scorers {seen[col]!r} and {s.name!r} both write column {col!r}")
            seen[col] = s.name
    backends = Backends(generator, restorer, scorers, models)
    t_agree = time.perf_counter()
    agreement.check_loaded(backends)
    backends.provenance = {
        "generator": provenances[0],
        "restorer": provenances[1],
        "scorers": provenances[2:],
    }
    if str(device).startswith("cuda"):  # load_s includes the device work the loads queued
        import torch

        torch.cuda.synchronize(device)
        # the loads' temporaries (tensors read to the device, then fused or cast into the
        # parameters) go back: the first group starts from the memory the weights need
        torch.cuda.empty_cache()
    backends.load_s = time.perf_counter() - t0
    report.update(check_files_s=checked_s, check_loaded_s=time.perf_counter() - t_agree,
                  load_s=backends.load_s)  # fmt: skip
    backends.load_report = report
    return backends


def _check_scores(scorer: Scorer, scores: dict, n: int) -> None:
    for col in scorer.columns:
        if col not in scores:
            raise RuntimeError(f"scorer {scorer.name!r} returned no column {col!r}")
        if len(scores[col]) != n:
            raise RuntimeError(
                f"scorer {scorer.name!r} column {col!r} has {len(scores[col])} values for {n} takes"
            )


@functools.cache
def device_label(device: str) -> str:
    """``device`` as the host numbers it, with the GPU's name: a worker started with
    ``CUDA_VISIBLE_DEVICES=3`` runs on its ``cuda:0``, and its rows say ``cuda:3 NVIDIA H200``,
    so the throughput table shows which physical GPU served each group."""
    if not device.startswith("cuda"):
        return device
    import torch

    index = torch.device(device).index or 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    host_index = visible[index] if index < len(visible) and visible[index] else str(index)
    return f"cuda:{host_index} {torch.cuda.get_device_name(index)}"


GPU_STAGES = ("generate", "restore", "score")  # the stages with GPU time (CUDA events)


class StageTimer:
    """Seconds per stage of one group: host wall time (``perf_counter``; every stage ends with
    its results on the host, so this is synchronized time) and, on CUDA, the span between two
    CUDA events recorded on the stage's stream (the GPU time the stage occupied, read without
    a device-wide sync). Stages may be entered several times; their times add up."""

    def __init__(self, device: str = "cpu"):
        self.cuda = str(device).startswith("cuda")
        self.wall: dict[str, float] = {}
        self._events: dict[str, list] = {}
        # stage -> this group's share of its spans (a generate call two groups shared)
        self.share: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str, gpu: bool = True):
        """Time a stage; ``gpu=False``: host wall time only (no CUDA call at all, for work off
        the GPU thread: a CUDA call there could meet another thread's CUDA-graph capture)."""
        events, label = None, contextlib.nullcontext()
        if self.cuda and gpu:
            import torch

            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        loaded = sys.modules.get("torch")
        if loaded is not None:
            # a range a profiler's trace attributes kernels to (`bench pipeline --profile`);
            # unconditional because the profiler's on-switch is thread-local and the stages run
            # on other threads; without a profiler it costs a few microseconds
            label = loaded.profiler.record_function(f"stage:{name}")
        t0 = time.perf_counter()
        with label:
            yield  # an exception propagates without touching the device again
        self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - t0
        if events is not None:
            events[1].record()
            self._events.setdefault(name, []).append(events)

    def gpu_seconds(self) -> dict[str, float] | None:
        """CUDA-event seconds per stage (None off CUDA). Waits for each stage's end event only."""
        if not self.cuda:
            return None
        out = {}
        for name, pairs in self._events.items():
            total = 0.0
            for start, end in pairs:
                end.synchronize()
                total += start.elapsed_time(end) / 1000.0
            out[name] = total * self.share.get(name, 1.0)
        return out


@dataclass
class GroupWork:
    """One group between the stages (``generate_stage`` -> ``score_stage`` -> ``write_stage``).

    The runner may run the GPU stages of the next group while this one is written (and, with
    ``overlap: full``, generate, restore and score three groups at once, a phase each)."""

    spec: GroupSpec
    device: str
    started: datetime
    timer: StageTimer
    takes: list = field(default_factory=list)
    endings: list = field(default_factory=list)
    raw: list = field(default_factory=list)
    gen_rate: int = 0
    audios: list = field(default_factory=list)
    sr: int = 0
    scores: dict = field(default_factory=dict)
    # scorer name -> a callable that returns the scorer's columns (host work still running in
    # the scorer's thread: text normalisation, WER); called by write_stage
    deferred: dict = field(default_factory=dict)
    # the GPU stages' CUDA-event seconds, read on the GPU thread at the end of score_stage
    gpu: dict | None = None
    # the group whose takes came from the same generate calls ('' alone; column paired_with)
    paired_with: str = ""


def generate_stage(spec: GroupSpec, backends: Backends, device: str = "cpu") -> GroupWork:
    """Generate the group's takes (the generator's GPU work), checked, empty takes as silence."""
    work = GroupWork(spec, device, datetime.now(UTC), StageTimer(device))
    device_label(device)  # cached now, on the GPU thread: write_stage makes no CUDA call
    with work.timer("generate"), torch_threads(backends.cpu_threads):
        _take_takes(work, backends.generator.generate(spec), backends)
    return work


def generate_pair_stage(
    specs: list[GroupSpec], backends: Backends, device: str = "cpu"
) -> list[GroupWork]:
    """``generate_stage`` of two groups in shared generate calls (``generator.generate_pair``;
    runtime option pair_groups): each group gets the takes it gets alone, its share of the
    time (by takes: the shares add up to the calls' time) and its partner's id."""
    started = datetime.now(UTC)
    works = [GroupWork(spec, device, started, StageTimer(device)) for spec in specs]
    device_label(device)
    lead = works[0].timer
    with lead("generate"), torch_threads(backends.cpu_threads):
        per_group = backends.generator.generate_pair(specs)
        if len(per_group) != len(specs):
            raise RuntimeError(f"generator returned {len(per_group)} groups, expected {len(specs)}")
        for work, takes in zip(works, per_group, strict=True):
            _take_takes(work, takes, backends)
    total = lead.wall["generate"]
    n_all = sum(spec.n_takes for spec in specs)
    for work in works:
        share = work.spec.n_takes / n_all
        work.timer.wall["generate"] = total * share
        work.timer.share["generate"] = share
        work.timer._events["generate"] = list(lead._events.get("generate", []))
        work.paired_with = ",".join(w.spec.group_id for w in works if w is not work)
    return works


def _take_takes(work: GroupWork, takes: list[Take], backends: Backends) -> None:
    """A group's takes from its generator, checked; empty ones become silence."""
    spec = work.spec
    if len(takes) != spec.n_takes:
        raise RuntimeError(
            f"generator returned {len(takes)} takes for {spec.group_id}, expected {spec.n_takes}"
        )
    endings = [take_ending(tk, backends.generator.name) for tk in takes]
    gen_rate = backends.generator.sample_rate
    work.raw = [
        _silence_like(tk.audio, gen_rate) if end["stop_reason"] == "empty" else tk.audio
        for tk, end in zip(takes, endings, strict=True)
    ]
    work.takes, work.endings, work.gen_rate = takes, endings, gen_rate


def restore_stage(work: GroupWork, backends: Backends) -> GroupWork:
    with work.timer("restore"), torch_threads(backends.cpu_threads):
        work.audios, work.sr = backends.restorer.restore(work.raw, work.gen_rate)
    work.raw = []  # the restored takes replace them
    return work


def score_stage(work: GroupWork, backends: Backends, defer_host: bool = False) -> GroupWork:
    """Run every scorer. With ``defer_host``, a scorer that can (``score_deferred``) returns
    after its GPU work and finishes its host work (text normalisation, WER) in its own thread;
    ``write_stage`` collects it. The columns are the same either way."""
    with work.timer("score"), torch_threads(backends.cpu_threads):
        # Resample once per rate (and runtime.resampler) that scorers ask for; every scorer
        # asking for 16 kHz with the same resampler shares it.
        at_rate: dict[tuple[int, str], list[np.ndarray]] = {}
        for scorer in backends.scorers:
            with work.timer(f"score:{scorer.name}"):
                want = scorer.input_sample_rate
                if want is None:
                    inputs, rate = work.audios, work.sr
                else:
                    key = (want, getattr(scorer, "resampler", "soxr"))
                    if key not in at_rate:
                        at_rate[key] = scorer_input(work.audios, work.sr, want, key[1], work.device)
                    inputs, rate = at_rate[key], want
                if defer_host and hasattr(scorer, "score_deferred"):
                    work.deferred[scorer.name] = scorer.score_deferred(inputs, rate, work.spec)
                    continue
                out = scorer.score(inputs, rate, work.spec)
                _check_scores(scorer, out, len(work.audios))
                work.scores.update({c: out[c] for c in scorer.columns})
    work.gpu = work.timer.gpu_seconds()  # waits for this group's own end events only
    return work


def _collect_deferred(work: GroupWork, backends: Backends) -> None:
    for scorer in backends.scorers:
        finish = work.deferred.pop(scorer.name, None)
        if finish is None:
            continue
        with work.timer(f"score-host:{scorer.name}", gpu=False):
            out = finish()
        _check_scores(scorer, out, len(work.audios))
        work.scores.update({c: out[c] for c in scorer.columns})


def write_stage(
    work: GroupWork,
    backends: Backends,
    group_dir: Path,
    *,
    flac_subtype: str = "PCM_16",
    charged_load_s: float | None = None,
    worker_idle_s: float = 0.0,
    worker_slot: int = -1,
    paths_relative_to: Path | None = None,
    overlap: str = "off",
    write_threads: int | None = None,
) -> dict:
    """Collect deferred scores, build the rows and atomically write the group (host work
    only: no CUDA call, so it may run beside the next group's GPU stages, CUDA-graph
    captures included). Returns the stage timings."""
    group_dir = Path(group_dir)
    spec = work.spec
    _collect_deferred(work, backends)
    wall = work.timer.wall
    gpu = work.gpu
    t = {
        "generate_s": wall.get("generate", 0.0),
        "restore_s": wall.get("restore", 0.0),
        # a scorer's host work finished in its thread counts in score (the waiting, if any)
        "score_s": wall.get("score", 0.0)
        + sum(v for k, v in wall.items() if k.startswith("score-host:")),
    }
    score_seconds = {
        s.name: wall.get(f"score:{s.name}", 0.0) + wall.get(f"score-host:{s.name}", 0.0)
        for s in backends.scorers
    }
    gpu_s = {stage: None if gpu is None else gpu.get(stage, 0.0) for stage in GPU_STAGES}
    if gpu is not None:  # the returned timings stay plain numbers
        t.update({f"{stage}_gpu_s": v for stage, v in gpu_s.items()})
    score_gpu = None if gpu is None else {s.name: gpu.get(f"score:{s.name}", 0.0)
                                          for s in backends.scorers}  # fmt: skip

    load_s = backends.load_s if charged_load_s is None else charged_load_s
    rows = _rows(
        spec, work.takes, work.endings, work.audios, work.sr, work.scores, backends, group_dir,
        paths_relative_to,
    )  # fmt: skip
    fixed = {
        "group_generate_s": t["generate_s"],
        "group_restore_s": t["restore_s"],
        "group_score_s": t["score_s"],
        "group_load_s": load_s,
        "worker_idle_s": worker_idle_s,
        "score_seconds": json.dumps(score_seconds),
        "device": device_label(work.device),
        "worker_slot": worker_slot,  # -1: models loaded in the group's own process
        "worker_pid": os.getpid(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),  # '' outside SLURM
        "started_at": work.started,
    }
    for name, value in fixed.items():
        rows = rows.append_column(name, pa.array([value] * rows.num_rows))
    # GPU time per stage (CUDA events; NULL off CUDA) and how the worker overlapped groups
    for name, value, typ in (
        ("group_generate_gpu_s", gpu_s["generate"], pa.float64()),
        ("group_restore_gpu_s", gpu_s["restore"], pa.float64()),
        ("group_score_gpu_s", gpu_s["score"], pa.float64()),
        ("score_gpu_seconds", None if score_gpu is None else json.dumps(score_gpu), pa.string()),
        ("overlap", overlap, pa.string()),
        # the group that shared this group's generate calls ('' alone): runtime pair_groups
        ("paired_with", work.paired_with, pa.string()),
    ):
        rows = rows.append_column(name, pa.array([value] * rows.num_rows, typ))
    write_started = time.perf_counter()

    def add_write_timing(table: pa.Table) -> pa.Table:
        # Called by write_group after the FLACs are on disk, just before the parquet is written.
        now = datetime.now(UTC)
        t["write_s"] = time.perf_counter() - write_started
        t["wall_s"] = (now - work.started).total_seconds()
        for name, value in (
            ("group_write_s", t["write_s"]),
            ("group_wall_s", t["wall_s"]),
            ("finished_at", now),
        ):
            table = table.append_column(name, pa.array([value] * table.num_rows))
        return table

    write_group(
        group_dir, work.audios, work.sr, rows, flac_subtype=flac_subtype,
        io_threads=write_threads, finalize=add_write_timing,
    )  # fmt: skip
    return t


def _rows(
    spec, takes, endings, audios, sr, scores, backends: Backends, group_dir: Path, relative_to
) -> pa.Table:
    n = len(audios)
    provenance = json.dumps(backends.provenance, sort_keys=True)
    base = Path(relative_to) if relative_to is not None else Path.cwd()
    takes_dir = Path(os.path.relpath(Path(group_dir).absolute() / TAKES, base.absolute()))
    cols = {
        "group_id": pa.array([spec.group_id] * n),
        "emotion": pa.array([spec.emotion] * n),
        "prompt_id": pa.array([spec.prompt_id] * n),
        "take": pa.array(range(n), pa.int32()),
        "seed": pa.array([tk.seed for tk in takes], pa.int64()),
        "text": pa.array([spec.text] * n),
        "language": pa.array([spec.language] * n),
        "flac_path": pa.array([str(takes_dir / take_name(i)) for i in range(n)]),
        "duration_s": pa.array([a.shape[0] / sr for a in audios], pa.float64()),
        "sample_rate": pa.array([sr] * n, pa.int32()),
        "channels": pa.array([1 if a.ndim == 1 else a.shape[1] for a in audios], pa.int32()),
        "n_frames": pa.array([e["n_frames"] for e in endings], pa.int32()),
        "truncated": pa.array([e["truncated"] for e in endings], pa.bool_()),
        "stop_reason": pa.array([e["stop_reason"] for e in endings], pa.string()),
        "reference_audio": pa.array([spec.reference_audio or ""] * n),
    }
    for scorer in backends.scorers:
        for col, typ in scorer.columns.items():
            cols[col] = pa.array(scores[col], ARROW_TYPES.get(typ.upper()))
    cols.update(
        {
            "generator": pa.array([backends.generator.name] * n),
            "models": pa.array([provenance] * n),
            "models_hash": pa.array([backends.models_hash] * n),
            "spec_hash": pa.array([stable_hash(asdict(spec))] * n),
            "bestofn_version": pa.array([__version__] * n),
            "host": pa.array([socket.gethostname()] * n),
        }
    )
    return pa.table(cols)
