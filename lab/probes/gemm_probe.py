"""The decode GEMMs of a MOSS-TTS-Local v1.5 frame step at batch 64, alone: bf16
``F.linear`` (cuBLAS, as the engine runs them) against fp8 ``torch._scaled_mm`` with a scale per
row of the activations and per output channel of the weights (activation quantisation
included), and against the weight-read floor at the GPU's HBM bandwidth.

Each shape runs ``--layers`` times in one CUDA graph with a different weight each time (more
bytes than L2 holds), replayed ``--replays`` times; µs per call = graph time / calls. Random
weights; the fp8 output's max relative error against bf16 is printed so a broken scale shows.

    PYTHONPATH=src python3 -m lab.probes.gemm_probe [--batch 64] [--layers 36] [--out OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# (name, in, out, calls per frame step) for the v1.5 shape: 36 backbone layers; the local
# transformer (1 layer) runs 13 positions, its 12 audio heads once each
SHAPES = [
    ("backbone qkv", 2560, 6144, 36),
    ("backbone o_proj", 4096, 2560, 36),
    ("backbone gate_up", 2560, 19456, 36),
    ("backbone down", 9728, 2560, 36),
    ("local c_attn", 2560, 7680, 13),
    ("local c_proj", 2560, 2560, 13),
    ("local fc_in", 2560, 9728, 13),
    ("local fc_out", 9728, 2560, 13),
    ("audio head", 2560, 1024, 12),
]
FP8 = torch.float8_e4m3fn


def quantize_rows(x: torch.Tensor):
    """bf16 [M, K] -> (fp8 [M, K], float32 scale [M, 1]): one scale per row."""
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / torch.finfo(FP8).max
    return (x.float() / scale).to(FP8), scale


def bf16_calls(x, ws, outs):
    def run():
        for w in ws:
            outs["bf16"] = F.linear(x, w)

    return run


def fp8_calls(x, ws, outs):
    """fp8 weights with a float32 scale per output channel; the activations quantised per row
    inside the timed calls, as an fp8 engine would have to."""
    qs = []
    for w in ws:
        sw = w.abs().amax(dim=-1, keepdim=True).float() / torch.finfo(FP8).max
        qs.append(((w.float() / sw).to(FP8), sw.t().contiguous()))

    def run():
        for wq, sw in qs:
            xq, sx = quantize_rows(x)
            outs["fp8"] = torch._scaled_mm(
                xq, wq.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16
            )

    return run


def time_graph(fn, replays: int) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up: cuBLAS/CUTLASS workspace and plans outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(replays):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / replays


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--hbm-bytes-per-s", type=float, default=4.8e12)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = "cuda"
    torch.manual_seed(0)
    rows, frame = [], {"bf16": 0.0, "fp8": 0.0, "floor_bf16": 0.0, "floor_fp8": 0.0}
    for name, k, n, per_frame in SHAPES:
        x = torch.randn(args.batch, k, device=dev, dtype=torch.bfloat16)
        ws = [
            torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k**-0.5
            for _ in range(args.layers)
        ]
        outs: dict[str, torch.Tensor] = {}
        row = {"shape": name, "M": args.batch, "K": k, "N": n}
        for label, fn in (("bf16", bf16_calls(x, ws, outs)), ("fp8", fp8_calls(x, ws, outs))):
            try:
                row[f"{label}_us"] = 1e6 * time_graph(fn, args.replays) / args.layers
            except Exception as e:  # fp8 rowwise needs sm89+/a recent torch: say so
                row[f"{label}_error"] = f"{type(e).__name__}: {e}"[:200]
        row["floor_bf16_us"] = 1e6 * 2 * k * n / args.hbm_bytes_per_s
        row["floor_fp8_us"] = 1e6 * k * n / args.hbm_bytes_per_s
        if "fp8" in outs:
            ref = outs["bf16"].float()
            err = (outs["fp8"].float() - ref).abs().max() / ref.abs().max()
            row["fp8_max_rel_err"] = float(err)
        for key in frame:
            frame[key] += per_frame * row.get(f"{key}_us", float("nan")) / 1000
        rows.append(row)
        print(json.dumps(row), flush=True)
    total = {"shape": "frame step (ms, calls per frame x us)", **frame}
    rows.append(total)
    print(json.dumps(total), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gemm_probe.json").write_text("\n".join(map(json.dumps, rows)) + "\n")


if __name__ == "__main__":
    main()
