"""The building blocks both MOSS-Audio-Tokenizer versions are made of, channel-last and batched:
a ``Transformer`` stage (input/output projections around pre-norm causal layers with a sliding
attention window) and the patch reshapes between stages. No nn.Module: plain tensors read from
the checkpoint, so weights can be stored in the compute dtype or fp8 (``Linear``).

Facts (the published modelling code of v1, OpenMOSS/MOSS-Audio-Tokenizer@56df9ee, and of v2 as
vendored in vLLM-Omni, zzehli/vllm-omni@10906e3 ``moss_tts/audio_tokenizer_v2.py``):

- layer: ``x += ls1 * attn(norm1(x))``; ``x += ls2 * fc2(gelu(fc1(norm2(x))))``; LayerNorm eps
  1e-5, exact-erf GELU, no biases in the Linear layers, per-channel layer scale;
- attention: fused q|k|v projection, heads split after; RoPE on interleaved pairs (x[2j],
  x[2j+1]) at absolute positions from 0, angles in fp32; a key is visible to a query iff
  ``0 <= q - k < context``.
- key names: v1 ``self_attn.in_projs.0`` / ``out_projs.0``, ``linear1`` / ``linear2``; v2
  ``self_attn.in_proj`` / ``out_proj``, ``ffn.0`` / ``ffn.2``; both ``norm{1,2}``,
  ``layer_scale_{1,2}.scale``, ``input_proj`` / ``output_proj`` (v1 only where the width
  differs from ``d_model``, v2 always).

The sliding window is computed in blocks of ``context`` queries: each block attends to itself
(causal) and to the block before it, masked to the window, so attention costs O(T * context),
not O(T^2) as a full [T, T] mask would (15-s clips are 6016 steps in the last v2 stage, window
400), and every block is one batched SDPA call: no Python loop over frames.

Kernels (``kernels``): a layer is written as its matmuls with three pieces between them,
``heads_with_rope`` (the fused q|k|v output split into heads, RoPE'd and padded to whole window
blocks), ``sliding_window_attention`` and ``residual_norm`` (a residual add with its layer
scale and the next LayerNorm). ``eager`` runs them as plain torch ops (SDPA for the attention),
the published layer's ops in its order; ``compiled`` runs each piece as one hand-written Triton
kernel instead (``bestofn.moss.codec.kernels`` says why; the heads are then not padded, the
attention kernel needs no whole blocks): no ``torch.compile`` is left in this path, so nothing
compiles per stage shape or clip length beyond Triton's own build per width, and it decodes
faster than eager (ledger figure codec.v2.decode_bf16_b64). The kernels compute in fp32 and round
once, so bf16 output differs from ``eager`` in its last bits: a kernel path, named in the
provenance (``kernel_path``). The encoder (a reference voice, once per worker) always runs
eager.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bestofn.moss.codec.checkpoint import Checkpoint, check_shape, need

FP8_MAX = 448.0  # largest float8_e4m3fn


@dataclass
class StageCfg:
    kind: str  # "patch" | "transformer"
    patch: int = 1
    input_dim: int = 0
    output_dim: int = 0
    d_model: int = 0
    heads: int = 0
    layers: int = 0
    ff: int = 0
    context: int | None = None
    norm: str = "layer_norm"
    rope: bool = True
    max_period: float = 10000.0
    layer_scale: bool = True


class Linear:
    """y = x @ W.T (no bias) in one of three precisions: ``dense`` (W in the compute dtype),
    ``fp8`` (W and x in float8_e4m3fn with per-output-channel / per-row scales, _scaled_mm),
    ``fp8-upcast`` (W stored fp8, converted to the compute dtype for each call)."""

    __slots__ = ("w", "scale", "mode", "dtype")

    def __init__(self, w: torch.Tensor, mode: str, dtype: torch.dtype):
        self.dtype = dtype
        if mode in ("fp8", "fp8-upcast") and w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0:
            w = w.float()
            scale = (w.abs().amax(dim=1) / FP8_MAX).clamp_min(1e-12)
            self.w = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            self.scale = scale
            self.mode = mode
        else:  # dims _scaled_mm cannot take stay dense
            self.w, self.scale, self.mode = w.to(dtype), None, "dense"
        if self.mode == "fp8-upcast":
            self.scale = self.scale.to(dtype)

    @property
    def nbytes(self) -> int:
        n = self.w.numel() * self.w.element_size()
        return n + (self.scale.numel() * self.scale.element_size() if self.scale is not None else 0)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "dense":
            return F.linear(x, self.w)
        if self.mode == "fp8-upcast":
            return F.linear(x, self.w.to(self.dtype) * self.scale[:, None])
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k).float()
        m = x2.shape[0]
        pad = (-m) % 16
        if pad:
            x2 = F.pad(x2, (0, 0, 0, pad))
        sx = (x2.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(1e-12)
        xq = (x2 / sx).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(
            xq, self.w.t(), scale_a=sx, scale_b=self.scale.view(1, -1), out_dtype=torch.bfloat16
        )
        return y[:m].reshape(*lead, -1)


class Norm:
    __slots__ = ("kind", "w", "b", "eps")

    def __init__(self, kind: str, w, b):
        self.kind, self.w, self.b = kind, w, b
        self.eps = 1e-8 if kind == "rms_norm_f32" else 1e-5

    def __call__(self, x):
        if self.kind == "layer_norm":
            return F.layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps)
        dt = x.dtype
        xf = x.float() if self.kind == "rms_norm_f32" else x
        y = xf * (self.w.to(xf.dtype) * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))
        return y.to(dt)


def window_pad(T: int, window: int | None) -> int:
    """Steps added at the end so that T fills whole blocks of ``window`` (0: one block)."""
    return 0 if window is None or window >= T else (-T) % window


def sliding_window_attention(q, k, v, window: int | None, mask_cache: dict, length=None):
    """q, k, v [B, H, Tp, dh] -> [B, T, H * dh] (heads merged, ready for the output
    projection); key k is visible to query q iff 0 <= q-k < window; T = ``length`` or Tp.

    T <= window: plain causal attention. Else the steps, padded at the end to whole blocks
    (the caller may pass them padded by ``window_pad``; causal, so the pad changes no real
    step), form blocks of ``window`` queries: block 0 is causal within itself; block i > 0
    sees blocks i-1 and i through one [window, 2 window] mask that every such block shares.
    Those key spans are read in place, as overlapping strided views of the keys, not copied."""
    B, H, Tq, dh = q.shape
    T = Tq if length is None else length
    pad = window_pad(T, window)
    if pad == 0 and (window is None or window >= T):
        a = F.scaled_dot_product_attention(q[:, :, :T], k[:, :, :T], v[:, :, :T], is_causal=True)
        return a.transpose(1, 2).reshape(B, T, H * dh)
    W = window
    nb = (T + pad) // W
    if Tq != nb * W:  # not padded by the caller
        q, k, v = (F.pad(t[:, :, :T], (0, 0, 0, pad)) for t in (q, k, v))
    q, k, v = (t.contiguous() for t in (q, k, v))
    first = F.scaled_dot_product_attention(q[:, :, :W], k[:, :, :W], v[:, :, :W], is_causal=True)
    key = (W, str(q.device))
    if key not in mask_cache:
        i = torch.arange(W, device=q.device)[:, None]
        j = torch.arange(2 * W, device=q.device)[None, :]
        # query at W + i (from the previous block's start) sees key j iff 0 <= W + i - j < W
        mask_cache.clear()
        mask_cache[key] = (j > i) & (j <= i + W)
    n, Tp = nb - 1, nb * W
    qr = q[:, :, W:].reshape(B * H, n, W, dh)
    # block i's keys are steps (i - 1) W .. (i + 1) W: one span of 2 W rows, W rows apart
    span = ((B * H, n, 2 * W, dh), (Tp * dh, W * dh, dh, 1))
    rest = F.scaled_dot_product_attention(
        qr, k.as_strided(*span), v.as_strided(*span), attn_mask=mask_cache[key]
    )
    rest = rest.reshape(B, H, n * W, dh)  # a copy where the kernel wrote another layout
    out = torch.cat((first.transpose(1, 2), rest.transpose(1, 2)), dim=1)
    return out[:, :T].reshape(B, T, H * dh)


def rotate_pairs(x, cos, sin):
    """RoPE on interleaved pairs (x[2j], x[2j+1]), angles in float32, as the published code."""
    pairs = x.unflatten(-1, (-1, 2)).float()
    a, b = pairs[..., 0], pairs[..., 1]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)


def heads_with_rope(qkv, cos, sin, heads: int, window: int | None = None):
    """The fused projection's output [B, T, 3 D] -> q, k (RoPE'd unless ``cos`` is None), v,
    each [B, heads, T + window_pad(T, window), D / heads], contiguous, zeros in the pad."""
    B, T, _ = qkv.shape
    q, k, v = qkv.view(B, T, 3, heads, -1).permute(2, 0, 3, 1, 4)
    if cos is not None:
        q, k = rotate_pairs(q, cos, sin), rotate_pairs(k, cos, sin)
    pad = window_pad(T, window)
    if pad:
        return tuple(F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    return q.contiguous(), k.contiguous(), v.contiguous()


def residual_norm(x, u, scale, w, b, eps: float):
    """x + scale * u (scale None: x + u), and that sum LayerNorm'd: (new x, normed)."""
    x = x + (u * scale if scale is not None else u)
    return x, F.layer_norm(x, (x.shape[-1],), w, b, eps)


KERNELS = ("eager", "compiled")
# what each kernels value runs, as the provenance names it: a change to what ``compiled`` runs
# changes the audio's last bits, so it gets a new name here
KERNEL_PATHS = {
    "eager": "eager",
    "compiled": "compiled: Triton heads_rope, window_attention, residual_layer_norm",
}
_COMPILED: dict = {}


def kernel_path(kernels: str | None) -> str | None:
    """The provenance's name of the decoder pieces ``kernels`` runs (None stays None)."""
    return None if kernels is None else KERNEL_PATHS.get(kernels, kernels)


def layer_pieces(kernels: str):
    """(heads_with_rope, sliding_window_attention, residual_norm) for ``kernels``: plain, or
    (CUDA; ``resolve_kernels`` says where it may run) each piece as one hand-written Triton
    kernel (``codec_triton``), no ``torch.compile``; the plain piece stands in where a kernel
    does not apply (no steps, a grid or width over the kernel's limits)."""
    if kernels == "eager":
        return heads_with_rope, sliding_window_attention, residual_norm
    if not _COMPILED:
        from bestofn.moss.codec.kernels import (
            MAX_D,
            heads_rope,
            residual_layer_norm,
            window_attention,
            window_attention_fits,
        )

        def heads(qkv, cos, sin, n_heads, window=None):
            # by hand, not torch.compile: see bestofn.moss.codec.kernels. Not padded to whole
            # window blocks: the attention kernel does not need them (its fallback pads)
            B, T = qkv.shape[:2]
            if T == 0 or B * n_heads > 65535:  # CUDA's limit on the grid's second axis
                return heads_with_rope(qkv, cos, sin, n_heads, window)
            return heads_rope(qkv, cos, sin, n_heads, T)

        def attend(q, k, v, window, mask_cache, length=None):
            if not window_attention_fits(q):
                return sliding_window_attention(q, k, v, window, mask_cache, length)
            return window_attention(q, k, v, window, length)

        def add_norm(x, u, scale, w, b, eps):
            fits = x.shape[1] > 0 and x.shape[-1] <= MAX_D and u.shape == x.shape
            if not fits or w is None or b is None or u.dtype != x.dtype:
                return residual_norm(x, u, scale, w, b, eps)
            return residual_layer_norm(x, u, scale, w, b, eps)

        _COMPILED["pieces"] = (heads, attend, add_norm)
    return _COMPILED["pieces"]


def resolve_kernels(value: str, device) -> str:
    """``auto`` -> compiled on a CUDA device where Triton imports, else eager; ``compiled``
    elsewhere is refused with the reason (its Triton kernels are built for CUDA; on a CPU they
    run only in Triton's interpreter, for the tests)."""
    dev = torch.device(device)
    why = None
    if dev.type != "cuda":
        why = f"device {str(device)!r} is not a CUDA GPU"
    else:
        try:
            import triton  # noqa: F401
        except ImportError:
            why = "Triton does not import"
    if value == "auto":
        return "eager" if why else "compiled"
    if value not in KERNELS:
        raise ValueError(f"codec_kernels is {value!r}; known: auto, {', '.join(KERNELS)}")
    if value == "compiled" and why:
        raise ValueError(f"codec_kernels: compiled needs a CUDA GPU with Triton: {why}")
    return value


class Transformer:
    """One ``Transformer`` stage, channel-last: [B, T, input_dim] -> [B, T, output_dim].

    ``mode``/``dtype``: the layers' Linear precision (see ``Linear``); norms, layer scales and
    attention run in ``dtype``; ``kernels``: eager or compiled (see the module docstring)."""

    def __init__(
        self, cfg: StageCfg, ck: Checkpoint, prefix: str, mode, dtype, device, kernels="eager"
    ):
        self.cfg, self.dtype = cfg, dtype
        if kernels not in KERNELS:
            raise ValueError(f"kernels is {kernels!r}; known: {', '.join(KERNELS)}")
        self.kernels = kernels
        D, F_ = cfg.d_model, cfg.ff
        # fp8 inside the layers only: the stage's input/output projections (a small share of
        # the work, next to the code embeddings and the samples) stay in `dtype`; on random
        # weights at real shapes that lifts fp8's SNR against fp32 from ~21 to ~41 dB
        proj_mode = "dense" if mode in ("fp8", "fp8-upcast") else mode

        def lin(key, shape, lin_mode=mode):
            return Linear(check_shape(ck, key, ck.get(key), shape).to(device), lin_mode, dtype)

        def vec(key, n):
            return check_shape(ck, key, ck.get(key), (n,)).to(device=device, dtype=dtype)

        def projection(name, shape, width):
            # v2 always has both projections; v1 only where the width differs from d_model
            key = f"{prefix}.{name}.weight"
            if key in ck or width != D:
                return lin(need(ck, key), shape, proj_mode)
            return None

        self.in_proj = projection("input_proj", (D, cfg.input_dim), cfg.input_dim)
        self.out_proj = projection("output_proj", (cfg.output_dim, D), cfg.output_dim)
        self.layers = []
        for i in range(cfg.layers):
            p = f"{prefix}.transformer.layers.{i}"
            a = f"{p}.self_attn"
            layer = {
                "qkv": lin(
                    need(
                        ck, f"{a}.in_projs.0.weight", f"{a}.in_proj.weight", f"{a}.in_proj_weight"
                    ),
                    (3 * D, D),
                ),
                "o": lin(need(ck, f"{a}.out_projs.0.weight", f"{a}.out_proj.weight"), (D, D)),
                "fc1": lin(need(ck, f"{p}.linear1.weight", f"{p}.ffn.0.weight"), (F_, D)),
                "fc2": lin(need(ck, f"{p}.linear2.weight", f"{p}.ffn.2.weight"), (D, F_)),
            }
            for n in ("norm1", "norm2"):
                if cfg.norm == "layer_norm":
                    w = vec(need(ck, f"{p}.{n}.weight"), D)
                    b = vec(need(ck, f"{p}.{n}.bias"), D)
                else:
                    key = need(ck, f"{p}.{n}.alpha")
                    w, b = ck.get(key).reshape(-1).to(device=device, dtype=dtype), None
                    if cfg.norm == "rms_norm_f32":
                        w = w.float()
                layer[n] = Norm(cfg.norm, w, b)
            for n in ("layer_scale_1", "layer_scale_2"):
                layer[n] = vec(need(ck, f"{p}.{n}.scale"), D) if cfg.layer_scale else None
            self.layers.append(layer)
        self._rope: dict = {}
        self._mask: dict = {}

    def _rope_tables(self, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (T, str(device))
        if key not in self._rope:
            dh = self.cfg.d_model // self.cfg.heads
            half = torch.arange(dh // 2, device=device, dtype=torch.float32)
            freqs = torch.exp(half * (-math.log(self.cfg.max_period) * 2 / dh))
            ang = torch.arange(T, device=device, dtype=torch.float32)[:, None] * freqs
            self._rope = {key: (torch.cos(ang), torch.sin(ang))}  # one length at a time
        return self._rope[key]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dt = self.dtype
        x = x.to(dt)
        if self.in_proj is not None:
            x = self.in_proj(x).to(dt)
        B, T, D = x.shape
        cos, sin = self._rope_tables(T, x.device) if self.cfg.rope else (None, None)
        heads, attend, add_norm = layer_pieces(self.kernels)
        layers = self.layers
        h = layers[0]["norm1"](x) if layers else x
        for i, L in enumerate(layers):
            q, k, v = heads(L["qkv"](h).to(dt), cos, sin, self.cfg.heads, self.cfg.context)
            a = attend(q, k, v, self.cfg.context, self._mask, T)
            u = L["o"](a).to(dt)
            x, h = self._residual(add_norm, x, u, L["layer_scale_1"], L["norm2"])
            u = L["fc2"](F.gelu(L["fc1"](h).to(dt))).to(dt)
            following = layers[i + 1]["norm1"] if i + 1 < len(layers) else None
            x, h = self._residual(add_norm, x, u, L["layer_scale_2"], following)
        if self.out_proj is not None:
            x = self.out_proj(x).to(dt)
        return x

    @staticmethod
    def _residual(add_norm, x, u, scale, norm: Norm | None):
        """x + scale * u and the next norm of it (None after the last layer), fused where the
        norm is a LayerNorm."""
        if norm is not None and norm.kind == "layer_norm":
            return add_norm(x, u, scale, norm.w, norm.b, norm.eps)
        x = x + (u * scale if scale is not None else u)
        return x, (norm(x) if norm is not None else None)

    def linears(self):
        for p in (self.in_proj, self.out_proj):
            if p is not None:
                yield p
        for L in self.layers:
            yield from (L["qkv"], L["o"], L["fc1"], L["fc2"])


def patch_down(x: torch.Tensor, h: int) -> torch.Tensor:
    # [B, L, d] -> [B, L/h, d*h], channel d_idx*h + h_idx (the published channel order)
    B, L, d = x.shape
    return x.reshape(B, L // h, h, d).transpose(2, 3).reshape(B, L // h, d * h)


def patch_up(x: torch.Tensor, h: int) -> torch.Tensor:
    # [B, l, d*h] -> [B, l*h, d]
    B, n, dh = x.shape
    return x.reshape(B, n, dh // h, h).transpose(2, 3).reshape(B, n * h, dh // h)
