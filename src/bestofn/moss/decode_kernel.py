"""Decode attention of one new token per row as a split-K ("flash-decoding") Triton kernel.

The frame step's largest item on an H200 was the backbone's decode attention through SDPA
(cutlass' memory-efficient kernel, picked because of the key mask), well below the HBM speed
its K/V reads need (ledger figure generation.local.decode_attention_triton).
That kernel tiles queries by 64 while a kv head here has 4 (its group of query heads),
and walks all keys in one program per (row, kv head): 512 programs for a 132-SM GPU.

Here the keys are split instead: pass 1 runs one program per (row, kv head, block of 64 keys),
each scoring the group's queries against its block and keeping its max, its sum of exponentials
and its weighted sum of V (float32); pass 2 merges the blocks of each (row, kv head). Same maths
as softmax(q k^T * scale + key_bias) v with float32 softmax; P is rounded to V's dtype for the
second product, as SDPA's kernels do. The number of key blocks is a compile-time constant (the
engine's KV lengths come in 64-slot buckets, so a few variants are compiled, at the warm-up
step before each graph capture). ``decode_attention_triton`` has ``model.decode_attention``'s
signature: q [B, kv, G, D]; k, v [B, kv, L, D] (any strides with unit stride along D; the fused
cache's views qualify); key_bias [B, 1, 1, L] with 0 / -inf.
"""

from __future__ import annotations

import torch

BLOCK_N = 64  # keys per program of pass 1
_KERNELS: dict = {}


def available() -> bool:
    """Triton imports here (it comes with torch's CUDA wheels)."""
    if "partial" not in _KERNELS:
        try:
            _KERNELS.update(_build())
        except ImportError:
            _KERNELS["partial"] = None
    return _KERNELS["partial"] is not None


def _build() -> dict:
    import triton
    import triton.language as tl

    @triton.jit
    def partial(q_ptr, k_ptr, v_ptr, bias_ptr, m_ptr, l_ptr, o_ptr,
                sq_b, sq_h, sq_g, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l, sbias_b,
                L, KV, scale, S: tl.constexpr,
                G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                IEEE: tl.constexpr):  # fmt: skip
        bh = tl.program_id(0)  # row * KV + kv head
        blk = tl.program_id(1)  # block of keys
        b = bh // KV
        h = bh % KV
        g = tl.arange(0, GP)
        d = tl.arange(0, D)
        n = blk * BLOCK + tl.arange(0, BLOCK)
        keys = n < L
        q = tl.load(q_ptr + b * sq_b + h * sq_h + g[:, None] * sq_g + d[None, :],
                    mask=g[:, None] < G, other=0.0)  # fmt: skip
        k = tl.load(k_ptr + b * sk_b + h * sk_h + n[:, None] * sk_l + d[None, :],
                    mask=keys[:, None], other=0.0)  # fmt: skip
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        bias = tl.load(bias_ptr + b * sbias_b + n, mask=keys, other=float("-inf"))
        s = s * scale + bias.to(tl.float32)[None, :]
        m = tl.max(s, axis=1)  # [GP]; -inf where the whole block is masked
        p = tl.exp(s - tl.where(m == float("-inf"), 0.0, m)[:, None])
        l_sum = tl.sum(p, axis=1)
        v = tl.load(v_ptr + b * sv_b + h * sv_h + n[:, None] * sv_l + d[None, :],
                    mask=keys[:, None], other=0.0)  # fmt: skip
        if IEEE:
            o = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            o = tl.dot(p.to(v.dtype), v)
        row = (bh * S + blk) * G + g  # partials keep only the G real query rows
        tl.store(m_ptr + row, m, mask=g < G)
        tl.store(l_ptr + row, l_sum, mask=g < G)
        tl.store(o_ptr + row[:, None] * D + d[None, :], o, mask=g[:, None] < G)

    @triton.jit
    def merge(m_ptr, l_ptr, o_ptr, out_ptr, so_b, so_h, so_g, KV, S: tl.constexpr,
              G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr):  # fmt: skip
        bh = tl.program_id(0)
        b = bh // KV
        h = bh % KV
        g = tl.arange(0, GP)
        d = tl.arange(0, D)
        real = g < G
        m_all = tl.full([GP], float("-inf"), tl.float32)
        for blk in tl.static_range(S):
            m_all = tl.maximum(m_all, tl.load(m_ptr + (bh * S + blk) * G + g, mask=real,
                                              other=float("-inf")))  # fmt: skip
        total = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        for blk in tl.static_range(S):
            row = (bh * S + blk) * G + g
            m = tl.load(m_ptr + row, mask=real, other=float("-inf"))
            w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_all))
            total += w * tl.load(l_ptr + row, mask=real, other=0.0)
            acc += w[:, None] * tl.load(o_ptr + row[:, None] * D + d[None, :],
                                        mask=real[:, None], other=0.0)  # fmt: skip
        # a row with every slot masked (an empty row of the serve path's batch): 0, as SDPA
        # gives, not 0/0
        out = tl.where(total[:, None] > 0.0, acc / tl.maximum(total, 1e-30)[:, None], 0.0)
        tl.store(out_ptr + b * so_b + h * so_h + g[:, None] * so_g + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=real[:, None])  # fmt: skip

    return {"partial": partial, "merge": merge}


INT32_MAX = 2**31 - 1


def _max_offset(t) -> int:
    """The largest element offset a kernel computes into ``t`` (from its first element)."""
    return sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True) if n > 0)


def supports(q, k, v) -> bool:
    """Shapes and layouts the kernel takes: head dim a power of 2 >= 16 (tl.dot's minimum),
    unit stride along it, and every offset the kernels compute within int32. Triton computes
    ``row * stride`` in int32 when both fit in it, so a cache of more than 2**31 elements per
    layer (e.g. batch 640 x 2,048 slots x 2 x 8 kv heads x 128) would wrap; such shapes go to
    SDPA instead. The float32 partials (one D-vector per row, kv head, query and block of keys)
    must fit too."""
    B, KV, G, D = q.shape
    if D < 16 or D & (D - 1) or any(t.stride(-1) != 1 for t in (q, k, v)):
        return False
    partials = B * KV * -(-k.shape[2] // BLOCK_N) * G * D
    return max(partials, *(_max_offset(t) for t in (q, k, v))) <= INT32_MAX


def decode_attention_triton(q, k, v, key_bias, scale):
    """softmax(q k^T * scale + key_bias) v over the key axis, per kv head and row."""
    if not available():
        raise RuntimeError("decode attention 'triton' needs Triton, which does not import here")
    B, KV, G, D = q.shape
    L = k.shape[2]
    if not supports(q, k, v):
        raise ValueError(
            f"decode attention 'triton': head dim {D} must be a power of 2 >= 16, with unit "
            "stride along it, and every offset within int32 (supports())"
        )
    bias = key_bias.expand(B, 1, 1, L)[:, 0, 0]  # [B, L]; a broadcast batch keeps stride 0
    if bias.stride(-1) != 1:
        bias = bias.contiguous()
    S = -(-L // BLOCK_N)
    gp = max(16, 1 << (G - 1).bit_length())  # tl.dot needs >= 16 rows
    m = torch.empty(B * KV * S * G, device=q.device, dtype=torch.float32)
    lse = torch.empty_like(m)
    o = torch.empty(B * KV * S * G, D, device=q.device, dtype=torch.float32)
    out = torch.empty(B, KV, G, D, device=q.device, dtype=q.dtype)
    ieee = q.dtype == torch.float32  # float32 stays float32 (no TF32), as SDPA's math
    _KERNELS["partial"][(B * KV, S)](
        q, k, v, bias, m, lse, o,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), bias.stride(0),
        L, KV, float(scale), S=S, G=G, GP=gp, D=D, BLOCK=BLOCK_N, IEEE=ieee,
    )  # fmt: skip
    _KERNELS["merge"][(B * KV,)](
        m, lse, o, out, out.stride(0), out.stride(1), out.stride(2), KV, S=S, G=G, GP=gp, D=D
    )
    return out
