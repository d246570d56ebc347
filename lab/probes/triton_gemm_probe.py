"""Can a plain Triton split-K GEMM beat cuBLAS on the decode GEMMs at batch 64?

Research only: nothing in the engine uses this kernel. gemm_probe.py found the frame
step's GEMMs at ~60 % of the HBM weight-read floor under cuBLAS (3.24 ms against 1.94 ms at batch
64), Inductor's Triton templates slower than cuBLAS and fp8 ``_scaled_mm`` 2.5x slower. This
sweeps a small grid of tile sizes and split-K factors of one straightforward kernel
(``y = x @ W.T``, W in nn.Linear's [N, K] layout, float32 accumulation; with split-K each
program writes a float32 partial and a second kernel sums them in a fixed order and casts) and
prints, per backbone shape, cuBLAS against the best config and the floor. Every timing is one
CUDA graph holding the call for ``--layers`` different weights (more bytes than L2 holds),
replayed. Each config's output is checked against cuBLAS first (max rel err printed).

    PYTHONPATH=src python3 -m lab.probes.triton_gemm_probe [--out OUT]
    # correctness on the CPU, under Triton's interpreter (small shapes, float16):
    TRITON_INTERPRET=1 PYTHONPATH=src python3 -m lab.probes.triton_gemm_probe --check-cpu
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from lab.probes.gemm_probe import SHAPES as GEMM_SHAPES
from lab.probes.gemm_probe import time_graph

# the six shapes of gemm_probe.py swept here (the local c_attn and c_proj and the audio
# heads left out to keep the sweep short)
SHAPES = [
    shape for shape in GEMM_SHAPES if shape[0] not in ("local c_attn", "local c_proj", "audio head")
]


@triton.jit
def _gemm_partial(
    x_ptr, w_ptr, out_ptr, M, N, K, k_per_split,
    stride_xm, stride_wn, stride_os, stride_om,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, K_ITERS: tl.constexpr,
    PARTIAL: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    k0 = pid_k * k_per_split
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for i in range(K_ITERS):  # k_per_split // BK, a compile-time count
        offs_k = k0 + i * BK + tl.arange(0, BK)
        a = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=(offs_m[:, None] < M) & (offs_k[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :],
            mask=(offs_n[:, None] < N) & (offs_k[None, :] < K),
            other=0.0,
        )
        acc += tl.dot(a, tl.trans(b))
    out = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if PARTIAL:
        tl.store(out, acc, mask=mask)
    else:
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sum_partials(p_ptr, y_ptr, MN, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.load(p_ptr + offs, mask=mask, other=0.0)
    for s in range(1, SPLIT):
        acc += tl.load(p_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def triton_linear(x, w, BM, BN, BK, split, num_warps=4, num_stages=3, partial=None):
    """x [M, K] @ w[N, K].T with M <= BM; split-K over ``split`` programs per N tile."""
    M, K = x.shape
    N = w.shape[0]
    assert M <= BM and K % (split * BK) == 0, (M, K, split, BK)
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(N, BN), split)
    if split == 1:
        _gemm_partial[grid](
            x, w, y, M, N, K, K, x.stride(0), w.stride(0), 0, y.stride(0),
            BM=BM, BN=BN, BK=BK, K_ITERS=K // BK, PARTIAL=False, num_warps=num_warps,
            num_stages=num_stages,
        )  # fmt: skip
        return y
    if partial is None:
        partial = torch.empty(split, M, N, device=x.device, dtype=torch.float32)
    _gemm_partial[grid](
        x, w, partial, M, N, K, K // split, x.stride(0), w.stride(0), partial.stride(0),
        partial.stride(1), BM=BM, BN=BN, BK=BK, K_ITERS=K // split // BK, PARTIAL=True,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    _sum_partials[(triton.cdiv(M * N, 1024),)](partial, y, M * N, SPLIT=split, BLOCK=1024)
    return y


def rel_err(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def check_cpu() -> None:
    """The kernel's arithmetic under TRITON_INTERPRET=1 (float16: the interpreter's bf16 is
    broken), against torch, for split 1 and 4 and a ragged M."""
    g = torch.Generator().manual_seed(0)
    for M, K, N, split in ((5, 256, 96, 1), (16, 512, 64, 4), (3, 256, 40, 2)):
        x = torch.randn(M, K, generator=g).half()
        w = torch.randn(N, K, generator=g).half()
        y = triton_linear(x, w, BM=16, BN=32, BK=64, split=split)
        err = rel_err(y, x.float() @ w.float().T)
        print(json.dumps({"check": [M, K, N, split], "max_rel_err": err}))
        assert err < 2e-3, err


CONFIGS = [  # (BN, BK, split, warps, stages)
    *itertools.product((64, 128), (128,), (1, 2, 4), (4,), (3, 4)),
    (64, 64, 1, 4, 4), (32, 128, 1, 4, 4), (32, 128, 2, 4, 4), (64, 256, 1, 8, 3),
]  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--hbm-bytes-per-s", type=float, default=4.8e12)
    ap.add_argument("--check-cpu", action="store_true")
    ap.add_argument("--shapes", default="", help="comma-separated indices into SHAPES (all)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.check_cpu:
        check_cpu()
        return
    dev, rows = "cuda", []
    totals = {"cublas_ms": 0.0, "best_triton_ms": 0.0, "floor_ms": 0.0}
    picked = [SHAPES[int(i)] for i in args.shapes.split(",") if i] or SHAPES
    for name, K, N, per_frame in picked:
        x = torch.randn(args.batch, K, device=dev, dtype=torch.bfloat16)
        ws = [
            torch.randn(N, K, device=dev, dtype=torch.bfloat16) * K**-0.5
            for _ in range(args.layers)
        ]
        ref = F.linear(x, ws[0])
        cublas = time_graph(lambda x=x, ws=ws: [F.linear(x, w) for w in ws], args.replays)
        row = {"shape": name, "K": K, "N": N, "cublas_us": 1e6 * cublas / args.layers,
               "floor_us": 1e6 * 2 * K * N / args.hbm_bytes_per_s, "configs": []}  # fmt: skip
        for BN, BK, split, warps, stages in CONFIGS:
            if K % (split * BK):
                continue
            kw = dict(BM=64, BN=BN, BK=BK, split=split, num_warps=warps, num_stages=stages)
            try:
                part = torch.empty(split, args.batch, N, device=dev) if split > 1 else None
                err = rel_err(triton_linear(x, ws[0], partial=part, **kw), ref)
                t = time_graph(
                    lambda x=x, ws=ws, kw=kw, part=part: [
                        triton_linear(x, w, partial=part, **kw) for w in ws
                    ],
                    args.replays,
                )
                row["configs"].append({**kw, "us": 1e6 * t / args.layers, "max_rel_err": err})
            except Exception as e:  # too much shared memory for this tile, etc.
                row["configs"].append({**kw, "error": f"{type(e).__name__}: {e}"[:120]})
        timed = [c for c in row["configs"] if "us" in c and c["max_rel_err"] < 1e-2]
        best = min(timed, key=lambda c: c["us"]) if timed else None
        row["best"] = best
        summary = {k: row[k] for k in ("shape", "cublas_us", "floor_us")}
        summary["best_us"] = best["us"] if best else None
        summary["best"] = {k: best[k] for k in ("BN", "BK", "split", "num_warps", "num_stages")}
        print(json.dumps(summary), flush=True)
        totals["cublas_ms"] += per_frame * row["cublas_us"] / 1000
        totals["best_triton_ms"] += per_frame * (best["us"] if best else float("nan")) / 1000
        totals["floor_ms"] += per_frame * row["floor_us"] / 1000
        rows.append(row)
    print(json.dumps({"frame step, these shapes": totals}), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"triton_gemm_probe{args.shapes.replace(',', '')}.json").write_text(
            "\n".join(map(json.dumps, [*rows, totals])) + "\n"
        )


if __name__ == "__main__":
    main()
