"""Where a GPU's time goes while a warm worker serves groups: CUDA kernel time per pipeline stage
and scorer, from one torch.profiler trace (``bench pipeline --profile``).

Why a trace and not the stage timer: the stage timer's CUDA events give the span a stage
occupied on its stream, and under ``overlap: full`` two streams share the GPU, so a span
stretches with the other stream's work. Kernel durations do not: their sum per stage is that
stage's own GPU work, and the union of all kernels is the time the GPU was busy at all.

How a kernel is attributed: CUPTI gives each kernel (graph replays included) the correlation id
of the runtime call that launched it; that call ran on a host thread, inside the innermost
``stage:NAME`` range of that thread (``bestofn.core.pipeline.StageTimer`` opens one per stage and
per scorer while a profiler runs). Kernels launched outside any range are counted as
``(none)``. Zero-length ``mark:NAME`` ranges set the window (``mark``).
"""

from __future__ import annotations

import bisect
import contextlib
import gzip
import json
from collections import defaultdict
from pathlib import Path

STAGE_PREFIX = "stage:"
MARK_PREFIX = "mark:"
KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@contextlib.contextmanager
def profiling(trace_path: Path):
    """torch.profiler over every thread, CPU and CUDA; the Chrome trace goes to ``trace_path``
    (gzipped JSON) on exit."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    extra = {}
    with contextlib.suppress(TypeError):  # profile_all_threads: torch >= 2.7
        extra["experimental_config"] = torch._C._profiler._ExperimentalConfig(
            profile_all_threads=True
        )
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], **extra) as prof:
        yield
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    trace_path = Path(trace_path)
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    raw = trace_path.with_suffix("")  # torch writes plain JSON; keep the gzipped copy only
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(trace_path, "wb") as dst:
        dst.write(src.read())
    raw.unlink()


def top_ops(fn, device: str, top: int) -> list[str]:
    """``fn()`` once under torch.profiler (CUDA-synchronised): its ``top`` ops by device time
    (CPU: by CPU time), as the lines of torch's table."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    key = "device_time_total" if cuda else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=top, max_name_column_width=60)
    return table.splitlines()


def mark(name: str) -> None:
    """A zero-length range the summary can use as a window edge (unconditional: the
    profiler's on-switch is thread-local, and marks come from other threads)."""
    import torch

    with torch.profiler.record_function(MARK_PREFIX + name):
        pass


def load_events(trace_path: Path) -> list[dict]:
    opener = gzip.open if str(trace_path).endswith(".gz") else open
    with opener(trace_path, "rt") as f:
        return json.load(f)["traceEvents"]


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _innermost_ranges(events: list[dict]) -> dict:
    """(pid, tid) -> (sorted starts, [(start, end, name)]) of the ``stage:`` ranges."""
    per_thread = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and str(e.get("name", "")).startswith(STAGE_PREFIX):
            start = float(e["ts"])
            end = start + float(e.get("dur", 0))
            per_thread[(e.get("pid"), e.get("tid"))].append(
                (start, end, e["name"][len(STAGE_PREFIX) :])
            )
    out = {}
    for key, ranges in per_thread.items():
        ranges.sort()
        out[key] = ([r[0] for r in ranges], ranges)
    return out


def _range_at(index, key, ts: float) -> str:
    """The innermost stage range of thread ``key`` open at ``ts`` (the latest-starting one)."""
    starts, ranges = index.get(key, ((), ()))
    i = bisect.bisect_right(starts, ts) - 1
    while i >= 0:  # ranges nest per thread: walk back to the first that still covers ts
        start, end, name = ranges[i]
        if end >= ts:
            return name
        i -= 1
    return "(none)"


def summarize(events: list[dict], clips: int, window: tuple[str, str] | None = None, top: int = 8):
    """Kernel time per stage, per stream and overall in the window between the first ``mark:A``
    and the last ``mark:B`` (``window=(A, B)``; None: the whole trace), in seconds and seconds
    per clip (``clips``: the clips the window covers)."""
    marks = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and str(e.get("name", "")).startswith(MARK_PREFIX):
            marks[e["name"][len(MARK_PREFIX) :]].append(float(e["ts"]))
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in KERNEL_CATS]
    if window is None:
        lo = min((float(k["ts"]) for k in kernels), default=0.0)
        hi = max((float(k["ts"]) + float(k.get("dur", 0)) for k in kernels), default=0.0)
    else:
        if not marks.get(window[0]) or not marks.get(window[1]):
            raise ValueError(f"trace has no marks {window}; marks found: {sorted(marks)}")
        lo, hi = min(marks[window[0]]), max(marks[window[1]])
    launch = {}  # correlation id -> (pid, tid, ts) of the runtime call
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launch[e["args"]["correlation"]] = (e.get("pid"), e.get("tid"), float(e["ts"]))
    index = _innermost_ranges(events)

    per_stage = defaultdict(float)
    per_stream = defaultdict(float)
    names = defaultdict(lambda: defaultdict(float))
    spans = []
    for k in kernels:
        a, b = float(k["ts"]), float(k["ts"]) + float(k.get("dur", 0))
        a, b = max(a, lo), min(b, hi)
        if b <= a:
            continue
        args = k.get("args", {})
        where = launch.get(args.get("correlation"))
        stage = "(none)" if where is None else _range_at(index, where[:2], where[2])
        d = (b - a) / 1e6
        per_stage[stage] += d
        per_stream[str(args.get("stream", "?"))] += d
        names[stage][str(k.get("name"))[:120]] += d
        spans.append((a, b))
    window_s = (hi - lo) / 1e6
    busy_s = _union(spans) / 1e6
    clips = max(int(clips), 1)

    def per_clip(x):
        return round(x / clips, 6)

    return {
        "window": list(window) if window else None,
        "window_s": round(window_s, 6),
        "clips": clips,
        "window_s_per_clip": per_clip(window_s),
        "gpu_busy_s_per_clip": per_clip(busy_s),
        "gpu_busy_fraction": round(busy_s / window_s, 4) if window_s else None,
        "kernel_s_per_clip": per_clip(sum(per_stage.values())),
        "kernel_s_per_clip_by_stage": {
            s: per_clip(v) for s, v in sorted(per_stage.items(), key=lambda kv: -kv[1])
        },
        "kernel_s_per_clip_by_stream": {s: per_clip(v) for s, v in sorted(per_stream.items())},
        "top_kernels_by_stage": {
            s: [
                {"kernel": n, "s_per_clip": per_clip(v)}
                for n, v in sorted(names[s].items(), key=lambda kv: -kv[1])[:top]
            ]
            for s in per_stage
        },
    }


def print_summary(name: str, s: dict) -> None:
    print(f"\n## kernel time, {name}: {s['clips']} clips in {s['window_s']:.1f} s "
          f"({s['window_s_per_clip']:.4f} s/clip); GPU busy {s['gpu_busy_s_per_clip']:.4f} "
          f"s/clip ({100 * (s['gpu_busy_fraction'] or 0):.1f} %), kernels "
          f"{s['kernel_s_per_clip']:.4f} s/clip")  # fmt: skip
    print("| stage | kernel s/clip | top kernels |\n|---|---:|---|")
    for stage, v in s["kernel_s_per_clip_by_stage"].items():
        tops = "; ".join(f"{t['kernel'][:50]} {t['s_per_clip']:.5f}"
                         for t in s["top_kernels_by_stage"][stage][:3])  # fmt: skip
        print(f"| {stage} | {v:.5f} | {tops} |")
