"""`python -m lab.bench scorers`: seconds per 15 s clip for each production scorer and the
restorer, at real model size with random weights, batch 32 and 64, from numpy audio in to
Python values out (so host<->device copies and any resampling inside the backend count).

The pipeline resamples the takes to 16 kHz mono once per group for all scorers; that shared
step is timed separately ("resample48k->16k").

Old vs new in one run: ``--parakeet-batch-sizes 64,128`` and ``--parakeet-compile
off,on`` add Parakeet rows per combination on ``--parakeet-clips`` clips (``score``, and
``deferred``: the time until the GPU work is done, the text work left running in the scorer's
thread, which is what the worker's critical path sees); ``--sidon-resample soxr,torch``,
``--sidon-compile off,on`` and ``--sidon-bucket-s`` add Sidon rows per combination, fed
48 kHz stereo takes as the generator makes them (so the 48->16 kHz resample is inside)."""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import platform
import time

import numpy as np
import yaml

from bestofn.util.audio import resample
from bestofn.util.spec import GroupSpec
from lab.kernel_profile import top_ops

BACKENDS = {  # the random-weight builders (bestofn.fakes), one module per backend
    "voiceclap": "bestofn.fakes.voiceclap",
    "empathic-insight": "bestofn.fakes.empathic",
    "wavlm-speaker": "bestofn.fakes.speaker",
    "sidon": "bestofn.fakes.sidon",
    "parakeet": "bestofn.fakes.parakeet",
    "audiobox-aesthetics": "bestofn.fakes.audiobox",
}


def clips(n: int, seconds: float, sr: int, seed: int = 0, spread: float = 0.0) -> list[np.ndarray]:
    """Speech-like test signals: a few harmonics with a syllable-rate envelope plus noise;
    ``spread`` > 0: lengths evenly over [seconds - spread, seconds], as a group's takes differ
    (every length its own)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = seconds - spread * i / max(1, n - 1)
        t = np.arange(int(length * sr)) / sr
        f0 = rng.uniform(90, 220)
        voiced = sum(np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6)) / k for k in range(1, 6))
        envelope = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(3, 5) * t)
        out.append(
            (0.1 * voiced * envelope + 0.01 * rng.standard_normal(t.size)).astype(np.float32)
        )
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def time_call(fn, device: str, repeats: int) -> float:
    fn()  # warm-up: kernels, autotuning, allocator
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def runtime_variants(text: str) -> list[dict]:
    """``precision=float32,batch_size=64;precision=bfloat16`` -> one dict per variant (numbers
    as numbers, null as None)."""
    out = []
    for variant in filter(None, (v.strip() for v in text.split(";"))):
        kw = {}
        for pair in filter(None, (p.strip() for p in variant.split(","))):
            key, sep, value = pair.partition("=")
            if not sep:
                raise SystemExit(f"--speaker-runtime: {pair!r} is not KEY=VALUE")
            kw[key.strip()] = yaml.safe_load(value)  # 64 -> int, 0.5 -> float, null -> None
        out.append(kw)
    return out


def bench_backend(name, args, batches, audio16, spec, meta, audio48s=None, kw=None) -> list[dict]:
    module = importlib.import_module(BACKENDS[name])
    t0 = time.perf_counter()
    backend = module.build(args.device, args.size, **(kw or {}))
    if kw:  # a variant of the runtime dials: its row says which
        meta = {**meta, "runtime": kw}
        name_shown = f"{name}[{','.join(f'{k}={v}' for k, v in kw.items())}]"
    else:
        name_shown = name
    build_s = time.perf_counter() - t0
    cuda = args.device.startswith("cuda")
    if cuda:
        import torch
    rows = []
    for b in batches:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        if name == "sidon":
            call = lambda b=b: backend.restore(audio16[:b], 16000)  # noqa: E731
        else:
            call = lambda b=b: backend.score(audio16[:b], 16000, spec)  # noqa: E731
        t = time_call(call, args.device, args.repeats)
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        row = {**meta, "backend": name_shown, "batch": b, "s_per_clip": t / b,
               "batch_s": t, "peak_gib": peak, "build_s": build_s}  # fmt: skip
        if args.profile:
            row["profile"] = top_ops(call, args.device, args.profile)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
        print("\n".join(row.get("profile", [])), flush=True)
    if name == "parakeet" and not args.no_split and not args.spread:  # split: one length
        rows += parakeet_split(backend, args, batches, audio16, meta)
    rows += speed_rows(name, backend, args, batches, audio16, audio48s, spec, meta)
    backend.close()
    if cuda:
        torch.cuda.empty_cache()
    return rows


def _peak() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_initialized() else None


def _flags(text: str) -> list[bool]:
    return [v.strip().lower() in ("1", "on", "true", "yes") for v in text.split(",") if v]


def speed_rows(name, backend, args, batches, audio16, audio48s, spec, meta) -> list[dict]:
    """Rows per speed-knob combination of Parakeet or Sidon, on the same loaded backend."""
    import itertools

    cuda = args.device.startswith("cuda")
    if cuda:
        import torch
    rows = []
    if name == "parakeet" and args.parakeet_batch_sizes:
        sizes = [int(b) for b in args.parakeet_batch_sizes.split(",")]
        n = args.parakeet_clips or max(sizes)
        clips = (audio16 * (n // len(audio16) + 1))[:n]
        for bs, comp in itertools.product(sizes, _flags(args.parakeet_compile)):
            backend.set_speed(batch_size=bs, compile=comp)
            label = f"parakeet[batch_size={bs},compile={'on' if comp else 'off'}]"
            pending = []

            def deferred(clips=clips, pending=pending):
                pending.append(backend.score_deferred(clips, 16000, spec))

            for kind, call in (
                ("score", lambda clips=clips: backend.score(clips, 16000, spec)),
                ("deferred", deferred),
            ):
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                t = time_call(call, args.device, args.repeats)
                for finish in pending:  # the text work of the timed calls, not timed
                    finish()
                pending.clear()
                row = {**meta, "backend": f"{label}[{kind}]", "batch": n, "s_per_clip": t / n,
                       "batch_s": t, "batch_size": bs, "compile": comp,
                       "peak_gib": _peak()}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
        backend.set_speed(batch_size=128, compile=False)
    if name == "sidon" and (args.sidon_resample or args.sidon_compile != "off"):
        modes = (args.sidon_resample or "soxr").split(",")
        buckets = [float(b) for b in str(args.sidon_bucket_s).split(",")]
        dtypes = args.sidon_dtype.split(",") if args.sidon_dtype else [backend.dtype]
        sizes = [int(b) for b in args.sidon_batch_sizes.split(",")] if args.sidon_batch_sizes else [
            backend.batch_size
        ]  # fmt: skip
        combos = itertools.product(modes, _flags(args.sidon_compile), buckets, dtypes, sizes)
        for mode, comp, bucket, dtype, bs in combos:
            backend.set_speed(bs, mode, comp, bucket, dtype)
            label = f"sidon[48k stereo in,resample={mode},compile={'on' if comp else 'off'}"
            label += f",bucket_s={bucket:g},dtype={backend.dtype},batch_size={bs}]"
            for b in batches:
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                t = time_call(lambda b=b: backend.restore(audio48s[:b], 48000), args.device,
                              args.repeats)  # fmt: skip
                row = {**meta, "backend": label, "batch": b, "s_per_clip": t / b, "batch_s": t,
                       "peak_gib": _peak()}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def parakeet_split(backend, args, batches, audio16, meta) -> list[dict]:
    """Where Parakeet's time goes: mel + encoder alone, and how many words the (random-weight)
    greedy decoder emitted per clip — decode cost scales with emitted tokens."""
    import torch

    rows = []
    for b in batches:
        signal = torch.from_numpy(np.stack(audio16[:b])).to(backend.device)
        lengths = torch.full((b,), signal.shape[1], dtype=torch.long, device=backend.device)

        def encode(signal=signal, lengths=lengths):
            with torch.inference_mode():
                feats, feat_lens = backend.model.preprocessor(input_signal=signal, length=lengths)
                with backend._autocast():
                    backend.model.encoder(audio_signal=feats, length=feat_lens)

        t = time_call(encode, args.device, args.repeats)
        words = [len(x.split()) for x in backend.transcribe(audio16[:b], 16000)]
        row = {**meta, "backend": "parakeet[mel+encoder only]", "batch": b, "s_per_clip": t / b,
               "words_per_clip": float(np.mean(words))}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.bench scorers", description=__doc__)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="32,64")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument(
        "--spread", type=float, default=0.0, help="clip lengths over [seconds - spread, seconds]"
    )
    ap.add_argument("--profile", type=int, default=0, help="print each call's top N ops")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=",".join(BACKENDS), help="comma-separated backend names")
    ap.add_argument("--out", help="write JSON lines here too")
    ap.add_argument("--size", choices=("real", "tiny"), default="real", help="tiny: CPU smoke")
    ap.add_argument("--parakeet-batch-sizes", default="", help="e.g. 64,128 (rows per size)")
    ap.add_argument("--parakeet-compile", default="off", help="off, on or off,on")
    ap.add_argument("--parakeet-clips", type=int, default=0, help="clips per Parakeet call")
    ap.add_argument("--no-split", action="store_true", help="skip the mel+encoder-only rows")
    ap.add_argument("--sidon-resample", default="", help="soxr, torch or soxr,torch")
    ap.add_argument("--sidon-compile", default="off", help="off, on or off,on")
    ap.add_argument("--sidon-bucket-s", default="0", help="e.g. 0,1 (seconds; 0: off)")
    ap.add_argument("--sidon-dtype", default="", help="e.g. float16,bfloat16 (autocast dtype)")
    ap.add_argument("--sidon-batch-sizes", default="", help="e.g. 32,64 (takes per forward)")
    ap.add_argument(
        "--speaker-runtime",
        default="",
        help="wavlm-speaker rows per runtime variant, before and after in one call, "
        "e.g. 'precision=float32,batch_size=64;precision=bfloat16;"
        "precision=bfloat16,max_seconds=6' (default: one row, the schema's defaults)",
    )
    args = ap.parse_args(argv)

    batches = [int(b) for b in args.batches.split(",")]
    spec = GroupSpec(
        "happy", "bench", "the quick brown fox jumps over the lazy dog " * 4, max(batches),
        emotion_description="A bright, cheerful voice.", negative_description="A flat voice.",
    )  # fmt: skip
    audio48 = clips(max(batches), args.seconds, 48000, spread=args.spread)
    results = []
    meta = {
        "date": datetime.date.today().isoformat(),
        "host": platform.node(),
        "device": args.device,
        "seconds_per_clip": args.seconds,
        "spread_s": args.spread,
    }
    if args.device.startswith("cuda"):
        import torch

        meta["gpu"] = torch.cuda.get_device_name(0)
        meta["torch"] = torch.__version__

    for b in batches:
        t = time_call(lambda b=b: [resample(a, 48000, 16000) for a in audio48[:b]], "cpu", 1)
        results.append({**meta, "backend": "resample48k->16k", "batch": b, "s_per_clip": t / b})
    audio16 = [resample(a, 48000, 16000) for a in audio48]
    audio48s = [np.stack([a, 0.9 * a], axis=1) for a in audio48]  # stereo, as generated

    for name in args.only.split(","):
        variants = [None]
        if name == "wavlm-speaker" and args.speaker_runtime:
            variants = runtime_variants(args.speaker_runtime)
        for kw in variants:
            try:
                results += bench_backend(name, args, batches, audio16, spec, meta, audio48s, kw)
            except Exception as e:  # one backend failing must not hide the others' figures
                row = {**meta, "backend": name, "runtime": kw,
                       "error": f"{type(e).__name__}: {e}"}  # fmt: skip
                results.append(row)
                print(json.dumps(row), flush=True)

    print("\n| backend | batch | s/clip | peak GiB |\n|---|---:|---:|---:|")
    for r in results:
        if "error" in r:
            print(f"| {r['backend']} | – | failed: {r['error'][:80]} | – |")
            continue
        peak = f"{r['peak_gib']:.1f}" if r.get("peak_gib") is not None else "–"
        print(f"| {r['backend']} | {r['batch']} | {r['s_per_clip']:.4f} | {peak} |")
    if args.out:
        with open(args.out, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    return 0
