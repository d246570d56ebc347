"""MOSS-TTS-Local network, written for inference with static caches.

Two transformers:
- the backbone (Qwen3: RMSNorm, GQA with QK-norm, NeoX RoPE, SwiGLU) runs once per frame over the
  time axis; its q/k/v and gate/up projections are fused into one matmul each at load time;
- the local transformer (GPT-2 block, interleaved RoPE or learned positions) runs n_vq steps per
  frame: position 0 takes the backbone hidden, position k+1 the embedding of codebook k's code.
Audio heads are tied to the audio embeddings (one stacked [n_vq, V, H] tensor); the continue/stop
decision is a 2-row head over [assistant_slot, audio_end].
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from bestofn.moss.config import MossLocalConfig
from bestofn.moss.kv_cache import BackboneCache, LocalCache
from bestofn.moss.local_loop import (
    LOCAL_ATTENTION_MODES,
    local_attention_path,
    local_frame,
    rope_tables,
)
from bestofn.moss.options import engine_defaults

# Attention of one new token per row over the KV cache (the engine option decode_attention;
# its default is in the config schema). "sdpa": one SDPA call with the key mask. "triton": a
# split-K (flash-decoding) kernel, faster than SDPA on the decode shapes (decode_kernel says
# why; ledger figure generation.local.decode_attention_triton). "auto": triton on CUDA where
# Triton imports and the head dim suits it (a power of 2 >= 16), else SDPA.
DECODE_ATTENTION_MODES = ("auto", "sdpa", "triton")


def decode_attention_path(device, mode: str) -> str:
    """The decode attention a model on ``device`` runs with ``mode`` (for provenance): triton
    (where the head dim suits it) or sdpa."""
    if mode in ("auto", "triton") and str(device).startswith("cuda"):
        from bestofn.moss import decode_kernel

        if decode_kernel.available():
            return "triton split-K (sdpa where the head dim is not a power of 2 >= 16)"
    return "sdpa"


def decode_attention(q, k, v, key_bias, scale, mode: str):
    """q [B, kv, group, D] (a kv head's query heads as its 'rows'); k, v [B, kv, L, D];
    key_bias [B, 1, 1, L], 0 for slots to attend and -inf elsewhere -> [B, kv, group, D].
    ``mode``: one of DECODE_ATTENTION_MODES."""
    if mode in ("auto", "triton") and q.is_cuda:
        from bestofn.moss import decode_kernel

        # SDPA where Triton is missing or the shape is not the kernel's (the tiny test models'
        # head dim 8): same results up to float rounding
        if decode_kernel.available() and decode_kernel.supports(q, k, v):
            return decode_kernel.decode_attention_triton(q, k, v, key_bias, scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_bias, scale=scale)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # rms_norm computes in float32 and rounds once; the scale is applied after the cast,
        # the same rounding order as the reference (2 kernels instead of ~8).
        return self.weight * F.rms_norm(x, (x.shape[-1],), None, self.eps)


def _activation(name: str):
    name = name.lower()
    if name in ("silu", "swish"):
        return F.silu
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    raise ValueError(f"unsupported local activation {name!r}")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:  # NeoX layout (backbone)
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:  # interleaved GPT-J layout (local)
    even, odd = x[..., ::2], x[..., 1::2]
    return torch.stack((-odd, even), dim=-1).flatten(-2)


# ---- per-token pieces as pure functions of (activations, weights) -------------------------
# Written as plain functions with the weights passed in so that one torch.compile'd version
# serves all 36 backbone layers (and all local steps) without recompiling. Cache writes and
# attention stay outside them (in-place updates of big caches are kept out of compiled code).


def backbone_pre_attn(x, cos, sin, w_norm, w_qkv, w_qk_norm, n_heads: int, n_kv: int, eps: float):
    """x [..., H] -> q [..., heads, D], k/v [..., kv_heads, D]: RMSNorm, fused qkv projection,
    QK-norm and NeoX RoPE (q and k heads normalized and rotated together)."""
    D = w_qk_norm.shape[-1]
    h = w_norm * F.rms_norm(x, (x.shape[-1],), None, eps)
    qkv = F.linear(h, w_qkv)
    qk = qkv[..., : (n_heads + n_kv) * D].unflatten(-1, (n_heads + n_kv, D))
    v = qkv[..., (n_heads + n_kv) * D :].unflatten(-1, (n_kv, D))
    qk = w_qk_norm * F.rms_norm(qk, (D,), None, eps)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    qk = qk * cos + _rotate_half(qk) * sin
    return qk[..., :n_heads, :], qk[..., n_heads:, :], v


def backbone_post_attn(x, attn, w_o, w_norm, w_gate_up, w_down, eps: float):
    """Output projection + residual, then RMSNorm + SwiGLU MLP + residual."""
    x = x + F.linear(attn, w_o)
    gate, up = F.linear(w_norm * F.rms_norm(x, (x.shape[-1],), None, eps), w_gate_up).chunk(2, -1)
    return x + F.linear(F.silu(gate) * up, w_down)


def local_pre_attn(
    x, cos_j, sin_j, ln_w, ln_b, w_attn, b_attn, n_heads: int, eps: float, rope: bool
):
    """LayerNorm + fused c_attn; interleaved RoPE on q and k together. x [B, H]."""
    B = x.shape[0]
    h = F.layer_norm(x, (x.shape[-1],), ln_w, ln_b, eps)
    qkv = F.linear(h, w_attn, b_attn).unflatten(-1, (3, n_heads, -1))
    qk, v = qkv[:, :2], qkv[:, 2]
    if rope:
        qk = qk * cos_j + _rotate_pairs(qk) * sin_j
    return qk[:, 0].reshape(B, n_heads, 1, -1), qk[:, 1], v


def local_post_attn(
    x, attn, w_proj, b_proj, ln_w, ln_b, w_in, b_in, w_out, b_out, eps: float, act: str
):
    x = x + F.linear(attn, w_proj, b_proj)
    h = F.linear(F.layer_norm(x, (x.shape[-1],), ln_w, ln_b, eps), w_in, b_in)
    return x + F.linear(_activation(act)(h), w_out, b_out)


def backbone_qkv_fused(hn, cos, sin, w_qkv, w_qk_norm, n_heads: int, n_kv: int, eps: float):
    """``backbone_pre_attn`` on an already normalized input, returning K and V stacked
    ([..., kv_heads, 2, D]) so one cache write stores both."""
    D = w_qk_norm.shape[-1]
    qkv = F.linear(hn, w_qkv)
    qk = qkv[..., : (n_heads + n_kv) * D].unflatten(-1, (n_heads + n_kv, D))
    v = qkv[..., (n_heads + n_kv) * D :].unflatten(-1, (n_kv, D))
    qk = w_qk_norm * F.rms_norm(qk, (D,), None, eps)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    qk = qk * cos + _rotate_half(qk) * sin
    return qk[..., :n_heads, :], torch.stack((qk[..., n_heads:, :], v), dim=-2)


def backbone_post_attn_norm(x, attn, w_o, w_norm, w_gate_up, w_down, w_next, eps: float):
    """``backbone_post_attn`` followed by the next RMSNorm (the next layer's input norm, or the
    final norm after the last layer): returns (residual stream, its normalized copy), so the
    residual add and the next norm can be one kernel."""
    x = backbone_post_attn(x, attn, w_o, w_norm, w_gate_up, w_down, eps)
    return x, w_next * F.rms_norm(x, (x.shape[-1],), None, eps)


def rms_norm_w(x, w, eps: float):
    return w * F.rms_norm(x, (x.shape[-1],), None, eps)


IMPLS = {
    "backbone_pre_attn": backbone_pre_attn,
    "backbone_post_attn": backbone_post_attn,
    "backbone_qkv_fused": backbone_qkv_fused,
    "backbone_post_attn_norm": backbone_post_attn_norm,
    "rms_norm_w": rms_norm_w,
    "local_pre_attn": local_pre_attn,
    "local_post_attn": local_post_attn,
}


class BackboneLayer(nn.Module):
    def __init__(self, c: MossLocalConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.qkv = nn.Linear(c.hidden_size, q_out + 2 * kv_out, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.o_proj = nn.Linear(q_out, c.hidden_size, bias=False)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.gate_up = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.scale = c.head_dim**-0.5
        self.eps = c.rms_norm_eps
        self.impl = IMPLS  # swapped for compiled versions by MossLocalModel.compile_steps()
        self.attention = engine_defaults()["decode_attention"]  # set_paths() sets it

    def _qk_norm_weight(self):
        # [heads + kv_heads, D]: q_norm's weight for query heads, k_norm's for key heads. Built
        # once (after loading), so a decode step does not rebuild it per layer.
        w = getattr(self, "_qk_w", None)
        qw, kw = self.q_norm.weight, self.k_norm.weight
        if w is None or w.dtype != qw.dtype or w.device != qw.device:
            w = torch.cat([qw.expand(self.n_heads, -1), kw.expand(self.n_kv, -1)]).detach()
            self._qk_w = w
        return w

    def _pre(self, x, cos, sin, impl=None):
        return (impl or self.impl)["backbone_pre_attn"](
            x, cos, sin, self.input_layernorm.weight, self.qkv.weight, self._qk_norm_weight(),
            self.n_heads, self.n_kv, self.eps,
        )  # fmt: skip

    def _post(self, x, attn, impl=None):
        return (impl or self.impl)["backbone_post_attn"](
            x, attn, self.o_proj.weight, self.post_attention_layernorm.weight,
            self.gate_up.weight, self.down_proj.weight, self.eps,
        )  # fmt: skip

    def prefill(self, x, cos, sin, attn_mask, k_cache, v_cache):
        """x [B, T, H]; attn_mask [B, 1, T, T] bool. Writes K/V to cache slots [0, T)."""
        B, T, _ = x.shape
        # Eager functions here: prompt lengths vary, and compiled code is shape-specialized.
        q, k, v = self._pre(x, cos, sin, IMPLS)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, h, T, D]
        k_cache[:, :, :T].copy_(k)
        v_cache[:, :, :T].copy_(v)
        if attn_mask is None:  # no padding: plain causal attention (flash kernels on GPU)
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.scale, enable_gqa=True
            )
        else:
            rep = self.n_heads // self.n_kv
            out = F.scaled_dot_product_attention(
                q,
                k.repeat_interleave(rep, dim=1),  # one-time cost at prefill only
                v.repeat_interleave(rep, dim=1),
                attn_mask=attn_mask,
                scale=self.scale,
            )
        return self._post(x, out.transpose(1, 2).reshape(B, T, -1), IMPLS)

    def prefill_packed(self, x, cos, sin, groups, write):
        """Prompts of several lengths in one pass: x [1, N, H] holds them end to end, grouped by
        length (``groups``: (offset, n, T) each, n prompts of T rows from row ``offset``). The
        matmuls run on all N rows at once; attention runs on each group's prompts alone,
        causal and unpadded, as ``prefill`` of that group would. ``write(g, k, v)`` stores
        group g's K/V ([n, kv, T, D] each)."""
        q, k, v = self._pre(x, cos, sin, IMPLS)  # [1, N, heads, D]
        out = torch.empty(q.shape[1], q.shape[2] * q.shape[3], dtype=q.dtype, device=q.device)
        for g, (o, n, T) in enumerate(groups):
            qg, kg, vg = (t[0, o : o + n * T].reshape(n, T, *t.shape[2:]).transpose(1, 2)
                          for t in (q, k, v))  # fmt: skip
            write(g, kg, vg)
            att = F.scaled_dot_product_attention(
                qg, kg, vg, is_causal=True, scale=self.scale, enable_gqa=True
            )
            out[o : o + n * T] = att.transpose(1, 2).reshape(n * T, -1)
        return self._post(x, out[None], IMPLS)

    def decode(self, x, cos, sin, key_bias, write_idx, k_cache, v_cache):
        """One new token per row. x [B, H]; caches [B, kv, L, D]; key_bias [B, 1, 1, L]
        (0 where a slot may be attended, -inf elsewhere; includes this token's slot)."""
        B = x.shape[0]
        q, k, v = self._pre(x, cos, sin)  # q [B, h, D], k/v [B, kv, D]
        k_cache.index_copy_(2, write_idx, k.unsqueeze(2))
        v_cache.index_copy_(2, write_idx, v.unsqueeze(2))
        # Grouped-query attention without expanding K/V: each kv head attends with its group of
        # query heads as a 'sequence' of `group` queries -> one fused attention kernel.
        q = q.reshape(B, self.n_kv, self.n_heads // self.n_kv, self.head_dim)
        out = decode_attention(q, k_cache, v_cache, key_bias, self.scale, self.attention)
        return self._post(x, out.reshape(B, -1))

    def decode_fused(self, x, hn, cos, sin, key_bias, write_idx, kv_cache, w_next):
        """``decode`` with this layer's input norm already applied (hn) and the next norm fused
        into the output: returns (x, next hn). kv_cache [B, kv, L, 2, D] (K and V side by side,
        one write)."""
        B = x.shape[0]
        q, kv = self.impl["backbone_qkv_fused"](
            hn, cos, sin, self.qkv.weight, self._qk_norm_weight(), self.n_heads, self.n_kv,
            self.eps,
        )  # fmt: skip
        kv_cache.index_copy_(2, write_idx, kv.unsqueeze(2))
        q = q.reshape(B, self.n_kv, self.n_heads // self.n_kv, self.head_dim)
        k, v = kv_cache[..., 0, :], kv_cache[..., 1, :]
        out = decode_attention(q, k, v, key_bias, self.scale, self.attention)
        return self.impl["backbone_post_attn_norm"](
            x, out.reshape(B, -1), self.o_proj.weight, self.post_attention_layernorm.weight,
            self.gate_up.weight, self.down_proj.weight, w_next, self.eps,
        )  # fmt: skip


class LocalBlock(nn.Module):
    def __init__(self, c: MossLocalConfig):
        super().__init__()
        H = c.hidden_size
        self.n_heads, self.head_dim = c.local_heads, c.local_head_dim
        self.ln_1 = nn.LayerNorm(H, eps=c.local_ln_eps)
        self.c_attn = nn.Linear(H, 3 * H)
        self.c_proj = nn.Linear(H, H)
        self.ln_2 = nn.LayerNorm(H, eps=c.local_ln_eps)
        self.fc_in = nn.Linear(H, c.local_inner)
        self.fc_out = nn.Linear(c.local_inner, H)
        self.act_name = c.local_activation
        self.act = _activation(self.act_name)  # fails early on an unknown name
        self.use_rope = c.local_positions == "rope"
        self.eps = c.local_ln_eps
        self.impl = IMPLS

    def step(self, x, j: int, cos, sin, k_cache, v_cache):
        """x [B, H] at local position j (a Python int: each position is its own static code)."""
        B = x.shape[0]
        q, k, v = self.impl["local_pre_attn"](
            x, cos[j], sin[j], self.ln_1.weight, self.ln_1.bias, self.c_attn.weight,
            self.c_attn.bias, self.n_heads, self.eps, self.use_rope,
        )  # fmt: skip
        k_cache[:, :, j].copy_(k)
        v_cache[:, :, j].copy_(v)
        out = F.scaled_dot_product_attention(q, k_cache[:, :, : j + 1], v_cache[:, :, : j + 1])
        return self.impl["local_post_attn"](
            x, out.reshape(B, -1), self.c_proj.weight, self.c_proj.bias, self.ln_2.weight,
            self.ln_2.bias, self.fc_in.weight, self.fc_in.bias, self.fc_out.weight,
            self.fc_out.bias, self.eps, self.act_name,
        )  # fmt: skip


def prefill_attention_mask(mask: torch.Tensor) -> torch.Tensor | None:
    """[B, 1, T, T] causal mask of left-padded prompts (mask [B, T] bool), None if none is
    padded. Padded queries see themselves, so no softmax row is empty (their output is unused)."""
    if bool(mask.all()):
        return None
    T = mask.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=mask.device).tril()
    keys = mask[:, None, None, :] | torch.eye(T, dtype=torch.bool, device=mask.device)
    return causal & keys


class Qwen3Backbone:
    """What both MOSS models (Local, and Delay in bestofn.moss.delay) share around their Qwen3
    backbone: its RoPE, and the kernel paths the model runs, moss-fast's runtime options
    ``fused``, ``decode_attention``, ``local_attention`` (Local only) and ``compile_mode``
    (defaults in the config schema). The paths live on the model object, not in module
    globals, so two models in one process (``bestofn ab``'s A and B) can run different ones."""

    has_local = True  # a local transformer (MossLocalModel); the Delay model has none

    def set_paths(self, fused=None, decode_attention=None, local_attention=None) -> None:
        """Set the paths given (None: leave one as it is). ``fused`` off: the pre-fusion code
        paths (side-by-side benchmarks); caches made afterwards follow the backbone setting."""
        if fused is not None:
            # the backbone decode with K+V in one cache write and each residual add fused with
            # the next RMSNorm (needs a cache made while it is on: K/V side by side)
            self.fused_backbone = bool(fused)
            if self.has_local:  # the whole local loop of a frame as one function
                self.fused_local = bool(fused)
        if decode_attention is not None:
            if decode_attention not in DECODE_ATTENTION_MODES:
                known = ", ".join(DECODE_ATTENTION_MODES)
                raise ValueError(f"decode_attention {decode_attention!r}: use {known}")
            self.decode_attention = decode_attention
            for layer in self.layers:
                layer.attention = decode_attention
        if local_attention is not None and self.has_local:
            if local_attention not in LOCAL_ATTENTION_MODES:
                known = ", ".join(LOCAL_ATTENTION_MODES)
                raise ValueError(f"local_attention {local_attention!r}: use {known}")
            self.local_attention = local_attention

    def set_fused(self, on: bool) -> None:
        self.set_paths(fused=on)

    def compile_steps(self, mode: str | None = None) -> None:
        """Use torch.compile'd versions of the per-token pieces (fuses the elementwise chains:
        norms, RoPE, SiLU-gating, residuals). One compiled graph per piece, shared by layers.
        ``mode``: an Inductor mode (runtime option compile_mode), e.g.
        max-autotune-no-cudagraphs (Triton GEMM templates with fused epilogues; longer compile).
        Not "max-autotune": its own CUDA graphs would nest inside the engine's captured step."""
        import torch._dynamo

        # Batch sizes differ between groups; allow a compiled variant per shape.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        by_mode = self.__dict__.setdefault("_compiled_impls", {})
        if mode not in by_mode:
            kw = {"mode": mode} if mode else {}
            compiled = {n: torch.compile(fn, dynamic=False, **kw) for n, fn in IMPLS.items()}
            if self.has_local:
                compiled["local_frame"] = torch.compile(local_frame, dynamic=False, **kw)
            by_mode[mode] = compiled
        self._use_impls(by_mode[mode])

    def eager_steps(self) -> None:
        self._use_impls(dict(IMPLS, local_frame=local_frame))

    def _rope(self, pos: torch.Tensor, dtype):
        freqs = pos.to(torch.float32).unsqueeze(-1) * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def _use_impls(self, impls: dict) -> None:
        mods = (*self.layers, *self.local_blocks) if self.has_local else self.layers
        for mod in mods:
            mod.impl = impls
        if self.has_local:
            self._local_frame_fn = impls["local_frame"]


class MossLocalModel(Qwen3Backbone, nn.Module):
    def __init__(self, c: MossLocalConfig):
        super().__init__()
        self.config = c
        H = c.hidden_size
        self.embed_tokens = nn.Embedding(c.vocab_size, H)
        self.layers = nn.ModuleList(BackboneLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(H, c.rms_norm_eps)
        self.local_blocks = nn.ModuleList(LocalBlock(c) for _ in range(c.local_layers))
        self.local_ln_f = nn.LayerNorm(H, eps=c.local_ln_eps)
        self.local_wpe = nn.Embedding(c.n_vq + 1, H) if c.local_positions == "absolute" else None
        # Tied: audio head k == audio embedding k. Codebooks are stacked (padded to the largest).
        self.audio_embed = nn.Parameter(torch.zeros(c.n_vq, c.audio_vocab, H))
        self.stop_head = nn.Parameter(torch.zeros(2, H))  # rows: [assistant_slot, audio_end]
        self.uneven_codebooks = len(set(c.audio_codebook_sizes)) > 1
        # the backend sets these from its runtime options; until then, the schema's defaults
        d = engine_defaults()
        self.set_paths(d["fused"], d["decode_attention"], d["local_attention"])
        self._local_frame_fn = local_frame
        self.build_buffers()

    def build_buffers(self, device=None) -> None:
        """Derived constants (RoPE tables, codebook masks); rebuilt after meta-device init."""
        c = self.config
        sizes = torch.tensor(c.audio_codebook_sizes)
        over = torch.arange(c.audio_vocab)[None, :] >= sizes[:, None]
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
        d = c.local_head_dim
        linv = 1.0 / (c.local_rope_base ** (torch.arange(0, d, 2).float() / d))
        freqs = torch.arange(c.n_vq + 1).float()[:, None] * linv[None, :]
        bufs = {
            "codebook_overflow": over,
            "inv_freq": inv,
            "local_cos": freqs.cos().repeat_interleave(2, -1),
            "local_sin": freqs.sin().repeat_interleave(2, -1),
        }
        for name, value in bufs.items():
            self.register_buffer(name, value.to(device) if device else value, persistent=False)
        self._local_trig = {}
        self._local_tables = {}

    # ---- embeddings --------------------------------------------------------------------------

    def embed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [..., 1 + n_vq] (text token, codes) -> [..., H]; pad codes contribute nothing."""
        text, codes = ids[..., 0], ids[..., 1:]
        valid = codes != self.config.audio_pad_code
        safe = torch.where(valid, codes, torch.zeros_like(codes))
        k = torch.arange(self.config.n_vq, device=ids.device)
        audio = self.audio_embed[k, safe]  # [..., n_vq, H]
        audio = (audio * valid.unsqueeze(-1).to(audio.dtype)).sum(-2)
        return self.embed_tokens(text) + audio

    # ---- backbone ----------------------------------------------------------------------------

    def prefill(self, ids: torch.Tensor, attention_mask: torch.Tensor, cache: BackboneCache):
        """ids [B, T, 1+n_vq] left-padded; returns final-norm hidden [B, T, H] and fills cache."""
        B, T, _ = ids.shape
        mask = attention_mask.bool()
        pos = (mask.long().cumsum(-1) - 1).clamp_(min=0)
        x = self.embed_rows(ids).to(self.audio_embed.dtype)
        cos, sin = self._rope(pos, x.dtype)
        attn_mask = prefill_attention_mask(mask)
        for i, layer in enumerate(self.layers):
            x = layer.prefill(x, cos, sin, attn_mask, cache.k[i], cache.v[i])
        cache.key_mask[:, :T].copy_(mask)
        cache.pos.copy_(mask.long().sum(-1))
        cache.write_idx.fill_(T)
        return self.norm(x)

    def prefill_packed(self, prompts: list[torch.Tensor], write) -> list[torch.Tensor]:
        """Prompts of several lengths prefilled in one pass, unpadded: ``prompts`` [n_g, T_g,
        1+n_vq] per length. Each prompt's hidden states are those of ``prefill`` of its group
        alone (row-wise matmuls and norms; attention per group, see BackboneLayer.prefill_packed),
        so a burst of distinct lengths costs one pass, not one per length.
        ``write(layer, g, k, v)`` stores group g's K/V; returns each group's last-row hidden
        [n_g, H] (final-normed)."""
        groups, offset = [], 0
        for p in prompts:
            groups.append((offset, int(p.shape[0]), int(p.shape[1])))
            offset += int(p.shape[0]) * int(p.shape[1])
        ids = torch.cat([p.reshape(-1, p.shape[-1]) for p in prompts])[None]
        pos = torch.cat([torch.arange(T, device=ids.device).repeat(n) for _, n, T in groups])
        x = self.embed_rows(ids).to(self.audio_embed.dtype)
        cos, sin = self._rope(pos[None], x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer.prefill_packed(x, cos, sin, groups, lambda g, k, v, i=i: write(i, g, k, v))
        last = torch.cat([torch.arange(o + T - 1, o + n * T, T, device=x.device)
                          for o, n, T in groups])  # fmt: skip
        h = self.norm(x[0, last])  # row-wise: the prompts' last rows only
        return list(h.split([n for _, n, _ in groups]))

    def backbone_step(
        self, x: torch.Tensor, alive: torch.Tensor, cache: BackboneCache, kv_len: int | None = None
    ):
        """x [B, H] embeddings of each row's newest input; alive [B] bool = its attention mask.
        kv_len (static, > write slot) bounds the slots attention reads: the engine captures one
        graph per 64-slot bucket so early frames do not read the whole preallocated cache."""
        hn = decode_backbone(self, x, alive, cache, kv_len)
        cache.pos.add_(alive.long())
        cache.write_idx.add_(1)
        return hn

    # ---- local transformer -------------------------------------------------------------------

    def local_step(self, x: torch.Tensor, j: int, cache: LocalCache) -> torch.Tensor:
        if self.local_wpe is not None:
            x = x + self.local_wpe.weight[j]
        key = (x.dtype, x.device)
        if key not in self._local_trig:  # cast once per dtype; one tensor per position
            self._local_trig[key] = (
                list(self.local_cos.to(x.dtype).unbind(0)),
                list(self.local_sin.to(x.dtype).unbind(0)),
            )
        cos, sin = self._local_trig[key]
        for i, block in enumerate(self.local_blocks):
            x = block.step(x, j, cos, sin, cache.k[i], cache.v[i])
        return self.local_ln_f(x)

    def local_rope_tables(self, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """[n_vq + 1, 3, 1, D] cos / signed-sin tables for the fused q/k/v block (cast once)."""
        key = (dtype, device)
        if key not in self._local_tables:
            cos3, sin3 = rope_tables(self.local_cos, self.local_sin)
            self._local_tables[key] = (cos3.to(device, dtype), sin3.to(device, dtype))
        return self._local_tables[key]

    def local_frame(self, h, u, cache: LocalCache, seen, temperature, top_p, penalty,
                    text_temperature, text_top_p, *, top_k: int, text_top_k: int,
                    do_sample: bool, use_penalty: bool):  # fmt: skip
        """The whole local loop of one frame (moss/local_loop.py): stop head, then n_vq times
        head -> sampling -> embedding -> next local position. Returns (stop [B], codes [B, n_vq]).
        Compiled as one graph after ``compile_steps()``."""
        cos3, sin3 = self.local_rope_tables(h.dtype, h.device)
        # contiguous: the first frame's h is a strided slice of the prefill output; one layout
        # means one compiled graph instead of two
        return self._local_frame_fn(
            self, h.contiguous(), u, cache.kv, seen, cos3, sin3, temperature, top_p, penalty,
            text_temperature, text_top_p, top_k=top_k, text_top_k=text_top_k,
            do_sample=do_sample, use_penalty=use_penalty,
            attention=local_attention_path(h.device, self.local_attention),
        )  # fmt: skip

    def stop_logits(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.stop_head.t()

    def audio_logits(self, h: torch.Tensor, k: int) -> torch.Tensor:
        logits = h @ self.audio_embed[k].t()  # the sampler upcasts (fused there)
        if self.uneven_codebooks:
            logits = logits.masked_fill(self.codebook_overflow[k], float("-inf"))
        return logits

    # ---- caches ------------------------------------------------------------------------------

    def new_backbone_cache(self, batch: int, max_len: int) -> BackboneCache:
        c, p = self.config, self.audio_embed
        return BackboneCache(
            c.num_layers, batch, c.num_kv_heads, max_len, c.head_dim, p.dtype, p.device,
            kv_side_by_side=self.fused_backbone,
        )  # fmt: skip

    def new_local_cache(self, batch: int) -> LocalCache:
        c, p = self.config, self.audio_embed
        return LocalCache(
            c.local_layers, batch, c.local_heads, c.n_vq + 1, c.local_head_dim, p.dtype, p.device
        )


def decode_backbone(m, x, alive, cache: BackboneCache, kv_len: int | None = None):
    """One decode step through the Qwen3 backbone of ``m`` (MossLocalModel or MossDelayModel:
    ``layers``, ``norm``, ``_rope``, ``fused_backbone``), each row writing its K/V at
    ``cache.write_idx``. Returns the final-normed hidden [B, H]; the caller advances
    ``cache.pos`` and ``cache.write_idx`` (by its own rules)."""
    L = kv_len or cache.max_len
    cache.key_mask.index_copy_(1, cache.write_idx, alive.unsqueeze(1))
    bias = torch.zeros((), dtype=x.dtype, device=x.device).masked_fill(
        ~cache.key_mask[:, None, None, :L], float("-inf")
    )
    cos, sin = m._rope(cache.pos, x.dtype)
    if m.fused_backbone and cache.kv is not None:
        first = m.layers[0]
        hn = first.impl["rms_norm_w"](x, first.input_layernorm.weight, first.eps)
        for i, layer in enumerate(m.layers):
            nxt = m.layers[i + 1].input_layernorm if i + 1 < len(m.layers) else m.norm
            kv = cache.kv[i][:, :, :L]
            x, hn = layer.decode_fused(x, hn, cos, sin, bias, cache.write_idx, kv, nxt.weight)
    else:
        for i, layer in enumerate(m.layers):
            k, v = cache.k[i][:, :, :L], cache.v[i][:, :, :L]
            x = layer.decode(x, cos, sin, bias, cache.write_idx, k, v)
        hn = m.norm(x)
    return hn
