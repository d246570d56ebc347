"""`python -m lab.bench pipeline`: seconds per clip of the whole fused pipeline for a group
(generate -> restore -> score -> write), the product-level figure.

Every production backend is built at its REAL size with random weights (``bestofn.fakes``,
each family's ``build``): moss-fast (MOSS-TTS-Local-Transformer-v1.5 shape, bf16), Sidon, and the
scorers duration, Parakeet, VoiceCLAP and Empathic-Insight; then ``bestofn.core.runner.run_group``
(the group job's in-process path) runs complete groups (FLAC + parquet written atomically).
One warm-up group (compile, CUDA-graph capture, allocator) is followed by the timed groups.

What is not the product's cost, and why:
- Takes are forced to a fixed length (``--frames``, default 188 = 15.04 s): the random model's
  stop head is set to always continue and the frame budget is pinned (min = max = frames).
- The codec is MOSS-Audio-Tokenizer-v2 with random weights at its published size
  (``bestofn.fakes.moss_codec``), decoded by our own code as in production, unless
  ``--codec-dir`` names another v2 directory; its decode is also reported as ``codec_decode``.
- The prompt uses a stand-in tokenizer (``bestofn.fakes.moss.text_tokenizer``: GPT-2's BPE, about
  18 % more rows than Qwen2's on English).
- Random weights make noise-like audio (FLAC compresses it worse than speech) and make Parakeet
  emit more tokens than a real model: both make restore/score/write pessimistic, not optimistic.

``--size tiny`` builds the tiny test variants instead (CPU smoke test of the whole flow).

Old vs new in one run: each ``--variant NAME:key=value,...`` sets the speed knobs
(``overlap`` off/host/full, ``parakeet_batch``, ``parakeet_compile``, ``sidon_batch``,
``sidon_resample`` soxr/torch, ``sidon_compile``, ``sidon_bucket_s``) on the same loaded
backends, runs one warm-up group, then ``--stream-groups`` groups the way a warm worker
serves them (``--depth`` in flight, as runtime.queue_depth, through the worker's own scheduler
``bestofn.core.runner.Runner``: the same gates, streams and deferred host work), and
reports the throughput (first start to last end per clip), every stage's wall and GPU time
(CUDA events) per clip and the GPU's busy share. ``--variant before --variant after`` are
the defaults named in ``VARIANTS``. The knobs, the stream and its summary are
``lab.bench.pipeline_stream``; this module builds the backends and runs both modes.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from bestofn.backends.loading import switch_interval
from bestofn.core.groupio import SCORES, TAKES
from bestofn.core.pipeline import Backends
from bestofn.core.runner import run_group
from bestofn.util.spec import GroupSpec
from lab import kernel_profile
from lab.bench.pipeline_stream import (
    STAGES,
    VARIANTS,
    apply_variant,
    parse_variant,
    print_variants,
    run_stream,
    summarize_stream,
)

# ~31 words; with the frame count pinned the words only set the prompt length.
TEXT = (
    "I honestly did not think you would come back after everything that happened last winter, "
    "but here you are, standing in the doorway with that same crooked smile, "
    "as if nothing had ever changed between us."
)


class TimedCodec:
    """Wraps the generator's codec to time its decode, which the pipeline counts in
    ``generate`` (decode returns numpy arrays, so the time includes the GPU work)."""

    def __init__(self, codec):
        self.codec, self.seconds = codec, 0.0
        self.sample_rate, self.channels = codec.sample_rate, codec.channels

    def decode(self, codes):
        import torch

        t0 = time.perf_counter()
        with torch.profiler.record_function("stage:codec-decode"):  # apart under --profile
            out = self.codec.decode(codes)
        self.seconds += time.perf_counter() - t0
        return out

    def encode(self, audio, sample_rate):
        return self.codec.encode(audio, sample_rate)


def build_backends(
    size: str,
    device: str,
    frames: int,
    workdir: Path,
    codec_dir=None,
    gen_options: dict | None = None,
    parakeet_calibrated: bool = False,
    speaker: bool = False,
):
    """All production backends with random weights; returns (Backends, codec, build seconds).
    ``gen_options``: moss-fast runtime options (e.g. the production set's ``pair_groups``,
    ``decode_batch_size``); ``parakeet_calibrated``: Parakeet's joint calibrated to speech's
    token rate (``bestofn.fakes.parakeet.calibrate``), as ``fake-weights`` writes it."""
    import torch

    from bestofn.backends.duration import DurationScorer
    from bestofn.fakes import empathic, moss, moss_codec, parakeet, sidon, voiceclap

    tiny = size == "tiny"
    build_s = {}

    def timed(name, fn):
        t0 = time.perf_counter()
        out = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        build_s[name] = time.perf_counter() - t0
        print(f"# built {name} in {build_s[name]:.1f} s", flush=True)
        return out

    if codec_dir is None:
        codec_dir = timed("codec-write", lambda: moss_codec.write(workdir / "codec", size))
    gen = timed(
        "moss-fast",
        lambda: moss.build(
            device,
            size=size,
            codec_dir=str(codec_dir),
            min_frames=frames,
            max_frames=frames,
            **(gen_options or {}),
        ),
    )
    if tiny:  # the tiny random model stops at random frames; pin its length as the real one's
        with torch.no_grad():
            moss.always_continue_(gen.model.local_ln_f.bias, gen.model.stop_head)
    codec = TimedCodec(timed("codec", gen._codec))
    gen.codec = codec
    restorer = timed("sidon", lambda: sidon.build(device, size))
    asr = timed(
        "parakeet",
        lambda: parakeet.build(device, size, str(workdir / "asr"), calibrated=parakeet_calibrated),
    )
    scorers = [
        DurationScorer(device),
        asr,
        timed("voiceclap", lambda: voiceclap.build(device, size)),
        timed("empathic-insight", lambda: empathic.build(device, size)),
    ]
    if speaker:  # the production set's wavlm-speaker (opt-in: earlier ledger lines lack it)
        from bestofn.fakes import speaker as fake_speaker

        scorers.append(timed("wavlm-speaker", lambda: fake_speaker.build(device, size)))
    models = {
        "generator": {
            "backend": "moss-fast",
            "options": {"random": size, "frames": frames, **(gen_options or {})},
        },
        "restorer": {"backend": "sidon", "options": {"random": size}},
        "scorers": [{"backend": s.name, "options": {"random": size}} for s in scorers],
    }
    provenance = {
        "generator": gen.provenance(),
        "restorer": restorer.provenance(),
        "scorers": [s.provenance() for s in scorers],
    }
    backends = Backends(gen, restorer, scorers, models, sum(build_s.values()), provenance)
    return backends, codec, build_s


def run_one(spec, backends, codec, out_dir: Path, device: str) -> dict:
    """One complete group through run_group; per-stage and per-scorer seconds, checked."""
    codec.seconds = 0.0
    group_dir = out_dir / spec.emotion / spec.prompt_id
    t = run_group(spec, backends, group_dir, flac_subtype="PCM_24", device=device)
    table = pq.read_table(group_dir / SCORES)
    n_flac = len(list((group_dir / TAKES).glob("*.flac")))
    if table.num_rows != spec.n_takes or n_flac != spec.n_takes:
        raise RuntimeError(f"{group_dir}: {table.num_rows} rows, {n_flac} FLACs")
    score_seconds = json.loads(table.column("score_seconds")[0].as_py())
    durations = table.column("duration_s").to_pylist()
    return {
        **{f"{s}_s": t[f"{s}_s"] for s in STAGES},
        "codec_decode_s": codec.seconds,
        "wall_s": t["wall_s"],
        "score_seconds": score_seconds,
        "clip_seconds": sum(durations) / len(durations),
        "group_dir": str(group_dir),
    }


def summarize(n_takes: int, groups: list[dict]) -> dict:
    """Mean over the timed groups, in seconds per clip."""

    def per_clip(key, source=None):
        vals = [(g[source][key] if source else g[key]) / n_takes for g in groups]
        return sum(vals) / len(vals)

    stages = {s: per_clip(f"{s}_s") for s in STAGES}
    stages["codec_decode (in generate)"] = per_clip("codec_decode_s")
    scorers = {name: per_clip(name, "score_seconds") for name in groups[0]["score_seconds"]}
    return {
        "takes": n_takes,
        "timed_groups": len(groups),
        "s_per_clip": stages,
        "score_s_per_clip": scorers,
        "total_s_per_clip": sum(stages[s] for s in STAGES),
        "wall_s_per_clip": per_clip("wall_s"),
        "total_s_per_clip_without_codec": sum(stages[s] for s in STAGES)
        - stages["codec_decode (in generate)"],
        "clip_seconds": groups[0]["clip_seconds"],
        "groups": groups,
    }


def _print_summary(r: dict) -> None:
    n = r["takes"]
    print(f"\n## {n} takes/group, mean of {r['timed_groups']} timed groups, "
          f"{r['clip_seconds']:.2f} s clips")  # fmt: skip
    print("| stage | s/clip | s/group |\n|---|---:|---:|")
    for name, v in r["s_per_clip"].items():
        print(f"| {name} | {v:.4f} | {v * n:.2f} |")
        if name == "score":
            for sname, sv in r["score_s_per_clip"].items():
                print(f"| &nbsp; score: {sname} | {sv:.4f} | {sv * n:.2f} |")
    print(f"| **total** (generate+restore+score+write) | **{r['total_s_per_clip']:.4f}** "
          f"| {r['total_s_per_clip'] * n:.2f} |")  # fmt: skip
    print(f"| total without codec decode | {r['total_s_per_clip_without_codec']:.4f} | |")
    print(f"| wall (run_group start to finish) | {r['wall_s_per_clip']:.4f} | |")
    if "peak_gib" in r:
        print(f"peak GPU memory (timed groups): {r['peak_gib']:.1f} GiB")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    import torch

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m lab.bench pipeline", description=__doc__)
    ap.add_argument("--size", choices=("real", "tiny"), default="real")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--takes", default="64", help="comma-separated group sizes, e.g. 64,128")
    ap.add_argument("--frames", type=int, default=188, help="frames per take (12.5 per second)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed groups before the first size")
    ap.add_argument("--repeats", type=int, default=2, help="timed groups per size")
    ap.add_argument(
        "--budget-s", type=float, default=0.0, help="skip later sizes after this many s (0: never)"
    )
    ap.add_argument("--codec-dir", default=None, help="a real MOSS-Audio-Tokenizer-v2 directory")
    ap.add_argument("--workdir", default=None, help="where groups are written (default: temp)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument(
        "--variant",
        action="append",
        default=None,
        help="NAME or NAME:key=value,... (speed knobs, see the module doc; named: "
        f"{', '.join(VARIANTS)}); repeatable: the variants run one after another on the same "
        "backends, groups streamed as a worker does",
    )
    ap.add_argument("--stream-groups", type=int, default=4, help="timed groups per variant")
    ap.add_argument("--depth", type=int, default=2, help="groups in flight (queue depth)")
    ap.add_argument(
        "--gen-option",
        action="append",
        default=[],
        help="KEY=VALUE moss-fast runtime option (JSON value), repeatable; the production set: "
        "pair_groups=true decode_batch_size=64 (with --depth 4)",
    )
    ap.add_argument(
        "--parakeet-calibrated",
        action="store_true",
        help="Parakeet's joint calibrated to speech's token rate, as fake-weights writes it",
    )
    ap.add_argument(
        "--speaker",
        action="store_true",
        help="the production set's wavlm-speaker scorer too (variant knobs speaker_precision, "
        "speaker_batch, speaker_max_s)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="a directory: each variant's streamed groups run under torch.profiler; its trace "
        "(VARIANT.trace.json.gz) and the kernel time per stage and scorer in the steady state "
        "(lab.kernel_profile) go there and into the results",
    )
    args = ap.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant or []]
    if args.profile and not variants:
        raise SystemExit("--profile needs at least one --variant (it profiles streamed groups)")
    gen_options = {}
    for item in args.gen_option:
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--gen-option {item!r}: give KEY=VALUE")
        try:
            gen_options[key] = json.loads(value)
        except json.JSONDecodeError:
            gen_options[key] = value
    if variants and (args.stream_groups < 1 or args.depth < 1):
        raise SystemExit("--stream-groups and --depth must be at least 1")

    t_start = time.perf_counter()
    dev = args.device
    cuda = dev.startswith("cuda")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-pipeline-"))
    workdir.mkdir(parents=True, exist_ok=True)
    import transformers

    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python -m lab.bench pipeline " + " ".join(argv),
        "host": platform.node(),
        "device": dev,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "size": args.size,
        "frames_per_take": args.frames,
        "codec": args.codec_dir
        or f"MOSS-Audio-Tokenizer-v2, random weights ({args.size}, bestofn.fakes.moss_codec), "
        "decoded by bestofn.moss.codec.tokenizer",
        "flac_subtype": "PCM_24",
        "gen_options": gen_options,
        "parakeet": "calibrated" if args.parakeet_calibrated else "plain random",
        "speaker": bool(args.speaker),
    }
    for k, v in meta.items():
        print(f"# {k}: {v}")
    result = {"meta": meta, "sizes": []}

    def save():
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2))

    backends, codec, build_s = build_backends(
        args.size,
        dev,
        args.frames,
        workdir,
        args.codec_dir,
        gen_options,
        args.parakeet_calibrated,
        args.speaker,
    )
    result["build_s"] = build_s
    save()

    sizes = [int(n) for n in args.takes.split(",") if n]
    if variants:
        return _run_variants(args, variants, sizes[0], backends, codec, workdir, result, save)
    for k, n in enumerate(sizes):
        if k and args.budget_s and time.perf_counter() - t_start > args.budget_s:
            print(f"# skipping {n} takes/group: past --budget-s {args.budget_s:.0f} s")
            result["skipped"] = sizes[k:]
            break

        def spec(i, n=n):
            return GroupSpec(
                "happy", f"bench-{n}-{i}", TEXT, n, base_seed=i,
                emotion_description="A warm, relieved voice, close to tears.",
                negative_description="A flat, bored voice.",
            )  # fmt: skip

        for i in range(args.warmup if k == 0 else 0):
            t0 = time.perf_counter()
            w = run_one(spec(1000 + i), backends, codec, workdir, dev)
            stages = json.dumps({s: round(w[f"{s}_s"], 2) for s in STAGES})
            print(
                f"# warm-up group of {n}: {time.perf_counter() - t0:.1f} s ({stages})", flush=True
            )
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        groups = []
        for i in range(args.repeats):
            g = run_one(spec(i), backends, codec, workdir, dev)
            groups.append(g)
            print(f"# timed group {i} of {n}: "
                  f"{json.dumps({s: round(g[f'{s}_s'], 3) for s in STAGES})} "
                  f"scorers {json.dumps({s: round(v, 3) for s, v in g['score_seconds'].items()})}",
                  flush=True)  # fmt: skip
        summary = summarize(n, groups)
        if cuda:
            summary["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            summary["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        result["sizes"].append(summary)
        _print_summary(summary)
        save()
        for g in groups:  # keep the disk small; the last group stays for inspection
            if g is not groups[-1]:
                shutil.rmtree(g["group_dir"], ignore_errors=True)

    result["elapsed_s"] = time.perf_counter() - t_start
    save()
    print(f"# done in {result['elapsed_s']:.0f} s; groups under {workdir}")
    return 0


def _run_variants(args, variants, n, backends, codec, workdir, result, save) -> int:
    import torch

    from bestofn.core.runner import resolve_overlap

    dev = args.device
    cuda = dev.startswith("cuda")
    t_start = time.perf_counter()

    def spec(tag, i):
        return GroupSpec(
            "happy", f"{tag}-{n}-{i}", TEXT, n, base_seed=i,
            emotion_description="A warm, relieved voice, close to tears.",
            negative_description="A flat, bored voice.",
        )  # fmt: skip

    rows = []
    result["variants"] = rows
    built = {s.name: s.resampler for s in backends.scorers if hasattr(s, "resampler")}
    for name, knobs in variants:
        apply_variant(backends, knobs, built)
        mode = resolve_overlap(knobs.get("overlap"), dev)
        knobs = {**knobs, "overlap": mode}
        for i in range(args.warmup):
            t0 = time.perf_counter()
            run_one(spec(f"{name}-warmup", i), backends, codec, workdir, dev)
            print(f"# {name}: warm-up group {time.perf_counter() - t0:.1f} s", flush=True)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        specs = [spec(name, i) for i in range(args.stream_groups)]
        interval = (  # the process's own unless the variant sets one; back after it
            switch_interval(knobs["switch_interval_ms"] / 1000)
            if "switch_interval_ms" in knobs
            else contextlib.nullcontext()
        )
        trace = args.profile / f"{name}.trace.json.gz" if args.profile else None
        profiled = kernel_profile.profiling(trace) if trace else contextlib.nullcontext()
        with interval, profiled:
            timings, elapsed = run_stream(
                specs, backends, workdir, dev, mode, args.depth, knobs.get("gen_priority", 0)
            )
        row = summarize_stream(name, knobs, n, timings, elapsed)
        if trace:  # the steady state, as summarize_stream times it: first group end to last
            events = kernel_profile.load_events(trace)
            row["kernel_profile"] = kernel_profile.summarize(
                events, n * (len(specs) - 1), ("group-end", "group-end")
            )
            kernel_profile.print_summary(name, row["kernel_profile"])
        if cuda:
            row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        rows.append(row)
        print(f"# {name}: {row['s_per_clip']:.4f} s/clip over {len(specs)} groups "
              f"({elapsed:.1f} s)", flush=True)  # fmt: skip
        save()
        for s in specs:  # keep the disk small
            shutil.rmtree(workdir / s.emotion / s.prompt_id, ignore_errors=True)
    print_variants(rows)
    result["elapsed_s"] = time.perf_counter() - t_start
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
