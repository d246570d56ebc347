"""A worker's start, and what it says about itself after each group.

- **Caches** (config ``runtime.cache_dir``, handed to the worker as ``--cache-dir``):
  torch.compile's Inductor and Triton kernels and the weight files' content hashes are kept
  there across worker starts, so a second start skips the compiles and the hashing of tens of
  GB of weights; under ``backends/`` each backend keeps its own (``bestofn.util.caches``: Parakeet's
  ``.nemo`` archive, extracted). torch and Triton read their cache directories from the
  process environment: the worker sets them for itself (torch's interface), from the config,
  before any compile.
- **Warm-up** (``runtime.warm_up``): the group that made the client start this worker is run
  once through the stages, on the streams and gates a group uses, and nothing is written: its
  compiles, CUDA-graph captures and cuDNN plans happen before the worker answers ``/health``, so
  the first group is as fast as the next. Every later take is unchanged: takes are functions of
  their spec, seed and model (counter-based random numbers), and the state a warm-up leaves
  (compiled kernels, captured graphs, kept decode states) is what the first group would leave.
- **Timeline**: process start, imports, each backend's load, warm-up, ready (``/health``'s
  ``start``; one ``worker-start`` JSON line in the worker log).
- **Per group** (``group_stats``): the CUDA caching allocator's allocated and reserved bytes
  after the group, the CUDA graphs and graph pools the generator's engine keeps, the host RSS;
  a ``group-stats`` JSON line per group in the worker log (docs/bench/soak_gpu.sh reads them).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import sys
import time
from pathlib import Path

log = logging.getLogger("bestofn.worker")

WARM_UP_MODES = ("auto", True, False)


def resolve_warm_up(value, device: str) -> bool:
    """``runtime.warm_up``: auto -> on CUDA only (on the CPU a group compiles nothing)."""
    if isinstance(value, str):
        value = {"true": True, "false": False, "auto": "auto"}.get(value.strip().lower(), value)
    if value not in WARM_UP_MODES:
        raise ValueError(f"runtime.warm_up must be auto, true or false; got {value!r}")
    return str(device).startswith("cuda") if value == "auto" else bool(value)


def use_cache_dir(cache_dir: str | os.PathLike | None) -> dict:
    """Point torch.compile's caches and the weight-hash memo at ``cache_dir`` (None: leave
    torch's defaults and hash every start). Call before anything compiles; returns the paths."""
    if not cache_dir:
        return {}
    from bestofn.util import caches, hashing

    root = Path(cache_dir).expanduser().resolve()
    paths = {
        "inductor": root / "torch-compile",
        "triton": root / "triton",
        "sha256": root / "sha256-memo",
        "backends": root / "backends",  # each backend's own (bestofn.util.caches.subdir)
    }
    for p in paths.values():
        p.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(paths["inductor"])
    os.environ["TRITON_CACHE_DIR"] = str(paths["triton"])
    hashing.set_memo_dir(paths["sha256"])
    caches.set_root(paths["backends"])
    return {k: str(v) for k, v in paths.items()}


def process_start_unix() -> float | None:
    """When this process started (Linux: /proc), as a Unix time; None where unknown."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # starttime: clock ticks after boot
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return int(line.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return None


def warm_up(runner, spec) -> dict:
    """Run ``spec`` once through the runner's GPU phases (each on its stream, inside its gate,
    as a group runs) and finish its scorers' host work; write nothing. Returns seconds per
    stage. Reads the runner's phases (``bestofn.core.runner``) without changing them."""
    from bestofn.core.runner import GroupJob

    runner.setup()
    job = GroupJob(spec, Path(os.devnull))
    seconds: dict[str, float] = {}
    for phase in runner._phases():  # the runner's own phases, streams and gates
        with phase.gate, runner._on_stream(phase.stream):
            for stage in phase.stages:
                if stage.device != "gpu":
                    continue  # the write: nothing is published
                t0 = time.perf_counter()
                stage.process(job)
                seconds[stage.name] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for finish in job.work.deferred.values():  # text normalisation, WER: warmed, discarded
        finish()
    seconds["score_host"] = time.perf_counter() - t0
    if runner.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(runner.device)
    return seconds


def engine_graphs(generator) -> dict | None:
    """The decode states, CUDA graphs and graph memory pools the generator's engine keeps
    (moss-fast: its ``StateCache``), read without touching the engine; None without one."""
    engine = getattr(generator, "engine", None)
    states = getattr(engine, "states", None)
    if states is None:
        states = getattr(engine, "_states", None)  # the engine shell keeps them here today
    if states is None:
        return None
    for _ in range(3):  # the GPU thread may add or drop a state while this reads
        with contextlib.suppress(RuntimeError):
            kept = list(dict(states).values())
            break
    else:
        return None
    pools = {id(s.graph_pool) for s in kept if getattr(s, "graph_pool", None) is not None}
    return {
        "states": len(kept),
        "graphs": sum(len(getattr(s, "graphs", {}) or {}) for s in kept),
        "graph_pools": len(pools),
    }


def rss_mib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def _glibc(name: str, restype, argtypes=()):
    """glibc's function ``name`` with its C signature, or None (another C library)."""
    with contextlib.suppress(Exception):
        fn = getattr(ctypes.CDLL(None), name)
        fn.restype, fn.argtypes = restype, list(argtypes)
        return fn
    return None


def trim_host_heap() -> float | None:
    """Give the free pages of every malloc arena back to the OS (glibc ``malloc_trim(0)``);
    returns the seconds it took, None where there is no glibc. Changes no computation, only
    which freed pages stay resident.

    Why, after every group: a group's buffers (takes, restored audio, features) are freed, but
    glibc keeps the pages. A group's helpers run in new pool threads (resample, FLAC writers;
    until the worker pooled its request threads, the group itself ran on a new one too); a new
    thread takes whichever of up to 8 x cores arenas is free, so over the groups every arena
    grows to the largest set of buffers any thread ever left in it, and RSS climbs in steps of
    an arena heap (64 MiB) for hundreds of groups (the H200 soak, ledger figure
    soak.host_rss_growth). glibc itself only returns the top of a heap past M_TRIM_THRESHOLD,
    which its dynamic mmap threshold raises to as much as 64 MiB. On the CPU soak the growth was
    in those arena heaps, and this call cut most of it (ledger figure
    soak.cpu_tiny_rss_growth)."""
    global _trim
    if _trim is False:
        _trim = _glibc("malloc_trim", ctypes.c_int, [ctypes.c_size_t])
    if _trim is None:
        return None
    t0 = time.perf_counter()
    _trim(0)
    return time.perf_counter() - t0


_trim = False  # looked up on the first call


class _Mallinfo2(ctypes.Structure):  # glibc >= 2.33, <malloc.h>
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def malloc_heap_mib() -> dict | None:
    """glibc's own count of the malloc heap, every arena: ``in_use`` (live blocks, mmapped
    ones included), ``free`` (free blocks still mapped) and ``mmapped``, MiB; None without
    glibc's ``mallinfo2``. Tells a live leak (in_use grows) from fragmentation (free grows)
    where RSS alone cannot (the H200 soak: the brk heap grew after malloc_trim)."""
    global _mallinfo2
    if _mallinfo2 is False:
        _mallinfo2 = _glibc("mallinfo2", _Mallinfo2)
    if _mallinfo2 is None:
        return None
    m = _mallinfo2()
    return {
        "in_use": (m.uordblks + m.hblkhd) / 2**20,
        "free": m.fordblks / 2**20,
        "mmapped": m.hblkhd / 2**20,
    }


_mallinfo2 = False  # looked up on the first call


def group_stats(backends, device: str, groups_done: int) -> dict:
    """What the worker holds after a group: memory (allocator, host) and the engine's graphs.

    Host memory beside the RSS: glibc's heap (``malloc_*_mib``), Python's live objects
    (``python_blocks``) and torch's pinned host cache (``pinned_host_mib``), so a soak can say
    which one grows."""
    out: dict = {"groups_done": groups_done, "t_unix": time.time(), "host_rss_mib": rss_mib()}
    heap = malloc_heap_mib()
    if heap is not None:
        out.update({f"malloc_{key}_mib": value for key, value in heap.items()})
    out["python_blocks"] = sys.getallocatedblocks()
    torch = sys.modules.get("torch")
    if torch is not None and str(device).startswith("cuda") and torch.cuda.is_initialized():
        # allocator counters only: no CUDA call, safe beside another thread's graph capture
        out["cuda_allocated_mib"] = torch.cuda.memory_allocated(device) / 2**20
        out["cuda_reserved_mib"] = torch.cuda.memory_reserved(device) / 2**20
        out["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        with contextlib.suppress(Exception):  # torch >= 2.5; counters of the pinned cache
            pinned = torch.cuda.host_memory_stats()
            out["pinned_host_mib"] = pinned.get("allocated_bytes.current", 0) / 2**20
    graphs = engine_graphs(backends.generator)
    if graphs is not None:
        out["engine"] = graphs
    return out


def log_json(tag: str, record: dict) -> None:
    """One ``TAG {json}`` line in the worker log (machine-readable: soak and start probes)."""
    log.info("%s %s", tag, json.dumps(record, sort_keys=True, default=str))
