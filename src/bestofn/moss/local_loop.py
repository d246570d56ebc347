"""One frame of the local loop as a single function: stop head, then for each of the n_vq
codebooks its head, its sampling, the embedding of the drawn code and the next local position.

The engine's unfused loop (``MossLocalEngine._local_loop_unfused``) calls five separately
compiled pieces per codebook (local pre-attention, cache writes, attention, local post-attention,
head, sampler, embedding lookup), and every boundary between them is at least one kernel. Here
the whole frame is one Python function, so ``torch.compile`` sees it as one graph and fuses across
those boundaries (sampling tail + embedding gather + LayerNorm; RoPE + cache write; residual +
LayerNorm), and the per-position work itself does fewer ops:

- RoPE for the 12 (+1) local positions comes from precomputed tables laid out for the whole fused
  q/k/v block (v rows: cos 1, sin 0), and the pair rotation is one ``flip`` on a [..., D/2, 2]
  view with the sign folded into the sin table (was: two strided slices, a negation, a stack);
- K and V of a position go to the cache in one copy (``LocalCache.kv`` keeps them side by side);
- position 0 attends to itself only, so its attention output is its V (no attention call);
- the sampler is ``sample_tokens_fused`` (one cumulative sum, one ``searchsorted``; same draws).

Eager on CPU it gives bit-identical codes to the unfused loop (tests/moss/test_moss_local_loop.py);
``bestofn parity`` runs through it by default. moss-fast's runtime option ``fused: false`` (or
``model.set_paths(fused=False)``) selects the unfused loop, kept for side-by-side benchmarks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bestofn.moss.sampling import apply_repetition_penalty, sample_tokens_fused

# Attention of the local transformer's new position over its <= n_vq + 1 cached positions
# (moss-fast's runtime option local_attention; its default is in the config schema).
# "sdpa": one SDPA call. "reduce": the two products written as float32 multiply-and-sum
# reductions, which torch.compile turns into one or two small kernels inside the fused local
# frame. Why: on an H200 the SDPA call ran a cutlass/flash kernel launch per call for a dozen
# keys, eleven calls a frame, a visible share of the frame step (ledger figure
# generation.local.gemm_step). "auto": reduce on
# CUDA, SDPA elsewhere (the CPU stays bit for bit what parity checked).
LOCAL_ATTENTION_MODES = ("auto", "sdpa", "reduce")


def local_attention_path(device, mode: str) -> str:
    """The local attention a model on ``device`` runs with ``mode``: sdpa or reduce."""
    on_cuda = str(device).startswith("cuda")
    if mode == "reduce" or (mode == "auto" and on_cuda):
        return "reduce"
    return "sdpa"


def local_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, path: str):
    """q [B, heads, 1, D]; keys, values [B, heads, L, D] (strided views) -> [B, heads, 1, D].
    Softmax attention with SDPA's default scale; ``path`` "reduce" computes it in float32
    throughout (SDPA's fused kernels round the probabilities to the input dtype before P.V),
    so the two agree to the input dtype's rounding, not bit for bit."""
    if path == "sdpa":
        return F.scaled_dot_product_attention(q, keys, values)
    scale = q.shape[-1] ** -0.5
    scores = (q.float() * keys.float()).sum(-1) * scale  # [B, heads, L]
    probs = torch.softmax(scores, dim=-1)
    out = (probs.unsqueeze(-1) * values.float()).sum(-2, keepdim=True)  # [B, heads, 1, D]
    return out.to(q.dtype)


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[L, D] interleaved cos/sin -> [L, 3, 1, D] tables for a fused [B, 3, heads, D] q/k/v block.

    Rows 0 and 1 (q, k) rotate; row 2 (v) is the identity (cos 1, sin 0). The sin table carries
    the rotation's sign: out[2i] = x[2i] cos - x[2i+1] sin, out[2i+1] = x[2i+1] cos + x[2i] sin,
    so with the pairs swapped, even lanes get -sin and odd lanes +sin (negation is exact, so this
    is bit-identical to rotating and then multiplying)."""
    sign = torch.ones(cos.shape[-1], dtype=sin.dtype, device=sin.device)
    sign[0::2] = -1
    ones, zeros = torch.ones_like(cos), torch.zeros_like(sin)
    cos3 = torch.stack((cos, cos, ones), dim=1).unsqueeze(2)
    sin3 = torch.stack((sin * sign, sin * sign, zeros), dim=1).unsqueeze(2)
    return cos3, sin3


def swap_pairs(x: torch.Tensor) -> torch.Tensor:
    """[..., D] -> lanes (2i, 2i+1) swapped: one flip on a pair view."""
    return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)


def block_step(x, j: int, blk, kv, cos3, sin3, rope: bool, attention: str):
    """One local block at position j (a Python int). x [B, H]; kv [B, L, 2, heads, D];
    attention: the local attention path (sdpa or reduce)."""
    B, H = x.shape
    h = F.layer_norm(x, (H,), blk.ln_1.weight, blk.ln_1.bias, blk.eps)
    qkv = F.linear(h, blk.c_attn.weight, blk.c_attn.bias).unflatten(-1, (3, blk.n_heads, -1))
    if rope:
        qkv = qkv * cos3[j] + swap_pairs(qkv) * sin3[j]
    kv[:, j].copy_(qkv[:, 1:])
    if j == 0:  # one key: softmax weight exactly 1, the output is V
        out = qkv[:, 2].reshape(B, -1)
    else:
        keys = kv[:, : j + 1, 0].transpose(1, 2)  # [B, heads, j+1, D], a view
        values = kv[:, : j + 1, 1].transpose(1, 2)
        q = qkv[:, 0].unsqueeze(2)  # [B, heads, 1, D]
        out = local_attention(q, keys, values, attention).reshape(B, -1)
    x = x + F.linear(out, blk.c_proj.weight, blk.c_proj.bias)
    h = F.layer_norm(x, (H,), blk.ln_2.weight, blk.ln_2.bias, blk.eps)
    h = F.linear(h, blk.fc_in.weight, blk.fc_in.bias)
    return x + F.linear(blk.act(h), blk.fc_out.weight, blk.fc_out.bias)


def local_position(m, x, j: int, kv, cos3, sin3, attention: str):
    """The local transformer at position j: x [B, H] -> final-LayerNorm hidden [B, H]."""
    if m.local_wpe is not None:
        x = x + m.local_wpe.weight[j]
    for i, blk in enumerate(m.local_blocks):
        x = block_step(x, j, blk, kv[i], cos3, sin3, blk.use_rope, attention)
    return F.layer_norm(x, (x.shape[-1],), m.local_ln_f.weight, m.local_ln_f.bias, m.local_ln_f.eps)


def local_frame(
    m,
    h: torch.Tensor,
    u: torch.Tensor,
    kv: torch.Tensor,
    seen: torch.Tensor,
    cos3: torch.Tensor,
    sin3: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    penalty: torch.Tensor,
    text_temperature: torch.Tensor,
    text_top_p: torch.Tensor,
    *,
    top_k: int,
    text_top_k: int,
    do_sample: bool,
    use_penalty: bool,
    attention: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h [B, H] backbone hidden; u [B, 1 + n_vq] this frame's uniforms; kv the local K/V
    ([layers, B, L, 2, heads, D]); seen [n_vq, B, V] the repetition-penalty memory (updated in
    place when use_penalty); attention: the local attention path (sdpa or reduce). Returns
    (stop index [B], codes [B, n_vq])."""
    n_vq = m.config.n_vq
    local = local_position(m, h, 0, kv, cos3, sin3, attention)
    stop = sample_tokens_fused(
        m.stop_logits(local), u[:, 0], temperature=text_temperature, top_k=text_top_k,
        top_p=text_top_p, do_sample=do_sample,
    )  # fmt: skip
    codes = []
    for k in range(n_vq):
        logits = m.audio_logits(local, k)
        if use_penalty:
            logits = apply_repetition_penalty(logits, seen[k], penalty)
        code = sample_tokens_fused(
            logits, u[:, 1 + k], temperature=temperature, top_k=top_k, top_p=top_p,
            do_sample=do_sample,
        )  # fmt: skip
        if use_penalty:
            seen[k].scatter_(1, code.unsqueeze(1), True)
        codes.append(code)
        if k + 1 < n_vq:
            x = F.embedding(code, m.audio_embed[k]).to(local.dtype)
            local = local_position(m, x, k + 1, kv, cos3, sin3, attention)
    return stop, torch.stack(codes, dim=-1)
