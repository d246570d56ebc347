"""The worker contract: one spec decides whether a warm worker may serve a group.

A worker is keyed by everything that shapes what it writes: the models section (with the runtime
knobs it was built with), the device (and, on GPUs, which physical GPU the slot maps to), the
FLAC subtype and the results directory; and by the config's runtime options that shape how it
runs (``SERVING``: how the GPU's phases overlap, the generate stream's priority, the GPU memory
cap, the FLAC write threads). Those change no take, but a worker started under other ones would
keep them: a long-lived ``bestofn serve`` whose config now says ``overlap: off`` must not go on
serving with ``full``. And by the code it runs (``code_identity``): a worker started before an
upgrade or an edit of the checkout would otherwise serve the new run's groups with the old
stages (seen once: a workflow killed past its limit left its worker up, and the next run, of
another tree, was served by it). The group job computes the key of the worker it needs; a worker
whose key differs, or that is not healthy, is replaced. Nothing else decides reuse.

Not in the key: ``parallel_load``, ``warm_up`` and ``cache_dir`` (they shape only a start),
and the idle exit and speech batching (``idle_timeout_s``, ``speech_*``), which ``bestofn
serve`` may set on its command line: with them in the key, a server and a workflow on one slot
would replace each other's worker. A warm worker keeps those until it exits."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from bestofn.core.pipeline import stable_hash
from bestofn.util.hashing import combined_sha256, files_under

# runtime.* a worker serves with (bestofn.worker.options.WorkerOptions; generate_priority and an
# overlap of host come from runtime.experimental), and how each is written in the spec (one form
# for the group job's values and the worker's, so that both give one key)
SERVING = {
    "overlap": str,
    "generate_priority": str,
    "gpu_memory_gb": lambda v: None if v is None else float(v),
    "write_threads": lambda v: None if v is None else int(v),
}


def serving(**options) -> dict:
    """The ``SERVING`` options, normalised; every one must be given."""
    missing = sorted(set(SERVING) - set(options))
    if missing or set(options) - set(SERVING):
        raise TypeError(f"serving options: need exactly {sorted(SERVING)}; missing {missing}")
    return {name: SERVING[name](options[name]) for name in SERVING}


PACKAGE = Path(__file__).resolve().parents[1]  # the bestofn package this process imports


def tree_digest(root: Path) -> str:
    """A digest of every file under ``root`` (names and bytes), hidden entries (a tool's cache
    or lock, ``hashing.files_under``) and byte code left out."""
    files = {}
    for path in files_under(root):
        rel = path.relative_to(root)
        if "__pycache__" not in rel.parts and path.suffix != ".pyc":
            files[rel.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return combined_sha256(files)[:16]


@functools.cache
def code_identity() -> str:
    """The bestofn this process runs, as ``tree_digest`` of its package: equal for two
    processes that run the same code, whatever the version string says (an editable checkout
    keeps one version across edits). Computed once a process."""
    return tree_digest(PACKAGE)


def worker_spec(
    models: dict,
    device: str,
    flac_subtype: str,
    results_dir: str | Path,
    visible_device: str | None = None,
    serving_options: dict | None = None,
    weights: str | None = None,
) -> dict:
    """``weights``: a digest of the models' content identity, where the caller has it (a group
    job: its params), else None (the worker's own spec, `bestofn serve`)."""
    return {
        "weights": weights,
        "models": models,
        "device": device,
        "visible_device": visible_device,
        "flac_subtype": flac_subtype,
        "results_dir": str(Path(results_dir).resolve()),
        "serving": serving_options,
        "code": code_identity(),
    }


def worker_key(spec: dict) -> str:
    return stable_hash(spec)


def spec_difference(health: dict, want: dict) -> str:
    """What differs between a running worker (its /health answer) and the wanted spec."""
    have = health.get("spec") or {}
    diffs = []
    if health.get("models_hash") != stable_hash(want["models"]):
        diffs.append("models")
    for field, value in want.items():
        if field == "models" or have.get(field) == value:
            continue
        if field == "weights":  # the worker's own spec has none (its key has it): below
            continue
        if isinstance(value, dict) and isinstance(have.get(field), dict):  # serving: by option
            old = have[field]
            diffs += [f"runtime.{k} {old.get(k)!r} -> {v!r}" for k, v in value.items()
                      if old.get(k) != v]  # fmt: skip
        else:
            diffs.append(f"{field} {have.get(field)!r} -> {value!r}")
    return ", ".join(diffs) or "worker key differs (the weights' content, where nothing else does)"
