"""The split-K decode attention kernel (bestofn.moss.decode_kernel) against SDPA on CUDA at the
backbone's real decode shape (MOSS-TTS-Local v1.5: 8 kv heads x 4 query heads, head dim 128),
batch 64, 320 cached slots read through the fused cache's strided views, prompts left-padded.
Prints max |diff| and microseconds per call (CUDA events, median of 5 x 50 calls) for bf16 and
fp32.

PYTHONPATH=src python3 -m lab.probes.decode_kernel_check
"""

from __future__ import annotations

import json
import statistics

import torch
import torch.nn.functional as F

from bestofn.moss.decode_kernel import decode_attention_triton


def per_call_us(fn, calls: int = 50) -> float:
    fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def main() -> None:
    torch.backends.cuda.enable_cudnn_sdp(False)  # as moss-fast runs (the model card advises it)
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        print(json.dumps(compare(dtype)), flush=True)


def compare(dtype, B: int = 64, KV: int = 8, G: int = 4, D: int = 128, L: int = 320) -> dict:
    q = torch.randn(B, KV, G, D, device="cuda", dtype=dtype)
    cache = torch.randn(B, KV, L, 2, D, device="cuda", dtype=dtype)
    k, v = cache[..., 0, :], cache[..., 1, :]
    start = torch.randint(0, 80, (B,), device="cuda")  # left padding per row
    end = torch.randint(200, L, (B,), device="cuda")  # slots written so far
    slot = torch.arange(L, device="cuda")
    keep = (slot[None] >= start[:, None]) & (slot[None] < end[:, None])
    bias = torch.zeros(B, 1, 1, L, device="cuda", dtype=dtype)
    bias = bias.masked_fill(~keep[:, None, None], float("-inf"))
    scale = D**-0.5
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    got = decode_attention_triton(q, k, v, bias, scale)
    exact = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=bias.double(), scale=scale
    )
    row = {
        "dtype": str(dtype).removeprefix("torch."),
        "shape": [B, KV, G, D, L],
        "max_abs_diff_triton_vs_sdpa": float((got.float() - ref.float()).abs().max()),
        "max_abs_err_sdpa": float((ref.double() - exact).abs().max()),
        "max_abs_err_triton": float((got.double() - exact).abs().max()),
        "sdpa_us": per_call_us(
            lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
        ),
        "triton_us": per_call_us(lambda: decode_attention_triton(q, k, v, bias, scale)),
        "kv_bytes_floor_us": 2 * B * KV * L * D * q.element_size() / 4.8e12 * 1e6,
    }
    return row


if __name__ == "__main__":
    main()
