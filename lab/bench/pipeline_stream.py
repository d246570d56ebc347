"""The variants mode of `python -m lab.bench pipeline`: the speed knobs a ``--variant`` sets
(``KNOBS``, the named ``VARIANTS``), applied to loaded backends, then groups streamed the way a
warm worker serves them (``run_stream``) and summarised per clip: throughput, steady state,
every stage's wall and GPU time, the GPU's busy share (``summarize_stream``,
``print_variants``). ``lab.bench.pipeline`` builds the backends and drives it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from bestofn.backends.base import RESAMPLERS
from bestofn.core.groupio import SCORES
from lab import kernel_profile

STAGES = ("generate", "restore", "score", "write")
GPU_STAGES = ("generate", "restore", "score")
# Speed knobs a variant sets, and their types.
KNOBS = {
    "overlap": str,
    "parakeet_batch": int,
    "parakeet_compile": lambda v: v.lower() in ("1", "on", "true", "yes"),
    "sidon_batch": int,
    "sidon_resample": str,
    "sidon_compile": lambda v: v.lower() in ("1", "on", "true", "yes"),
    "sidon_bucket_s": float,
    "sidon_snake": str,  # auto, fused or eager (the restorer's runtime.snake)
    "sidon_layout": str,  # nchw or channels_last (the restorer's runtime.layout)
    # CUDA stream priority of the generate stage (-1: high; 0, the default: as the others),
    # so its chain of small kernels is scheduled before restore/score's big ones
    "gen_priority": int,
    "switch_interval_ms": float,  # sys.setswitchinterval for the run (else the process's own)
    # the speaker scorer's runtime dials (with --speaker; a variant without one: as built)
    "speaker_precision": lambda v: _one_of(v, ("auto", "float32", "bfloat16")),
    "speaker_batch": int,
    "speaker_max_s": float,  # 0: the whole take
    # every scorer's runtime.resampler (a variant without it: the config's)
    "resampler": lambda v: _one_of(v, tuple(r for r in RESAMPLERS if r != "auto")),
}
# Before the speed work (the sequential worker, Parakeet batch 64, Sidon resampling on the host
# with soxr) and after it (the defaults on CUDA).
VARIANTS = {
    "before": "overlap=off,parakeet_batch=64,parakeet_compile=0,sidon_resample=soxr,"
    "sidon_compile=0,sidon_batch=32",
    "after": "overlap=host,parakeet_batch=128,parakeet_compile=0,sidon_resample=torch,"
    "sidon_compile=0,sidon_batch=32",
}


def _one_of(value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{value!r} is not one of {list(allowed)}")
    return value


def parse_variant(text: str) -> tuple[str, dict]:
    """``NAME`` (one of VARIANTS) or ``NAME:key=value,...``; returns (name, knobs)."""
    name, _, spec = text.partition(":")
    spec = spec or VARIANTS.get(name)
    if spec is None:
        raise SystemExit(f"--variant {text!r}: give NAME:key=value,... or one of {list(VARIANTS)}")
    knobs = {}
    for item in filter(None, spec.split(",")):
        key, eq, value = item.partition("=")
        if key not in KNOBS or not eq:
            raise SystemExit(f"--variant {text!r}: unknown knob {key!r}; known: {list(KNOBS)}")
        try:
            knobs[key] = KNOBS[key](value)
        except ValueError as e:
            raise SystemExit(f"--variant {text!r}: knob {key}: {e}") from None
    return name, knobs


def apply_variant(backends, knobs: dict, resamplers: dict | None = None) -> None:
    """Set a variant's knobs on the loaded backends (Parakeet and Sidon ``set_speed``, the
    scorers' resampler). ``resamplers``: each scorer's as built (by name), what a variant
    without the knob gets back."""
    for scorer in backends.scorers:
        if scorer.name == "parakeet":
            scorer.set_speed(knobs.get("parakeet_batch"), knobs.get("parakeet_compile"))
        if scorer.name == "wavlm-speaker":
            scorer.set_speed(
                knobs.get("speaker_precision"), knobs.get("speaker_batch"),
                knobs.get("speaker_max_s"),
            )  # fmt: skip
        want = knobs.get("resampler") or (resamplers or {}).get(scorer.name)
        if want and hasattr(scorer, "resampler"):
            scorer.resampler = want
    if backends.restorer.name == "sidon":
        from bestofn.backends.sidon import DEFAULT_LAYOUT, DEFAULT_SNAKE

        backends.restorer.set_speed(
            knobs.get("sidon_batch"),
            knobs.get("sidon_resample"),
            knobs.get("sidon_compile"),
            knobs.get("sidon_bucket_s"),
            # a variant without them: the restorer's defaults, not an earlier variant's
            snake=knobs.get("sidon_snake", DEFAULT_SNAKE),
            layout=knobs.get("sidon_layout", DEFAULT_LAYOUT),
        )


def run_stream(
    specs, backends, out_dir: Path, device: str, overlap: str, depth: int = 2, gen_priority: int = 0
):
    """Groups served as a warm worker serves them: ``depth`` in flight (runtime.queue_depth),
    each group's thread calling the worker's own scheduler (``bestofn.core.runner.Runner``, set up
    as ``bestofn.worker.server.Worker`` sets it up), so this measures the product's gates,
    streams and deferred host work. Returns (timings, elapsed)."""
    import threading

    from bestofn.core.runner import GroupJob, Runner

    runner = Runner(
        backends, device, overlap, flac_subtype="PCM_24", charge_load="first",
        generate_priority=gen_priority,
    ).setup()  # fmt: skip
    slots = threading.Semaphore(depth)
    timings: list = [None] * len(specs)
    errors: list = []

    def one(i, spec):
        try:
            timings[i] = runner.run(GroupJob(spec, out_dir / spec.emotion / spec.prompt_id))
            timings[i]["ended_at_s"] = time.perf_counter() - t0
            kernel_profile.mark("group-end")
        except BaseException as e:  # reported after the join
            errors.append(e)
        finally:
            slots.release()

    threads = []
    t0 = time.perf_counter()
    for i, spec in enumerate(specs):
        slots.acquire()
        threads.append(threading.Thread(target=one, args=(i, spec), name=f"group-{i}"))
        threads[-1].start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    for spec, t in zip(specs, timings, strict=True):  # per scorer, as the rows say
        table = pq.read_table(out_dir / spec.emotion / spec.prompt_id / SCORES)
        t["score_seconds"] = json.loads(table.column("score_seconds")[0].as_py())
    return timings, elapsed


def summarize_stream(name, knobs, n_takes, timings, elapsed) -> dict:
    clips = n_takes * len(timings)

    def per_clip(key):
        vals = [t.get(key) for t in timings]
        return None if any(v is None for v in vals) else sum(vals) / clips

    gpu = {s: per_clip(f"{s}_gpu_s") for s in GPU_STAGES}  # None off CUDA
    busy = None if any(v is None for v in gpu.values()) else sum(gpu.values())
    scorers = {}
    for t in timings:
        for k, v in t["score_seconds"].items():
            scorers[k] = scorers.get(k, 0.0) + v / clips
    # Steady state as docs/bench/gpu_workflow.sh times the workflow: from the first group's end
    # to the last group's end, over the clips of the groups after the first (the pipeline's
    # fill, one group's whole latency, is left out: "first start to last end" counts it).
    ends = sorted(t["ended_at_s"] for t in timings)
    steady = (ends[-1] - ends[0]) / (clips - n_takes) if len(ends) > 1 else None
    return {
        "variant": name,
        "knobs": knobs,
        "takes": n_takes,
        "groups": len(timings),
        "elapsed_s": elapsed,
        "s_per_clip": elapsed / clips,  # the throughput: first start to last end
        "steady_s_per_clip": steady,
        "wall_s_per_clip": {s: per_clip(f"{s}_s") for s in STAGES},
        "gpu_s_per_clip": gpu,
        "gpu_busy_s_per_clip": busy,
        "gpu_busy_fraction": None if busy is None else busy * clips / elapsed,
        "score_s_per_clip": scorers,
    }


def print_variants(rows: list[dict]) -> None:
    def f(v):
        return "–" if v is None else f"{v:.4f}"

    print("\n## variants: throughput and time per stage (s/clip)")
    print("| variant | s/clip (throughput) | s/clip (steady) | generate wall/GPU | restore "
          "wall/GPU | score wall/GPU | write | GPU busy s/clip | GPU busy % |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        w, g = r["wall_s_per_clip"], r["gpu_s_per_clip"]
        frac = r["gpu_busy_fraction"]
        print(f"| {r['variant']} | **{r['s_per_clip']:.4f}** | {f(r['steady_s_per_clip'])} | "
              + " | ".join(f"{f(w[s])} / {f(g[s])}" for s in GPU_STAGES)
              + f" | {f(w['write'])} | {f(r['gpu_busy_s_per_clip'])} | "
              f"{'–' if frac is None else f'{100 * frac:.1f}'} |")  # fmt: skip
    print("\nper scorer (s/clip, wall incl. deferred text work):")
    for r in rows:
        per = ", ".join(f"{k} {v:.4f}" for k, v in r["score_s_per_clip"].items())
        print(f"- {r['variant']}: {per}")
    for r in rows:
        print(f"- {r['variant']} knobs: {json.dumps(r['knobs'])}")
    sys.stdout.flush()
