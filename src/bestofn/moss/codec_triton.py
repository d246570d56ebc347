"""The codec decoder's two pieces between its matmuls as hand-written Triton kernels (CUDA only).

``heads_rope`` computes ``bestofn.moss.codec_layers.heads_with_rope``: the fused q|k|v
projection's output [B, T, 3 * H * dh] split into heads, RoPE on interleaved pairs of q and k
(angles and arithmetic in float32, one rounding to the output dtype), each of q, k, v written as
a contiguous [B, H, Tp, dh] block with zeros in the steps T..Tp that pad to whole window blocks.

Why by hand: ``torch.compile`` of that function, with the steps dimension dynamic, gave kernels
that moved their bytes at about a tenth of the H200's bandwidth (the RoPE piece and v's padded
copy were 181 + 69 ms of a 64-clip decode, more than its attention; why was not profiled).
Here every program owns one (which of q/k/v, clip, head) and a block of steps, index work is
per program, not per element, and each head's row is read and written as wide vectors, the
pairs split and joined in registers: 23 ms for the same call (docs/PERFORMANCE.md, codec). A
first version that read and wrote each element on its own took 386 ms: the access width is
what matters.

``residual_layer_norm`` computes ``codec_layers.residual_norm``: x + scale * u and that sum
LayerNorm'd, in one pass over each row of D channels. Why by hand: under ``torch.compile``
that piece was 106 ms of the same 64-clip decode where its bytes need about 30
(docs/PERFORMANCE.md, codec), and it was the compiled path's last ``torch.compile``: 30 ms
by hand, and the codec's first call 3.8 s instead of 18.

Import this module only where Triton imports (``codec_layers.resolve_kernels`` checks); the
tests run it through Triton's interpreter on the CPU where Triton is installed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_T = 64  # steps per program: 64 x 64-wide heads = 4,096 elements of each tensor
# residual_layer_norm: a program's tile is ROWS rows of the width padded to a power of two, about
# TILE elements (the codec's widths 768 and 1280: 4 rows of 1,024 or 2 of 2,048) over 8 warps, so
# 16 elements a thread of each tensor (room for wide accesses, few registers), and w and b read
# once per tile, not per row; a row never spans programs, so its mean and variance need no
# exchange between them. Wider rows than MAX_D are refused (the caller runs eager).
TILE, NORM_WARPS, MAX_D = 4096, 8, 8192


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


@triton.jit
def _round(v, dtype: tl.constexpr):
    """float32 -> ``dtype`` to nearest even. bfloat16 by hand: Triton's interpreter (the tests)
    truncates that conversion where the GPU rounds to nearest, and this way both give the GPU's
    bits (NaN payloads aside), for a few integer operations in a kernel bound by its bytes."""
    if dtype == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        v = bits.to(tl.float32, bitcast=True)
    return v.to(dtype)


@triton.jit
def _residual_norm_kernel(
    x, u, scale, w, b, new_x, normed, rows, eps,
    D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, SCALE: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, BLOCK_D)
    real = d < D
    mask = (r < rows)[:, None] & real[None, :]
    at = r.to(tl.int64)[:, None] * D + d[None, :]  # rows * D may pass 2**31
    xv = tl.load(x + at, mask=mask, other=0.0).to(tl.float32)
    uv = tl.load(u + at, mask=mask, other=0.0).to(tl.float32)
    if SCALE:
        uv = uv * tl.load(scale + d, mask=real, other=0.0).to(tl.float32)[None, :]
    # one rounding of the sum; eager rounds scale * u to the dtype, then the sum
    s = _round(xv + uv, new_x.dtype.element_ty)
    tl.store(new_x + at, s, mask=mask)
    # normalise the ROUNDED sum, as eager does (its layer_norm reads the stored new x); mean and
    # variance over the D real channels (the masked ones load 0 and are kept out of the
    # variance), in float32, two passes over registers rather than one of sums of squares
    s = s.to(tl.float32)
    mean = tl.sum(s, axis=1) / D
    diff = tl.where(mask, s - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(diff * diff, axis=1) / D + eps)
    wv = tl.load(w + d, mask=real, other=0.0).to(tl.float32)
    bv = tl.load(b + d, mask=real, other=0.0).to(tl.float32)
    y = diff * rstd[:, None] * wv[None, :] + bv[None, :]
    tl.store(normed + at, _round(y, normed.dtype.element_ty), mask=mask)


def residual_layer_norm(x, u, scale, w, b, eps: float):
    """``codec_layers.residual_norm`` in one launch: (x + scale * u, its LayerNorm over the last
    dim), both shaped and typed as x; ``scale`` None or [D], ``w`` and ``b`` [D] in any float
    dtype. The sum is formed in float32 and rounded once (eager rounds ``scale * u`` to x's
    dtype first, so with a scale bf16 sums may differ from eager's in their last bit)."""
    D = x.shape[-1]
    if D > MAX_D:
        raise ValueError(f"residual_layer_norm: width {D} is over {MAX_D}")
    x, u, w, b = x.contiguous(), u.contiguous(), w.contiguous(), b.contiguous()
    new_x, normed = torch.empty_like(x), torch.empty_like(x)
    rows = x.numel() // D if D else 0
    if rows == 0:
        return new_x, normed
    block = triton.next_power_of_2(D)
    per = max(1, TILE // block)
    has_scale = scale is not None
    scale = scale.contiguous() if has_scale else w  # unused by the kernel without a scale
    _residual_norm_kernel[(triton.cdiv(rows, per),)](
        x, u, scale, w, b, new_x, normed, rows, eps,
        D=D, BLOCK_D=block, ROWS=per, SCALE=has_scale, num_warps=NORM_WARPS,
    )  # fmt: skip
    return new_x, normed
