"""The codec decoder's ``heads_with_rope`` as one hand-written Triton kernel (CUDA only).

What it computes is ``bestofn.moss.codec_layers.heads_with_rope``: the fused q|k|v projection's
output [B, T, 3 * H * dh] split into heads, RoPE on interleaved pairs of q and k (angles and
arithmetic in float32, one rounding to the output dtype), each of q, k, v written as a
contiguous [B, H, Tp, dh] block with zeros in the steps T..Tp that pad to whole window blocks.

Why by hand: ``torch.compile`` of that function, with the steps dimension dynamic, gave kernels
that moved their bytes at about a tenth of the H200's bandwidth (the RoPE piece and v's padded
copy were 181 + 69 ms of a 64-clip decode, more than its attention; why was not profiled).
Here every program owns one (which of q/k/v, clip, head) and a block of steps, index work is
per program, not per element, and each head's row is read and written as wide vectors, the
pairs split and joined in registers: 23 ms for the same call (docs/PERFORMANCE.md, codec). A
first version that read and wrote each element on its own took 386 ms: the access width is
what matters.

Import this module only where Triton imports (``codec_layers.resolve_kernels`` checks); the
tests run it through Triton's interpreter on the CPU where Triton is installed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_T = 64  # steps per program: 64 x 64-wide heads = 4,096 elements of each tensor


@triton.jit
def _heads_rope_kernel(
    qkv, cos, sin, out, T, Tp,
    H: tl.constexpr, DH: tl.constexpr, DH_P2: tl.constexpr, ROPE: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    blk, bh, which = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H  # once per program, on scalars
    t = blk * BLOCK + tl.arange(0, BLOCK)
    d = tl.arange(0, DH_P2)
    load = (t < T)[:, None] & (d < DH)[None, :]
    # qkv[b, t, which, h, :]: whole rows of the head, read as wide vectors (one 2-byte access
    # per element ran this kernel 16x slower)
    src = qkv + (b * T + t[:, None]).to(tl.int64) * (3 * H * DH) + which * (H * DH) + h * DH
    x = tl.load(src + d[None, :], mask=load, other=0.0).to(tl.float32)
    if ROPE:
        if which < 2:  # q and k; v is copied as it is
            even, odd = tl.split(tl.reshape(x, (BLOCK, DH_P2 // 2, 2)))
            j = tl.arange(0, DH_P2 // 2)
            pair = (t < T)[:, None] & (j < DH // 2)[None, :]
            angle = t[:, None] * (DH // 2) + j[None, :]
            c = tl.load(cos + angle, mask=pair, other=1.0)
            s = tl.load(sin + angle, mask=pair, other=0.0)
            x = tl.reshape(tl.join(even * c - odd * s, even * s + odd * c), (BLOCK, DH_P2))
    # out[which, b, h, t, :], zeros where t >= T
    dst = out + ((which * tl.num_programs(1) + bh).to(tl.int64) * Tp + t[:, None]) * DH
    store = (t < Tp)[:, None] & (d < DH)[None, :]
    tl.store(dst + d[None, :], x.to(out.dtype.element_ty), mask=store)


def heads_rope(qkv, cos, sin, heads: int, padded_steps: int):
    """``codec_layers.heads_with_rope`` in one launch, padded to ``padded_steps`` (>= T): q, k,
    v [B, heads, padded_steps, dh], contiguous views of one [3, B, heads, Tp, dh] buffer."""
    B, T, width = qkv.shape
    dh, Tp = width // (3 * heads), padded_steps
    qkv = qkv.contiguous()
    out = torch.empty((3, B, heads, Tp, dh), dtype=qkv.dtype, device=qkv.device)
    rope = cos is not None
    if rope:
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
    else:  # unused by the kernel: any tensor stands for the pointers
        cos = sin = qkv
    grid = (triton.cdiv(Tp, BLOCK_T), B * heads, 3)
    _heads_rope_kernel[grid](
        qkv, cos, sin, out, T, Tp,
        H=heads, DH=dh, DH_P2=max(2, triton.next_power_of_2(dh)), ROPE=rope,
        BLOCK=BLOCK_T,
    )  # fmt: skip
    return out[0], out[1], out[2]
