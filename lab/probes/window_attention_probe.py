"""The codec's sliding-window attention at the v2 decoder's real stage shapes: the compiled
path's Triton kernel (``codec_triton.window_attention``) in a few tile configurations against
the eager path (``codec_layers.sliding_window_attention``: window blocks of SDPA, then the
copies into the output projection's layout), per stage and summed over the decoder's layers.

Each stage: 64 clips of 15 s (188 frames), its steps, heads and window from the published
config (``fakes.moss_codec.config("real")``), random bf16 q, k, v. Each timing is the median
of 5 CUDA-event times of one call after a warm-up; each config's output is compared
with the eager path's first (max |diff|). The configuration the product runs is the module's
``ATTN_*`` constants; ``--configs`` tries others by setting them for the call.

    PYTHONPATH=src python3 -m lab.probes.window_attention_probe [--out OUT.json]

``--fuzz N``: instead, N random shapes (steps 1..``--max-steps``, windows of the real stages
and short ones, batch 1..``--max-batch``, a third of them with q, k, v longer than the steps
attended, as the eager heads' padding leaves them), each synchronised and compared with the
eager path: a kernel that reads or writes out of bounds fails here, at the shape that did it,
not later in another kernel.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import torch

from bestofn.fakes import moss_codec
from bestofn.moss.codec import kernels as codec_triton
from bestofn.moss.codec.config import AudioTokenizerConfig
from bestofn.moss.codec.layers import sliding_window_attention
from lab.probes.decode_kernel_check import per_call_us


def stage_shapes(frames: int):
    """(T, heads, head width, window, layers) of each decoder transformer stage."""
    c = AudioTokenizerConfig.from_dict(moss_codec.config("real"))
    T, out = frames, []
    for s in c.decoder:
        if s.kind == "patch":
            T *= s.patch
        else:
            out.append((T, s.heads, s.d_model // s.heads, s.context, s.layers))
    return out


def timed(fn, *args) -> float:
    """ms per call of ``fn(*args)``: decode_kernel_check's median of 5 CUDA-event timings after a
    warm-up, one call each."""
    return per_call_us(functools.partial(fn, *args), calls=1) / 1000


def fuzz(n: int, max_steps: int = 2000, max_batch: int = 16) -> int:
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    for i in range(n):
        T = int(torch.randint(1, max_steps + 1, (1,), generator=g)) if i % 3 else i % 70 + 1
        window = [1, 5, 125, 250, 400, None][int(torch.randint(0, 6, (1,), generator=g))]
        B, H = int(torch.randint(1, max_batch + 1, (1,), generator=g)), [12, 20][i % 2]
        Tq = T + (int(torch.randint(1, 400, (1,), generator=g)) if i % 3 == 1 else 0)
        q, k, v = (torch.randn(B, H, Tq, 64, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))  # fmt: skip
        got = codec_triton.window_attention(q, k, v, window, T)
        torch.cuda.synchronize()
        want = sliding_window_attention(q, k, v, window, {}, T)
        diff = float((got.float() - want.float()).abs().max())
        worst = max(worst, diff)
        if diff > 0.05:
            print(f"MISMATCH B {B} H {H} T {T} Tq {Tq} window {window}: max |diff| {diff}")
            return 1
    print(f"fuzz: {n} shapes, no fault, max |diff| {worst}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--frames", type=int, default=188)
    p.add_argument(
        "--configs",
        default="64,64,4,3;128,64,4,3;128,64,8,3;64,32,4,3;128,128,8,2",
        help="BLOCK_M,BLOCK_N,warps,stages; semicolon-separated",
    )
    p.add_argument("--out")
    p.add_argument("--fuzz", type=int, default=0, help="N random shapes checked instead")
    p.add_argument("--max-steps", type=int, default=2000, help="--fuzz: longest steps")
    p.add_argument("--max-batch", type=int, default=16, help="--fuzz: largest batch")
    args = p.parse_args(argv)
    if args.fuzz:
        return fuzz(args.fuzz, args.max_steps, args.max_batch)
    g = torch.Generator(device="cuda").manual_seed(0)
    product = (codec_triton.ATTN_BLOCK_M, codec_triton.ATTN_BLOCK_N, codec_triton.ATTN_WARPS,
               codec_triton.ATTN_STAGES)  # fmt: skip
    configs = [tuple(int(x) for x in c.split(",")) for c in args.configs.split(";")]
    rows, totals = [], {"eager": 0.0}
    for T, H, dh, window, layers in stage_shapes(args.frames):
        q, k, v = (
            torch.randn(args.batch, H, T, dh, device="cuda", generator=g, dtype=torch.bfloat16)
            for _ in range(3)
        )
        mask: dict = {}
        want = sliding_window_attention(q, k, v, window, mask)
        row = {"T": T, "heads": H, "dh": dh, "window": window, "layers": layers}
        row["eager_ms"] = timed(sliding_window_attention, q, k, v, window, mask)
        totals["eager"] += row["eager_ms"] * layers
        for cfg in configs:
            name = "x".join(map(str, cfg))
            (codec_triton.ATTN_BLOCK_M, codec_triton.ATTN_BLOCK_N, codec_triton.ATTN_WARPS,
             codec_triton.ATTN_STAGES) = cfg  # fmt: skip
            got = codec_triton.window_attention(q, k, v, window)
            row[f"{name}_max_diff"] = float((got.float() - want.float()).abs().max())
            row[f"{name}_ms"] = timed(codec_triton.window_attention, q, k, v, window)
            totals[name] = totals.get(name, 0.0) + row[f"{name}_ms"] * layers
        (codec_triton.ATTN_BLOCK_M, codec_triton.ATTN_BLOCK_N, codec_triton.ATTN_WARPS,
         codec_triton.ATTN_STAGES) = product  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("decoder total, ms per call of", args.batch, "clips:", json.dumps(totals), flush=True)
    if args.out:
        result = {"probe": "window_attention", "device": torch.cuda.get_device_name(),
                  "torch": torch.__version__, "product_config": product, "rows": rows,
                  "totals_ms": totals}  # fmt: skip
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
