"""Where Sidon's and Parakeet's GPU time goes: random weights at the real size,
15-s clips, on CUDA. For each stage: seconds per clip (CUDA events, median of 3 after a
warm-up), then torch.profiler's top CUDA kernels of one more batch.

Sidon rows: eager (fp16 autocast); DAC's Snake activation fused (Sidon runtime ``snake: fused``);
also each convolution's bias added in the fused kernel that reads its output (the default);
also the decoder's activations channels last (``layout: channels_last``). Each
row's output is compared with the first row's (max |diff|).

PYTHONPATH=src python3 -m lab.probes.stage_profile [--only sidon,parakeet] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

SR16 = 16000


def clips(n: int, seconds: float, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(SR16 * (seconds - 0.5 + (i % 8) / 16))  # 14.5-15 s, as generated takes
        out.append((0.1 * rng.standard_normal(length)).astype(np.float32))
    return out


def timed(fn, repeats: int = 3) -> tuple[float, object]:
    fn()  # warm-up: cuDNN plans, graphs, compiles
    times, result = [], None
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def top_kernels(fn, n: int = 18) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in events) or 1.0
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:n]:
        rows.append(
            {
                "kernel": e.key[:110],
                "calls": e.count,
                "ms": round(e.self_device_time_total / 1e3, 2),
                "share": round(e.self_device_time_total / total, 3),
            }
        )
    rows.append({"kernel": "ALL CUDA", "ms": round(total / 1e3, 2)})
    return rows


def sidon_rows(n: int, batch: int) -> list[dict]:
    from bestofn.fakes import sidon

    audios = clips(n, 15.0)
    restorer = sidon.build("cuda", "real", batch_size=batch)
    rows, first = [], None
    variants = [  # label, snake, conv biases fused into the next kernel, layout
        ("eager", "eager", False, "nchw"),
        ("fused snake", "fused", False, "nchw"),
        ("fused snake + conv bias", "fused", True, "nchw"),
        ("fused snake + conv bias, channels last", "fused", True, "channels_last"),
        ("eager again", "eager", False, "nchw"),
    ]

    def configure(snake: str, fuse_bias: bool, layout: str) -> None:
        restorer.set_speed(snake=snake, layout=layout)  # the restorer's own decoder path
        restorer.kernels.fuse_bias = fuse_bias

    for label, *knobs in variants:
        configure(*knobs)
        seconds, out = timed(lambda: restorer.restore_batch(audios))
        if first is None:
            first = out
        diff = max(float(np.abs(a - b).max()) for a, b in zip(out, first, strict=True))
        rows.append({"stage": "sidon", "variant": label, "s_per_clip": seconds / n,
                     "batch": batch, "clips": n, "max_abs_diff_vs_first": diff})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    for label, *knobs in variants[1:4]:
        configure(*knobs)
        rows.append({"stage": "sidon", "variant": label, "top": top_kernels(
            lambda: restorer.restore_batch(audios[:batch]))})  # fmt: skip
    configure("auto", True, "channels_last")
    return rows


def parakeet_rows(n: int, batch: int) -> list[dict]:
    from bestofn.fakes import parakeet

    audios = clips(n, 15.0, seed=1)
    scorer = parakeet.build("cuda", "real", batch_size=batch)
    greedy = scorer.model.cfg.decoding.get("greedy", {})
    seconds, first = timed(lambda: scorer.transcribe(audios, SR16))
    rows = [{"stage": "parakeet", "variant": "transcribe (decoder + joint fp32 weights)",
             "s_per_clip": seconds / n, "batch": batch, "clips": n,
             "max_symbols": greedy.get("max_symbols"),
             "mean_chars": statistics.mean(len(t) for t in first)}]  # fmt: skip
    print(json.dumps(rows[-1]), flush=True)
    rows.append({"stage": "parakeet", "variant": "fp32 decoder", "top": top_kernels(
        lambda: scorer.transcribe(audios[:batch], SR16))})  # fmt: skip
    # the prediction net and joint in bf16 weights (the loop's GEMMs ran in fp32 above)
    scorer.model.decoder.to(torch.bfloat16)
    scorer.model.joint.to(torch.bfloat16)
    scorer._prepare_for_inference()
    seconds, out = timed(lambda: scorer.transcribe(audios, SR16))
    same = sum(a == b for a, b in zip(out, first, strict=True)) / n
    rows.append({"stage": "parakeet", "variant": "decoder + joint bf16 weights",
                 "s_per_clip": seconds / n, "batch": batch, "clips": n,
                 "same_transcripts_as_fp32": same,
                 "mean_chars": statistics.mean(len(t) for t in out)})  # fmt: skip
    print(json.dumps(rows[-1]), flush=True)
    rows.append({"stage": "parakeet", "variant": "bf16 decoder", "top": top_kernels(
        lambda: scorer.transcribe(audios[:batch], SR16))})  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="sidon,parakeet")
    ap.add_argument("--clips", type=int, default=128)
    ap.add_argument("--sidon-batch", type=int, default=32)
    ap.add_argument("--parakeet-batch", type=int, default=128)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    rows = []
    for stage in args.only.split(","):
        if stage == "sidon":
            rows += sidon_rows(args.clips, args.sidon_batch)
        elif stage == "parakeet":
            rows += parakeet_rows(args.clips, args.parakeet_batch)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "stage_profile.json").write_text(json.dumps(rows, indent=1))
    for row in rows:
        if "top" in row:
            print(f"\n{row['stage']} [{row['variant']}] top CUDA kernels")
            for k in row["top"]:
                ms, share, calls = k.get("ms", ""), k.get("share", ""), k.get("calls", "")
                print(f"  {ms:>9} ms  {share:>6}  {calls:>6}  {k['kernel']}")
        else:
            print(json.dumps(row))


if __name__ == "__main__":
    main()
