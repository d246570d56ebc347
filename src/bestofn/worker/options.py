"""The runtime options a worker runs with (``WorkerOptions``): the config's ``runtime:`` fields
that the worker itself reads, with their defaults from the config schema.

The group job builds them from its config (``WorkerOptions.from_runtime``) and hands them to
the worker it starts as one JSON document (``to_json``, ``bestofn worker --options``); the
worker reads them back (``from_json``) and builds everything from them. ``serving()`` is the
part that goes into the worker key (``bestofn.worker.key.SERVING``): a worker started under
other ones is replaced.

``runtime.experimental`` holds the options whose experiments did not make them a default
(``overlap: host``, ``generate_priority``): here they are plain fields, ``overlap`` the mode
the worker runs (the experimental one where set)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from bestofn.schemas import runtime_defaults, schema
from bestofn.worker.key import SERVING, serving


def experimental_defaults() -> dict:
    """``runtime.experimental`` field -> default, as the config schema declares them."""
    props = schema("config")["properties"]["runtime"]["properties"]["experimental"]["properties"]
    return {key: sub["default"] for key, sub in props.items()}


_DEFAULT = {**runtime_defaults(), **experimental_defaults()}


@dataclass(frozen=True)
class WorkerOptions:
    """What a worker runs with, besides what it serves (models, device, results, FLAC subtype).

    ``cache_dir``: absolute here (the group job resolves the config's, relative to the results
    directory); None: no caches set."""

    idle_timeout_s: float = float(_DEFAULT["idle_timeout_s"])
    overlap: str = _DEFAULT["overlap"]
    generate_priority: str = _DEFAULT["generate_priority"]
    gpu_memory_gb: float | None = _DEFAULT["gpu_memory_gb"]
    speech_max_batch: int = _DEFAULT["speech_max_batch"]
    speech_batch_window_ms: float = float(_DEFAULT["speech_batch_window_ms"])
    parallel_load: bool = _DEFAULT["parallel_load"]
    warm_up: bool | str = _DEFAULT["warm_up"]
    write_threads: int | None = _DEFAULT["write_threads"]
    cache_dir: str | None = None

    @classmethod
    def from_runtime(cls, runtime: dict | None, cache_dir: str | None = None) -> WorkerOptions:
        """From the config's ``runtime`` section (absent fields: the schema's defaults; fields
        the worker does not read: ignored)."""
        runtime = dict(runtime or {})
        experimental = dict(runtime.pop("experimental", None) or {})
        fields = {f.name for f in dataclasses.fields(cls)} - {"cache_dir"}
        values = {k: v for k, v in runtime.items() if k in fields and v is not None}
        if experimental.get("overlap"):  # the experimental mode replaces runtime.overlap
            values["overlap"] = experimental["overlap"]
        if experimental.get("generate_priority"):
            values["generate_priority"] = experimental["generate_priority"]
        return cls(**values, cache_dir=cache_dir)

    def serving(self) -> dict:
        """The options in the worker key (``bestofn.worker.key.SERVING``), normalised."""
        return serving(**{name: getattr(self, name) for name in SERVING})

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WorkerOptions:
        values = json.loads(text)
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"worker options: unknown field(s) {unknown}")
        return cls(**values)
