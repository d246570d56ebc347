"""Building a config's backends, in threads at once, with a report of where the seconds went.

The backends are independent (each reads its own files onto the device), and most of a load
is work that lets other threads run: file reads and hashing (safetensors, hashlib), host to
device copies, and CUDA work. Python itself (imports, module construction) holds the GIL, so:

- the third-party packages a backend imports when it is built (its declared ``preload``:
  NeMo, transformers' model modules) are imported by ONE thread while the other threads read
  weights. Two threads importing the same package at once can meet a partially initialised
  module; one import thread never does. It takes them in the backends' ``preload_rank``
  order, not the config's. The builds that need them run one at a time (below), so the order
  keeps that one-at-a-time lane busy while the long import runs: Empathic-Insight first (its
  transformers import is short, its build long), then Parakeet (NeMo's long import overlaps
  that build; ledger figure worker_start.first_group_load_s), Sidon, VoiceCLAP, the speaker
  model;
- each backend is built in its own thread once its imports are in (at once when it has none:
  moss-fast reads its checkpoint while NeMo imports). Builds of backends that do not declare
  ``parallel_build`` (``registry.builds_beside_others``) take one lock, so only one at a
  time runs: transformers and NeMo
  build their modules under torch's process-wide default dtype and ``torch.nn.init``, which
  ``from_pretrained`` changes while it runs. Each build runs with the calling thread's
  torch intra-op thread count (``bestofn.util.torch_threads``: a CPU op run with another count can
  round differently, so a weight folded at load gets the same bits as in a serial load);
- its provenance (which hashes its weight files) is taken in the same thread, right after;
- while the threads run, the interpreter hands the GIL on after ``SWITCH_INTERVAL_S``, not
  Python's default 5 ms. A thread that reads weights releases the GIL inside every tensor read
  and device copy, and must take it back from whichever thread is running Python (an import,
  OmegaConf): with 5 ms it waits up to 5 ms after each of its tensor operations (the convoy
  effect). On the H200 moss-fast's codec load took several times longer beside Parakeet's
  build than beside lighter work, and about as long as alone with a short interval (ledger
  figure worker_start.gil_convoy).

The first error, in config order, is raised once every thread is done (a thread cannot be
stopped half way through a load), so an error reads as it does in a serial load."""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from bestofn.backends import registry
from bestofn.util.torch_threads import torch_threads

# The GIL switch interval during a parallel load (see the module docstring); restored after.
SWITCH_INTERVAL_S = 0.0005


@contextlib.contextmanager
def switch_interval(seconds: float):
    """Run the block with ``sys.setswitchinterval(seconds)``; the caller's value after."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def preload(name: str) -> None:
    """Import what backend ``name`` imports when it is built (its declared ``preload``)."""
    for target in registry.preload_targets(name):
        module_name, _, attrs = target.partition(":")
        module = importlib.import_module(module_name)
        for attr in filter(None, attrs.split(",")):
            getattr(module, attr)  # a lazy package (transformers) imports the class's module


def _caller_threads() -> int:
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else 0


def _labels(entries) -> list[str]:
    """``generator:NAME``, ``restorer:NAME``, ``scorer{i}:NAME`` (i: its place among scorers)."""
    out, scorers = [], 0
    for role, name, _ in entries:
        if role == "scorer":
            role, scorers = f"scorer{scorers}", scorers + 1
        out.append(f"{role}:{name}")
    return out


def import_order(entries) -> list[int]:
    """Indices of the ``entries`` with packages to import (``registry.preload_targets``), in
    the order the import thread takes them: their ``preload_rank``, then config order."""
    with_imports = [k for k, (_, name, _) in enumerate(entries) if registry.preload_targets(name)]
    return sorted(with_imports, key=lambda k: (registry.preload_rank(entries[k][1]), k))


def build_all(entries: list[tuple[str, str, dict]], device: str, parallel: bool):
    """Build ``entries`` [(role, backend name, kwargs)] on ``device``.

    Returns (backends, their provenance dicts, a report): per backend (by label, e.g.
    ``generator:moss-fast``) ``import_s`` (its module and its ``preload``), ``build_s``,
    ``provenance_s``, ``start_s`` / ``end_s`` (offsets from the start of this call) and, when
    the backend keeps one, ``parts`` (its own ``load_seconds``: moss-fast's checkpoint read,
    device copies, codec, compile setup)."""
    t0 = time.perf_counter()
    labels = _labels(entries)
    per: dict[str, dict] = {label: {} for label in labels}
    for label, (role, name, _) in zip(labels, entries, strict=True):
        a = time.perf_counter()
        registry.backend_class(role, name)  # our own modules: light, imported here in turn
        per[label]["import_s"] = time.perf_counter() - a
    threads = _caller_threads()
    torch = sys.modules.get("torch")
    default_dtype = torch.get_default_dtype() if torch is not None else None
    order = import_order(entries)
    imported = [threading.Event() for _ in entries]
    for k in set(range(len(entries))) - set(order):
        imported[k].set()  # nothing to import: it builds at once
    import_errors: list[BaseException | None] = [None] * len(entries)

    def import_all():
        for k in order:
            name = entries[k][1]
            a = time.perf_counter()
            try:
                preload(name)
            except BaseException as e:  # raised by the build, which imports it again
                import_errors[k] = e
            per[labels[k]]["import_s"] += time.perf_counter() - a
            imported[k].set()

    one_at_a_time = threading.Lock()

    def build(k: int):
        role, name, kwargs = entries[k]
        imported[k].wait()
        rec = per[labels[k]]
        beside = registry.builds_beside_others(name)
        alone = contextlib.nullcontext() if beside else one_at_a_time
        with alone:
            rec["start_s"] = time.perf_counter() - t0
            with torch_threads(threads):
                backend = registry.build(role, name, kwargs, device)
            rec["build_s"] = time.perf_counter() - t0 - rec["start_s"]
        with torch_threads(threads):
            a = time.perf_counter()
            provenance = backend.provenance()
            rec["provenance_s"] = time.perf_counter() - a
        parts = getattr(backend, "load_seconds", None)
        if isinstance(parts, dict) and parts:
            rec["parts"] = dict(parts)
        rec["end_s"] = time.perf_counter() - t0
        return backend, provenance

    if not parallel:
        import_all()
        results = [build(k) for k in range(len(entries))]
    else:
        with switch_interval(SWITCH_INTERVAL_S):
            loader = threading.Thread(target=import_all, name="bestofn-imports", daemon=True)
            loader.start()
            with ThreadPoolExecutor(len(entries), thread_name_prefix="bestofn-load") as pool:
                futures = [pool.submit(build, k) for k in range(len(entries))]
            loader.join()
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        results = [f.result() for f in futures]
    torch = sys.modules.get("torch")
    if torch is not None and default_dtype is None:  # imported by a build: its default then
        default_dtype = torch.float32
    if torch is not None and torch.get_default_dtype() != default_dtype:
        raise RuntimeError(
            f"loading the backends left torch's default dtype {torch.get_default_dtype()} "
            f"(was {default_dtype}): a build changed process-wide state; its modules may have "
            "been built in the wrong dtype"
        )
    report = {
        "parallel": parallel,
        "backends": per,
        "build_wall_s": time.perf_counter() - t0,
        # what a serial load of the same builds would have taken
        "build_sum_s": sum(r.get("build_s", 0) + r.get("provenance_s", 0) for r in per.values()),
    }
    return [b for b, _ in results], [p for _, p in results], report
