"""The codec decoder's pieces between its matmuls as hand-written Triton kernels (CUDA only).

``heads_rope`` computes ``bestofn.moss.codec.layers.heads_with_rope``: the fused q|k|v
projection's output [B, T, 3 * H * dh] split into heads, RoPE on interleaved pairs of q and k
(angles and arithmetic in float32, one rounding to the output dtype), each of q, k, v written as
a contiguous [B, H, Tp, dh] block with zeros in the steps T..Tp that pad to whole window blocks.

Why by hand: ``torch.compile`` of that function, with the steps dimension dynamic, gave kernels
that moved their bytes far below the GPU's bandwidth (the RoPE piece and v's padded copy took
longer than the decode's attention; why was not profiled). Here every program owns one (which
of q/k/v, clip, head) and a block of steps, index work is per program, not per element, and
each head's row is read and written as wide vectors, the pairs split and joined in registers
(ledger figure codec.v2.decode_bf16_b64). A first version that read and wrote each element on
its own was slower than the compiled one: the access width is what matters.

``residual_layer_norm`` computes ``codec_layers.residual_norm``: x + scale * u and that sum
LayerNorm'd, in one pass over each row of D channels. Why by hand: under ``torch.compile``
that piece took several times what its bytes need, and it was the compiled path's last
``torch.compile``: by hand it runs at its bytes' speed, and the codec's first call no longer
waits for a compile (ledger figure codec.v2.decode_bf16_b64).

``window_attention`` computes ``codec_layers.sliding_window_attention``: each query attends to
the ``window`` steps up to and including its own, online softmax over tiles of keys (the
FlashAttention recurrence, float32 statistics), written straight into the [B, T, H * dh] layout
the output projection reads. Why by hand: the SDPA form computes every block of ``window``
queries against two blocks of keys under a mask (half the scores thrown away), in two calls
whose outputs are then copied twice into that layout (the ``cat`` alone was a visible share
of the decode). Here a program owns one (clip, head) and BLOCK_M queries,
visits only the key tiles its window reaches, and needs no padding to whole window blocks.

``ring_heads`` and ``ring_attention`` are the streaming decode's versions of the first and
last (``codec.stream.heads_to_ring``, ``ring_window_attention``): k and v go straight into each
request's ring of past keys, and the attention reads the ring in place, by absolute step.

Import this module only where Triton imports (``codec_layers.resolve_kernels`` checks); the
tests run it through Triton's interpreter on the CPU where Triton is installed, and compile it
for sm_80 and sm_90 with no GPU (``tests/moss/kernels_for_gpus.py``).
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
def _rotate_pairs(x, cos, sin, row, live, DH: tl.constexpr, DH_P2: tl.constexpr,
                  BLOCK: tl.constexpr):  # fmt: skip
    """RoPE on the interleaved pairs of x [BLOCK, DH_P2] (float32): block row i rotated by the
    angles of table row ``row[i]`` of ``cos``/``sin`` [rows, DH / 2]; rows not ``live`` read
    the identity."""
    even, odd = tl.split(tl.reshape(x, (BLOCK, DH_P2 // 2, 2)))
    j = tl.arange(0, DH_P2 // 2)
    pair = live[:, None] & (j < DH // 2)[None, :]
    angle = row[:, None] * (DH // 2) + j[None, :]
    c = tl.load(cos + angle, mask=pair, other=1.0)
    s = tl.load(sin + angle, mask=pair, other=0.0)
    return tl.reshape(tl.join(even * c - odd * s, even * s + odd * c), (BLOCK, DH_P2))


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
            x = _rotate_pairs(x, cos, sin, t, t < T, DH, DH_P2, BLOCK)
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
def _ring_heads_kernel(
    qkv, cos, sin, dest, q_out, ring_k, ring_v, rows, N,
    H: tl.constexpr, DH: tl.constexpr, DH_P2: tl.constexpr, ROPE: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    blk, h, which = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    r = blk * BLOCK + tl.arange(0, BLOCK)  # a row is one new step of one request: b * N + n
    d = tl.arange(0, DH_P2)
    live = r < rows
    load = live[:, None] & (d < DH)[None, :]
    src = qkv + r.to(tl.int64)[:, None] * (3 * H * DH) + which * (H * DH) + h * DH
    x = tl.load(src + d[None, :], mask=load, other=0.0).to(tl.float32)
    if ROPE:
        if which < 2:
            x = _rotate_pairs(x, cos, sin, r.to(tl.int64), live, DH, DH_P2, BLOCK)
    x = _round(x, q_out.dtype.element_ty)  # q, k, v and the rings share the stage's dtype
    if which == 0:  # q[b, h, n, :]
        at = (((r // N) * H + h).to(tl.int64) * N + r % N) * DH
        tl.store(q_out + at[:, None] + d[None, :], x, mask=load)
    else:  # the ring's entry dest[r], head h
        at = tl.load(dest + r, mask=live, other=0).to(tl.int64) * (H * DH) + h * DH
        if which == 1:
            tl.store(ring_k + at[:, None] + d[None, :], x, mask=load)
        else:
            tl.store(ring_v + at[:, None] + d[None, :], x, mask=load)


def ring_heads(qkv, cos, sin, dest, ring_k, ring_v, heads: int):
    """``codec.stream.heads_to_ring`` in one launch: the fused projection's output
    [B, N, 3 * heads * dh] of N new steps per request -> q [B, heads, N, dh] (RoPE'd at ``cos``,
    ``sin`` [B, N, dh / 2], float32, or None), and k (RoPE'd) and v written straight into the
    rings ([entries, heads, dh]) at entries ``dest`` [B * N]: no q/k/v copies, no float32
    temporaries, no separate ring write."""
    B, N, width = qkv.shape
    dh = width // (3 * heads)
    if not ring_k.dtype == ring_v.dtype == qkv.dtype:
        raise ValueError(f"ring_heads: rings {ring_k.dtype}, {ring_v.dtype}; q|k|v {qkv.dtype}")
    qkv = qkv.contiguous()
    q = torch.empty((B, heads, N, dh), dtype=qkv.dtype, device=qkv.device)
    rows = B * N
    if rows == 0:
        return q
    rope = cos is not None
    if rope:
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
    else:  # unused by the kernel: any tensor stands for the pointers
        cos = sin = qkv
    _ring_heads_kernel[(triton.cdiv(rows, BLOCK_T), heads, 3)](
        qkv, cos, sin, dest.contiguous(), q, ring_k, ring_v, rows, N,
        H=heads, DH=dh, DH_P2=max(2, triton.next_power_of_2(dh)), ROPE=rope, BLOCK=BLOCK_T,
    )  # fmt: skip
    return q


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


# window_attention: queries a program owns, keys per step of its loop, and its warps; the keys a
# program visits are its window plus BLOCK_M - 1 steps, rounded out to whole BLOCK_N tiles.
# 64 x 32, 4 warps, 3 stages: the fastest of five tried at the v2 decoder's shapes on an H200
# (64x64 to 128x128 were slower; lab/probes/window_attention_probe measures them)
ATTN_BLOCK_M, ATTN_BLOCK_N, ATTN_WARPS, ATTN_STAGES, ATTN_MAX_DH = 64, 32, 4, 3, 256
assert ATTN_BLOCK_M % ATTN_BLOCK_N == 0  # a block of queries is whole key tiles
LOG2_E = 1.4426950408889634


@triton.jit
def _tile_scores(qt, kt, F32_DOTS: tl.constexpr):
    """q [M, dh] . k^T [dh, N] of one tile; F32_DOTS: float32 products, no TF32 rounding (see
    window_attention)."""
    if F32_DOTS:
        s = tl.dot(qt.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
    else:
        s = tl.dot(qt, kt)
    return s


@triton.jit
def _softmax_step(s, seen, qk_scale, m_i, l_i):
    """The online softmax's step over one tile of scores (the FlashAttention recurrence, float32
    statistics, base 2): (p, the old accumulator's factor alpha, new max, new sum)."""
    s = tl.where(seen, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row whose window starts after this whole tile has seen nothing yet: keep its exponents
    # finite (its p and alpha are 0 then, as they must be)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _tile_values(p, vt, F32_DOTS: tl.constexpr):
    """p [M, N] . v [N, dh], p rounded to v's dtype; F32_DOTS: the products exact in float32."""
    if F32_DOTS:
        pv = tl.dot(_round(p, vt.dtype).to(tl.float32), vt.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(vt.dtype), vt)
    return pv


@triton.jit
def _window_attention_kernel(
    q, k, v, out, T, Tq, window, qk_scale,
    H: tl.constexpr, DH: tl.constexpr, DH_P2: tl.constexpr, F32_DOTS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TILES: tl.constexpr,
):  # fmt: skip
    blk, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, DH_P2)
    real_d = d < DH
    head = bh.to(tl.int64) * Tq * DH  # q, k, v [B, H, Tq, DH]: this (clip, head)'s steps
    qt = tl.load(
        q + head + rows[:, None] * DH + d[None, :],
        mask=(rows < T)[:, None] & real_d[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DH_P2], tl.float32)
    # the key tiles this block's window reaches, from the tile of its first query's window
    # start: TILES of them (the host's count for a block whose window starts past step 0).
    # A fixed count, not a range to the block's last query: the loop pipelines, and Triton's
    # interpreter (the tests) takes no loop bounds computed in the kernel. A block nearer the
    # start visits tiles past its last query too: causality masks them whole.
    lo = blk * BLOCK_M - window + 1
    lo = tl.where(lo > 0, lo, 0) // BLOCK_N * BLOCK_N
    for j in range(TILES):
        cols = lo + j * BLOCK_N + tl.arange(0, BLOCK_N)
        kt = tl.load(  # [DH_P2, BLOCK_N]: the keys read transposed
            k + head + cols[None, :] * DH + d[:, None],
            mask=(cols < T)[None, :] & real_d[:, None],
            other=0.0,
        )
        s = _tile_scores(qt, kt, F32_DOTS)
        gap = rows[:, None] - cols[None, :]
        seen = (gap >= 0) & (gap < window) & (cols < T)[None, :]
        p, alpha, m_i, l_i = _softmax_step(s, seen, qk_scale, m_i, l_i)
        vt = tl.load(
            v + head + cols[:, None] * DH + d[None, :],
            mask=(cols < T)[:, None] & real_d[None, :],
            other=0.0,
        )
        acc = acc * alpha[:, None] + _tile_values(p, vt, F32_DOTS)
    # every real row sees at least itself (l_i > 0); rows past T, never stored, may see nothing
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    # out[b, t, h * DH + d]: the layout the output projection reads, no copy after
    dst = out + (b * T + rows[:, None]).to(tl.int64) * (H * DH) + h * DH + d[None, :]
    tl.store(dst, o.to(out.dtype.element_ty), mask=(rows < T)[:, None] & real_d[None, :])


# Triton's interpreter (the tests; triton 3.6) multiplies the bits of bfloat16 dot operands, not
# their values: there the kernel forms its products in float32 from the same rounded operands
try:
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # no interpreter in this Triton: nothing is interpreted
    InterpretedFunction = ()
_INTERPRETED = isinstance(_window_attention_kernel, InterpretedFunction)


@triton.jit
def _ring_attention_kernel(
    q, ring_k, ring_v, slots, pos, out, N, R, window, qk_scale,
    H: tl.constexpr, DH: tl.constexpr, DH_P2: tl.constexpr, F32_DOTS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TILES: tl.constexpr,
):  # fmt: skip
    blk, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    slot = tl.load(slots + b).to(tl.int64)
    first = tl.load(pos + b).to(tl.int64)  # the row's absolute step of its new step 0
    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, DH_P2)
    real_d = d < DH
    live = (rows < N)[:, None] & real_d[None, :]
    qt = tl.load(q + (bh.to(tl.int64) * N + rows[:, None]) * DH + d[None, :], mask=live, other=0.0)
    steps = first + rows  # the queries' absolute steps
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DH_P2], tl.float32)
    # keys by absolute step, from the first query's window start: TILES tiles cover the block's
    # windows. Step s sits at ring entry s % R (the ring holds every step a window here needs);
    # steps before 0 hold nothing, and steps after a query, its future, include the entries of
    # padded steps, which were never written there
    lo = first + blk * BLOCK_M - window + 1
    row = slot * R
    for j in range(TILES):
        cols = lo + j * BLOCK_N + tl.arange(0, BLOCK_N)
        at = (row + tl.where(cols >= 0, cols, 0) % R) * (H * DH) + h * DH
        kt = tl.load(ring_k + at[None, :] + d[:, None], mask=real_d[:, None], other=0.0)
        s = _tile_scores(qt, kt, F32_DOTS)
        gap = steps[:, None] - cols[None, :]
        seen = (gap >= 0) & (gap < window) & (cols >= 0)[None, :]
        p, alpha, m_i, l_i = _softmax_step(s, seen, qk_scale, m_i, l_i)
        vt = tl.load(ring_v + at[:, None] + d[None, :], mask=real_d[None, :], other=0.0)
        acc = acc * alpha[:, None] + _tile_values(p, vt, F32_DOTS)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    dst = out + (b * N + rows[:, None]).to(tl.int64) * (H * DH) + h * DH + d[None, :]
    tl.store(dst, o.to(out.dtype.element_ty), mask=live)


def window_attention_fits(q) -> bool:
    """Whether ``window_attention`` takes q (and k, v shaped alike): a head width up to
    ATTN_MAX_DH, a float dtype it computes in, the grid within CUDA's second-axis limit."""
    B, H, _, dh = q.shape
    return (
        q.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and 0 < dh <= ATTN_MAX_DH
        and B * H <= 65535
    )


def ring_attention(q, ring_k, ring_v, slots, pos, window: int):
    """``codec.stream.ring_window_attention`` in one launch: q [B, H, N, dh], the new steps of
    each row, row b at absolute steps ``pos[b]``.. of slot ``slots[b]`` of the rings
    [slots, R, H, dh] (step s at entry s % R) -> [B, N, H * dh]. Query step t sees the steps
    max(0, t - window + 1)..t; a program visits only the tiles its queries' windows reach,
    read from the rings in place (no gather of each row's ring)."""
    B, H, N, dh = q.shape
    R = ring_k.shape[1]
    q = q.contiguous()
    out = torch.empty((B, N, H * dh), dtype=q.dtype, device=q.device)
    if B * H * N == 0:
        return out
    block_m = min(ATTN_BLOCK_M, max(16, triton.next_power_of_2(N)))
    tiles = triton.cdiv(block_m + window - 1, ATTN_BLOCK_N)
    _ring_attention_kernel[(triton.cdiv(N, block_m), B * H)](
        q, ring_k, ring_v, slots, pos, out, N, R, window, LOG2_E / dh**0.5,
        H=H, DH=dh, DH_P2=max(16, triton.next_power_of_2(dh)),
        F32_DOTS=q.dtype == torch.float32 or _INTERPRETED,
        BLOCK_M=block_m, BLOCK_N=ATTN_BLOCK_N, TILES=tiles,
        num_warps=ATTN_WARPS, num_stages=ATTN_STAGES,
    )  # fmt: skip
    return out


def window_attention(q, k, v, window: int | None, length: int | None = None):
    """``codec_layers.sliding_window_attention`` in one launch: q, k, v [B, H, Tq, dh] (Tq >= T,
    steps past T ignored), key j visible to query i iff 0 <= i - j < ``window`` (None: causal)
    -> [B, T, H * dh] in q's dtype; T = ``length`` or Tq."""
    B, H, Tq, dh = q.shape
    T = Tq if length is None else length
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty((B, T, H * dh), dtype=q.dtype, device=q.device)
    if B * H * T == 0:
        return out
    # tl.dot wants each dimension at least 16 wide: narrower heads are padded in registers
    dh_p2 = max(16, triton.next_power_of_2(dh))
    window = T if window is None else min(window, T)
    # a block of BLOCK_M queries (a whole number of key tiles) reaches back window - 1 steps:
    # its own tiles and the ceil((window - 1) / BLOCK_N) before them, at most all T's tiles
    tiles = min(ATTN_BLOCK_M // ATTN_BLOCK_N + triton.cdiv(window - 1, ATTN_BLOCK_N),
                triton.cdiv(T, ATTN_BLOCK_N))  # fmt: skip
    grid = (triton.cdiv(T, ATTN_BLOCK_M), B * H)
    _window_attention_kernel[grid](
        q, k, v, out, T, Tq, window, LOG2_E / dh**0.5,
        H=H, DH=dh, DH_P2=dh_p2, F32_DOTS=q.dtype == torch.float32 or _INTERPRETED,
        BLOCK_M=ATTN_BLOCK_M, BLOCK_N=ATTN_BLOCK_N, TILES=tiles,
        num_warps=ATTN_WARPS, num_stages=ATTN_STAGES,
    )  # fmt: skip
    return out
