"""Self-attention of Sidon's w2v-BERT cleanser with its relative-key position bias, built once.

transformers' ``Wav2Vec2BertSelfAttention`` (``position_embeddings_type: relative_key``) gathers
a (L, L, head) table of distance embeddings, contracts it with the queries into a (B, H, L, L)
bias (an einsum over L small matrix products), scales that, then merges it with the padding
mask into a float mask for SDPA: several passes over a tensor of B x 16 heads x L^2 (576 MB per
layer for 32 takes of 15 s), about a quarter of Sidon's GPU time (docs/PERFORMANCE.md).

The bias only depends on the clamped distance r - l (64 back, 8 ahead: 73 values), so here
the queries meet the 73 embeddings in one small product, the (B, H, L, 73) result is scaled,
then gathered into the (B, H, L, L) bias, and the padding is filled in place: one pass to
write the bias, one to mask it. Same values as transformers' (the same products, the scale
applied to the same fp16 numbers; tested on the CPU), then the same SDPA call.

``BESTOFN_SIDON_ATTENTION=auto|ours|transformers`` or set_attention(): auto uses this on CUDA.
"""

from __future__ import annotations

import os
import types

import torch

_MODE = {"mode": os.environ.get("BESTOFN_SIDON_ATTENTION", "auto")}


def set_attention(mode: str) -> None:
    if mode not in ("auto", "ours", "transformers"):
        raise ValueError(f"sidon: attention must be auto, ours or transformers; got {mode!r}")
    _MODE["mode"] = mode


def _use_ours(x: torch.Tensor) -> bool:
    mode = _MODE["mode"]
    return mode == "ours" or (mode == "auto" and x.is_cuda)


def relative_key_bias(module, query: torch.Tensor, attention_mask) -> torch.Tensor:
    """The (B, H, L, L) float mask transformers hands SDPA: scaled relative-key bias, and
    the dtype's minimum where ``attention_mask`` (bool: attend) says not to attend, or plus
    ``attention_mask`` where it is an additive float mask."""
    batch, heads, length, _ = query.shape
    left, right = module.left_max_position_embeddings, module.right_max_position_embeddings
    table = module.distance_embedding.weight.to(dtype=query.dtype)  # (left + right + 1, D)
    per_distance = torch.matmul(query, table.t()) * module.scaling  # (B, H, L, 73)
    position = torch.arange(length, device=query.device)
    distance = (position[None, :] - position[:, None]).clamp(-left, right) + left  # [l, r]
    bias = per_distance.gather(-1, distance.expand(batch, heads, length, length))
    if attention_mask is None:
        return bias
    if attention_mask.dtype == torch.bool:
        return bias.masked_fill_(~attention_mask, torch.finfo(bias.dtype).min)
    return bias.add_(attention_mask)


def forward(module, hidden_states, attention_mask=None, relative_position_embeddings=None, **kw):
    """``Wav2Vec2BertSelfAttention.forward`` for relative-key attention (see the module)."""
    if not _use_ours(hidden_states) or module.training:
        return type(module).forward(
            module,
            hidden_states,
            attention_mask=attention_mask,
            relative_position_embeddings=relative_position_embeddings,
            **kw,
        )
    batch, length, _ = hidden_states.shape
    shape = (batch, length, module.num_heads, module.head_size)
    query = module.linear_q(hidden_states).view(shape).transpose(1, 2)
    key = module.linear_k(hidden_states).view(shape).transpose(1, 2)
    value = module.linear_v(hidden_states).view(shape).transpose(1, 2)
    bias = relative_key_bias(module, query, attention_mask)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=bias, scale=module.scaling
    )
    out = out.transpose(1, 2).reshape(batch, length, -1)
    return module.linear_out(out), None


def install(encoder) -> int:
    """Route each relative-key self-attention of ``encoder`` through :func:`forward` (which
    still calls transformers' own where this one does not apply); returns how many."""
    n = 0
    for module in encoder.modules():
        if (
            type(module).__name__ == "Wav2Vec2BertSelfAttention"
            and getattr(module, "position_embeddings_type", None) == "relative_key"
            and hasattr(module, "distance_embedding")
        ):
            module.forward = types.MethodType(forward, module)
            n += 1
    return n
