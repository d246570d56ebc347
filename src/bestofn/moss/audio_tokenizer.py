"""MOSS-Audio-Tokenizer (the 24 kHz codec of MOSS-TTS Delay): our own batched inference code.

The checkpoint is the published one (``OpenMOSS-Team/MOSS-Audio-Tokenizer``: ``config.json`` +
``*.safetensors``, fp32), read directly: no remote code. Facts used here, from the published
modelling code (OpenMOSS/MOSS-Audio-Tokenizer@56df9ee; a copy for parity tests lives in the
git-ignored ``.ref/moss_audio_tokenizer``):

- 24 kHz mono, ``downsample_rate`` 1920 samples per frame (12.5 frames/s), 32 residual
  quantizers (``quantizer_kwargs``: rlfq, 1024 codes of dim 8, ``rvq_dim`` 512, in/out 768).
- ``encoder_kwargs`` / ``decoder_kwargs``: lists of stages run in order, each a
  ``PatchedPretransform`` (fold ``patch_size`` time steps into channels, or back) or a
  ``Transformer`` (input/output Linear projections without bias when the width differs from
  ``d_model``; pre-norm layers with LayerNorm, fused q|k|v projection, interleaved RoPE,
  causal attention limited to ``int(frame_rate * causal_transformer_context_duration)``
  steps, GELU MLP without bias, per-channel layer scale on both branches).
- Quantizer weights use weight normalisation (1x1 convolutions with bias); decoding a code is
  ``out_proj(codebook[code])`` summed over quantizers, then ``output_proj``. Encoding picks the
  nearest L2-normalised codebook entry (rlfq) or the nearest entry (rvq) of the residual.

Decoding is causal and every clip starts at position 0, so right-padding a batch changes no
clip's samples: ``decode`` pads the clips of a call to one length (sorted by length, in chunks
of ``decode_batch_size``) and runs them at once on one device.

Precision (``compute_dtype``; ``weight_dtype`` only matters for ``fp8``):

- ``fp32``: as the published code runs by default; ``bf16``: weights and activations bf16
  (RoPE angles, code embeddings and the quantizer stay fp32).
- ``fp8``: the transformer layers' Linear weights stored float8_e4m3fn with one scale per
  output channel; activations quantized per row on the fly and multiplied with
  ``torch._scaled_mm`` (bf16 out); the stages' input/output projections, norms and attention
  stay bf16. Needs a CUDA GPU with fp8 matmuls (compute capability 8.9+); anywhere else it is
  refused with a message naming the option.
- ``weight_dtype: fp8`` with ``compute_dtype`` bf16/fp32: the same weights stored fp8 and
  upcast per layer (memory only; runs anywhere).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

DTYPES = ("fp32", "bf16", "fp8")
_TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16}
_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float8": "fp8"}
FP8_MAX = 448.0  # largest float8_e4m3fn


class AudioTokenizerError(ValueError):
    """A bad MOSS-Audio-Tokenizer checkpoint or option; the message names the file or option."""


def is_audio_tokenizer_config(cfg: dict) -> bool:
    """True for a MOSS-Audio-Tokenizer (v1, 24 kHz) ``config.json``: the stage lists and the
    quantizer section this module reads, at 24 kHz. (The 48 kHz v2 codec of MOSS-TTS-Local
    is another model, loaded through its remote code.)"""
    rate = cfg.get("sampling_rate", cfg.get("sample_rate"))
    return (
        isinstance(cfg.get("decoder_kwargs"), list)
        and isinstance(cfg.get("encoder_kwargs"), list)
        and isinstance(cfg.get("quantizer_kwargs"), dict)
        and rate is not None
        and int(rate) == 24000
        and not cfg.get("bestofn_stand_in")
    )


def canonical_dtype(value, option: str = "codec_compute_dtype") -> str:
    name = _ALIASES.get(str(value).removeprefix("torch."), str(value).removeprefix("torch."))
    if name not in DTYPES:
        raise AudioTokenizerError(f"{option} is {value!r}; known: {', '.join(DTYPES)}")
    return name


def fp8_matmul_problem(device) -> str | None:
    """None when ``device`` runs ``torch._scaled_mm`` with row-wise float8_e4m3fn scales; else
    why not (one line)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return f"device {str(device)!r} is not a CUDA GPU"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    cap = torch.cuda.get_device_capability(dev)
    if cap < (8, 9):
        name = torch.cuda.get_device_name(dev)
        return f"{name} (compute capability {cap[0]}.{cap[1]}) has no fp8 matmuls (needs 8.9+)"
    try:
        a = torch.randn(32, 64, device=dev)
        w = torch.randn(48, 64, device=dev)
        y = _Linear(w, "fp8", torch.bfloat16)(a)
        torch.cuda.synchronize(dev)
        if not torch.isfinite(y.float()).all():
            return "torch._scaled_mm gave non-finite values on a probe"
    except Exception as e:  # no kernel in this build / driver
        return f"torch._scaled_mm failed: {type(e).__name__}: {str(e).splitlines()[0]}"
    return None


# ---- config ------------------------------------------------------------------------------


@dataclass
class _StageCfg:
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


def _stages(cfg: dict, field: str, rate: float, down: bool, where: str):
    """Parse one stage list; returns (stages, frame rate after them)."""
    duration = cfg.get("causal_transformer_context_duration", 10.0)
    out = []
    for i, s in enumerate(cfg[field]):
        at = f"{where}: {field}[{i}]"
        kind = s.get("module_type")
        if kind == "PatchedPretransform":
            st = _StageCfg("patch", patch=int(s["patch_size"]))
            ratio = st.patch
        elif kind == "Transformer":
            for bad, ok in (("gating", "none"), ("weights_per_step", 0)):
                if s.get(bad, ok) not in (ok, None, False):
                    raise AudioTokenizerError(f"{at}: {bad}={s[bad]!r} is not supported")
            pos = s.get("positional_embedding", "sin")
            if pos not in ("rope", "none"):
                raise AudioTokenizerError(f"{at}: positional_embedding={pos!r} is not supported")
            if not s.get("causal", False):
                raise AudioTokenizerError(f"{at}: only causal transformers are supported")
            if not s.get("conv_layout", False):
                raise AudioTokenizerError(f"{at}: only conv_layout transformers are supported")
            norm = s.get("norm", "layer_norm")
            if norm not in ("layer_norm", "rms_norm", "rms_norm_f32"):
                raise AudioTokenizerError(f"{at}: norm={norm!r} is not supported")
            try:
                st = _StageCfg(
                    "transformer",
                    input_dim=int(s["input_dimension"]),
                    output_dim=int(s["output_dimension"]),
                    d_model=int(s["d_model"]),
                    heads=int(s["num_heads"]),
                    layers=int(s["num_layers"]),
                    ff=int(s.get("dim_feedforward", 2048)),
                    context=int(rate * duration),
                    norm=norm,
                    rope=pos == "rope",
                    max_period=float(s.get("max_period", 10000)),
                    layer_scale=s.get("layer_scale") is not None,
                )
            except KeyError as e:
                raise AudioTokenizerError(f"{at}: missing field {e.args[0]!r}") from None
            if st.d_model % st.heads or (st.d_model // st.heads) % 2:
                raise AudioTokenizerError(f"{at}: d_model/num_heads must be an even integer")
            ratio = 1
        else:
            raise AudioTokenizerError(f"{at}: unknown module_type {kind!r}")
        out.append(st)
        rate = rate / ratio if down else rate * ratio
    return out, rate


@dataclass
class AudioTokenizerConfig:
    sampling_rate: int
    downsample_rate: int
    num_quantizers: int
    codebook_size: int
    codebook_dim: int
    rvq_dim: int
    quantizer_input_dim: int
    quantizer_output_dim: int
    normalized_codes: bool  # rlfq: nearest L2-normalised entry; rvq: nearest entry
    encoder: list
    decoder: list

    @classmethod
    def from_dict(cls, cfg: dict, where: str = "config.json") -> AudioTokenizerConfig:
        try:
            q = cfg["quantizer_kwargs"]
            rate = int(cfg.get("sampling_rate", cfg.get("sample_rate", 24000)))
            down = int(cfg.get("downsample_rate", 1920))
            qtype = q.get("quantizer_type", cfg.get("quantizer_type", "rlfq"))
            if qtype not in ("rlfq", "random_prefix_rlfq", "rvq", "spec_rvq"):
                raise AudioTokenizerError(f"{where}: quantizer_type {qtype!r} is not supported")
            qin = int(q.get("input_dim", 1024))
            rvq = int(q.get("rvq_dim") or qin)
            encoder, frame_rate = _stages(cfg, "encoder_kwargs", float(rate), True, where)
            decoder, _ = _stages(cfg, "decoder_kwargs", frame_rate, False, where)
            c = cls(
                sampling_rate=rate,
                downsample_rate=down,
                num_quantizers=int(q.get("num_quantizers", 32)),
                codebook_size=int(q.get("codebook_size", 1024)),
                codebook_dim=int(q.get("codebook_dim", 8)),
                rvq_dim=rvq,
                quantizer_input_dim=qin,
                quantizer_output_dim=int(q.get("output_dim") or qin),
                normalized_codes=qtype in ("rlfq", "random_prefix_rlfq"),
                encoder=encoder,
                decoder=decoder,
            )
        except KeyError as e:
            raise AudioTokenizerError(f"{where}: missing field {e.args[0]!r}") from None
        hop = math.prod(s.patch for s in c.decoder)
        if hop != down or math.prod(s.patch for s in c.encoder) != down:
            raise AudioTokenizerError(
                f"{where}: the patch sizes multiply to {hop}, not downsample_rate = {down}"
            )
        return c

    @property
    def frame_rate(self) -> float:
        return self.sampling_rate / self.downsample_rate


def read_config(codec_dir) -> tuple[dict, AudioTokenizerConfig]:
    path = Path(codec_dir) / "config.json"
    if not path.is_file():
        raise AudioTokenizerError(f"{path} not found (config field: codec_dir)")
    try:
        raw = json.loads(path.read_text())
    except ValueError as e:
        raise AudioTokenizerError(f"{path}: not JSON ({e})") from None
    return raw, AudioTokenizerConfig.from_dict(raw, str(path))


# ---- checkpoint --------------------------------------------------------------------------


class _Checkpoint:
    """Name -> tensor over the safetensors files of a checkpoint directory (read lazily)."""

    def __init__(self, codec_dir: Path):
        from safetensors import safe_open

        self._safe_open = safe_open
        index = codec_dir / "model.safetensors.index.json"
        if index.is_file():
            files = sorted(
                {codec_dir / f for f in json.loads(index.read_text())["weight_map"].values()}
            )
        else:
            files = sorted(codec_dir.glob("*.safetensors"))
        if not files:
            raise AudioTokenizerError(f"no *.safetensors in {codec_dir} (config field: codec_dir)")
        self.where: dict[str, Path] = {}
        for f in files:
            if not f.is_file():
                raise AudioTokenizerError(f"{f} (listed in {index}) not found")
            with safe_open(str(f), framework="pt") as sf:
                for k in sf.keys():
                    self.where[k] = f
        self.files = files
        self._open: dict = {}

    def __contains__(self, key: str) -> bool:
        return key in self.where

    def get(self, key: str) -> torch.Tensor:
        f = self.where[key]
        if f not in self._open:
            self._open[f] = self._safe_open(str(f), framework="pt")
        return self._open[f].get_tensor(key).float()

    def describe(self) -> str:
        return ", ".join(str(f) for f in self.files)

    def close(self) -> None:
        self._open.clear()


def _need(ck: _Checkpoint, *names: str) -> str:
    """The first of ``names`` present in the checkpoint, else an error naming the files."""
    for n in names:
        if n in ck:
            return n
    raise AudioTokenizerError(
        f"MOSS-Audio-Tokenizer checkpoint {ck.describe()}: missing tensor {names[0]!r}"
    )


def _weight_normed(ck: _Checkpoint, prefix: str) -> torch.Tensor:
    """A weight-normalised 1x1 conv's weight [out, in] (g * v / |v|, norm over dims 1..)."""
    if prefix + ".weight" in ck:
        w = ck.get(prefix + ".weight")
    else:
        g = ck.get(_need(ck, prefix + ".parametrizations.weight.original0", prefix + ".weight_g"))
        v = ck.get(_need(ck, prefix + ".parametrizations.weight.original1", prefix + ".weight_v"))
        w = g * v / v.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (v.dim() - 1)))
    return w.reshape(w.shape[0], -1)


def _shape(ck: _Checkpoint, key: str, t: torch.Tensor, shape: tuple) -> torch.Tensor:
    if tuple(t.shape) != tuple(shape):
        where = ck.where.get(key) or ck.where.get(key + ".bias") or ck.describe()
        raise AudioTokenizerError(
            f"MOSS-Audio-Tokenizer checkpoint {where}: {key} has shape "
            f"{tuple(t.shape)}, config.json says {tuple(shape)}"
        )
    return t


# ---- layers ------------------------------------------------------------------------------


class _Linear:
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


class _Norm:
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


class _Transformer:
    """One ``Transformer`` stage, channel-last: [B, T, input_dim] -> [B, T, output_dim]."""

    def __init__(self, cfg: _StageCfg, ck: _Checkpoint, prefix: str, mode, dtype, device):
        self.cfg, self.dtype = cfg, dtype
        D, F_ = cfg.d_model, cfg.ff
        # fp8 inside the layers only: the stage's input/output projections (a small share of
        # the work, next to the code embeddings and the samples) stay in `dtype`; on random
        # weights at real shapes that lifts fp8's SNR against fp32 from ~21 to ~41 dB
        proj_mode = "dense" if mode in ("fp8", "fp8-upcast") else mode

        def lin(key, shape, lin_mode=mode):
            return _Linear(_shape(ck, key, ck.get(key), shape).to(device), lin_mode, dtype)

        def vec(key, n):
            return _shape(ck, key, ck.get(key), (n,)).to(device=device, dtype=dtype)

        self.in_proj = self.out_proj = None
        if cfg.input_dim != D:
            key = _need(ck, f"{prefix}.input_proj.weight")
            self.in_proj = lin(key, (D, cfg.input_dim), proj_mode)
        if cfg.output_dim != D:
            key = _need(ck, f"{prefix}.output_proj.weight")
            self.out_proj = lin(key, (cfg.output_dim, D), proj_mode)
        self.layers = []
        for i in range(cfg.layers):
            p = f"{prefix}.transformer.layers.{i}"
            layer = {
                "qkv": lin(
                    _need(
                        ck,
                        f"{p}.self_attn.in_projs.0.weight",
                        f"{p}.self_attn.in_proj.weight",
                        f"{p}.self_attn.in_proj_weight",
                    ),
                    (3 * D, D),
                ),
                "o": lin(
                    _need(
                        ck, f"{p}.self_attn.out_projs.0.weight", f"{p}.self_attn.out_proj.weight"
                    ),
                    (D, D),
                ),
                "fc1": lin(_need(ck, f"{p}.linear1.weight"), (F_, D)),
                "fc2": lin(_need(ck, f"{p}.linear2.weight"), (D, F_)),
            }
            for n in ("norm1", "norm2"):
                if cfg.norm == "layer_norm":
                    w = vec(_need(ck, f"{p}.{n}.weight"), D)
                    b = vec(_need(ck, f"{p}.{n}.bias"), D)
                else:
                    key = _need(ck, f"{p}.{n}.alpha")
                    w, b = ck.get(key).reshape(-1).to(device=device, dtype=dtype), None
                    if cfg.norm == "rms_norm_f32":
                        w = w.float()
                layer[n] = _Norm(cfg.norm, w, b)
            for n in ("layer_scale_1", "layer_scale_2"):
                layer[n] = vec(_need(ck, f"{p}.{n}.scale"), D) if cfg.layer_scale else None
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

    def _attn_mask(self, T: int, device):
        """None: plain causal (the window covers every step); else a [T, T] bool mask."""
        if self.cfg.context is None or self.cfg.context >= T:
            return None
        key = (T, str(device))
        if key not in self._mask:
            i = torch.arange(T, device=device)
            delta = i[:, None] - i[None, :]
            self._mask = {key: (delta >= 0) & (delta < self.cfg.context)}
        return self._mask[key]

    def _rotate(self, x, cos, sin):
        # interleaved pairs (x[2j], x[2j+1]), angles in float32, as the published code
        pairs = x.unflatten(-1, (-1, 2)).float()
        a, b = pairs[..., 0], pairs[..., 1]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
        return out.flatten(-2).to(x.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.dtype)
        if self.in_proj is not None:
            x = self.in_proj(x).to(self.dtype)
        B, T, D = x.shape
        H = self.cfg.heads
        mask = self._attn_mask(T, x.device)
        cos, sin = self._rope_tables(T, x.device) if self.cfg.rope else (None, None)
        for L in self.layers:
            h = L["norm1"](x)
            q, k, v = L["qkv"](h).to(self.dtype).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
            if cos is not None:
                q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            if mask is None:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            u = L["o"](a.transpose(1, 2).reshape(B, T, D)).to(self.dtype)
            x = x + (u * L["layer_scale_1"] if L["layer_scale_1"] is not None else u)
            h = L["norm2"](x)
            u = L["fc2"](F.gelu(L["fc1"](h).to(self.dtype))).to(self.dtype)
            x = x + (u * L["layer_scale_2"] if L["layer_scale_2"] is not None else u)
        if self.out_proj is not None:
            x = self.out_proj(x).to(self.dtype)
        return x

    def linears(self):
        for p in (self.in_proj, self.out_proj):
            if p is not None:
                yield p
        for L in self.layers:
            yield from (L["qkv"], L["o"], L["fc1"], L["fc2"])


def _patch_down(x: torch.Tensor, h: int) -> torch.Tensor:
    # [B, L, d] -> [B, L/h, d*h], channel d_idx*h + h_idx (the published channel order)
    B, L, d = x.shape
    return x.reshape(B, L // h, h, d).transpose(2, 3).reshape(B, L // h, d * h)


def _patch_up(x: torch.Tensor, h: int) -> torch.Tensor:
    # [B, l, d*h] -> [B, l*h, d]
    B, n, dh = x.shape
    return x.reshape(B, n, dh // h, h).transpose(2, 3).reshape(B, n * h, dh // h)


# ---- the codec ---------------------------------------------------------------------------


class MossAudioTokenizer:
    """MOSS-Audio-Tokenizer decode/encode, batched on one device (implements ``Codec``).

    ``n_vq``: codebooks decoded/encoded (default all); ``compute_dtype``/``weight_dtype``: see
    the module docstring; ``decode_batch_size``: clips per forward pass. The encoder's weights
    are read on the first ``encode`` (a decode-only worker never holds them).
    """

    channels = 1

    def __init__(
        self,
        codec_dir,
        device: str = "cpu",
        compute_dtype: str = "bf16",
        weight_dtype: str | None = None,
        n_vq: int | None = None,
        decode_batch_size: int = 64,
    ):
        self.codec_dir = Path(codec_dir).expanduser()
        self.raw_config, self.config = read_config(self.codec_dir)
        c = self.config
        self.sample_rate = c.sampling_rate
        self.hop = c.downsample_rate
        self.n_vq = c.num_quantizers if n_vq is None else int(n_vq)
        if not 1 <= self.n_vq <= c.num_quantizers:
            raise AudioTokenizerError(
                f"n_vq = {self.n_vq}, but {self.codec_dir / 'config.json'} has "
                f"num_quantizers = {c.num_quantizers}"
            )
        self.device = torch.device(device)
        self.decode_batch_size = max(1, int(decode_batch_size))
        compute = canonical_dtype(compute_dtype, "codec_compute_dtype")
        weights = canonical_dtype(weight_dtype or compute, "codec_weight_dtype")
        if compute == "fp8":
            why = fp8_matmul_problem(self.device)
            if why is not None:
                raise AudioTokenizerError(
                    f"codec_compute_dtype: fp8 needs a CUDA GPU with fp8 matmuls (compute "
                    f"capability 8.9+, e.g. H100/H200/L40S): {why}. Use codec_compute_dtype: "
                    "bf16 (or fp32); codec_weight_dtype: fp8 with codec_compute_dtype: bf16 "
                    "keeps fp8-stored weights, upcast per layer, on any device"
                )
            self.mode, self.dtype = "fp8", torch.bfloat16
        else:
            from bestofn.dtypes import resolve_dtype

            name = _TORCH[compute]
            if name != torch.float32:
                ops = ("linear", "attention", "layer_norm", "embedding")
                name = getattr(
                    torch, resolve_dtype("moss-audio-tokenizer", device, name, ops, "cast")
                )
            self.dtype = name
            self.mode = "fp8-upcast" if weights == "fp8" else "dense"
        self.compute_dtype, self.weight_dtype = compute, ("fp8" if compute == "fp8" else weights)
        self._ck = _Checkpoint(self.codec_dir)
        self._check_keys()
        self._load_quantizer()
        self.decoder = [
            _Transformer(s, self._ck, f"decoder.{i}", self.mode, self.dtype, self.device)
            if s.kind == "transformer"
            else s.patch
            for i, s in enumerate(c.decoder)
        ]
        self.encoder = None

    # ---- loading ----

    def _check_keys(self) -> None:
        """Every stage's first weight present and shaped right, before reading the rest."""
        ck, c = self._ck, self.config
        q = "quantizer.quantizers"
        for i in range(c.num_quantizers):
            key = f"{q}.{i}.codebook.weight"
            _shape(ck, _need(ck, key), ck.get(key), (c.codebook_size, c.codebook_dim))
        for part, stages in (("encoder", c.encoder), ("decoder", c.decoder)):
            for i, s in enumerate(stages):
                if s.kind == "transformer" and s.layers:
                    _need(ck, f"{part}.{i}.transformer.layers.{s.layers - 1}.linear2.weight")

    def _load_quantizer(self) -> None:
        """Decode tables: table[i, c] = output_proj(out_proj_i(codebook_i[c])) without the
        output bias, so decoding n codebooks is a sum of n gathered rows (+ bias); fp32."""
        ck, c = self._ck, self.config
        tables = []
        out_w = out_b = None
        if c.rvq_dim != c.quantizer_output_dim:
            out_w = _weight_normed(ck, "quantizer.output_proj")
            out_w = _shape(ck, "quantizer.output_proj", out_w, (c.quantizer_output_dim, c.rvq_dim))
            out_b = ck.get(_need(ck, "quantizer.output_proj.bias"))
        for i in range(c.num_quantizers):
            p = f"quantizer.quantizers.{i}"
            e = ck.get(f"{p}.codebook.weight")
            if c.codebook_dim != c.rvq_dim:
                w = _weight_normed(ck, f"{p}.out_proj")
                e = e @ _shape(ck, f"{p}.out_proj", w, (c.rvq_dim, c.codebook_dim)).T
                e = e + ck.get(_need(ck, f"{p}.out_proj.bias"))
            tables.append(e @ out_w.T if out_w is not None else e)
        self._tables = torch.cat(tables[: self.n_vq]).to(self.device)  # [n_vq * size, out]
        self._out_bias = (
            out_b.to(self.device)
            if out_b is not None
            else torch.zeros(tables[0].shape[1], device=self.device)
        )
        self._offsets = torch.arange(self.n_vq, device=self.device) * c.codebook_size

    def _load_encoder(self) -> None:
        ck, c = self._ck, self.config
        enc_dtype = torch.bfloat16 if self.mode == "fp8" else self.dtype
        self.encoder = [
            _Transformer(s, ck, f"encoder.{i}", "dense", enc_dtype, self.device)
            if s.kind == "transformer"
            else s.patch
            for i, s in enumerate(c.encoder)
        ]
        in_w = None
        if c.quantizer_input_dim != c.rvq_dim:
            in_w = _weight_normed(ck, "quantizer.input_proj")
            in_w = (in_w.to(self.device), ck.get("quantizer.input_proj.bias").to(self.device))
        qs = []
        for i in range(self.n_vq):
            p = f"quantizer.quantizers.{i}"
            e = ck.get(f"{p}.codebook.weight").to(self.device)
            proj_in = proj_out = None
            if c.codebook_dim != c.rvq_dim:
                proj_in = (
                    _weight_normed(ck, f"{p}.in_proj").to(self.device),
                    ck.get(f"{p}.in_proj.bias").to(self.device),
                )
                proj_out = (
                    _weight_normed(ck, f"{p}.out_proj").to(self.device),
                    ck.get(f"{p}.out_proj.bias").to(self.device),
                )
            qs.append((e, proj_in, proj_out))
        self._enc_quant = (in_w, qs)

    def weight_bytes(self) -> int:
        """Bytes of the decode weights on the device (decoder Linear weights + code tables)."""
        n = self._tables.numel() * 4
        for s in self.decoder:
            if isinstance(s, _Transformer):
                n += sum(lin.nbytes for lin in s.linears())
        return n

    # ---- decode ----

    @torch.inference_mode()
    def decode_padded(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, T, >= n_vq] (right-padded with any valid code) -> audio [B, T * hop] fp32
        on the device; sample ``t * hop + j`` depends only on frames ``<= t``."""
        codes = codes[..., : self.n_vq].to(self.device, torch.long)
        B, T, n = codes.shape
        if n < self.n_vq:
            raise AudioTokenizerError(
                f"codes have {n} codebooks, the codec decodes n_vq = {self.n_vq}"
            )
        size = self.config.codebook_size
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= size):
            raise AudioTokenizerError(
                f"codes outside 0..{size - 1} (codebook_size in {self.codec_dir / 'config.json'})"
            )
        flat = (codes + self._offsets).reshape(B * T, n)
        x = F.embedding_bag(flat, self._tables, mode="sum") + self._out_bias
        x = x.view(B, T, -1)
        for stage in self.decoder:
            x = stage(x) if isinstance(stage, _Transformer) else _patch_up(x, stage)
        return x.reshape(B, -1).float()

    def decode(self, codes: list[torch.Tensor]) -> list[np.ndarray]:
        """Code sequences [T_i, n_vq] -> float32 audio (T_i * hop, 1), batched by length."""
        out: list[np.ndarray] = [np.zeros((0, 1), np.float32)] * len(codes)
        todo = sorted(
            (i for i, c in enumerate(codes) if c.shape[0] > 0), key=lambda i: codes[i].shape[0]
        )
        for start in range(0, len(todo), self.decode_batch_size):
            idx = todo[start : start + self.decode_batch_size]
            T = max(int(codes[i].shape[0]) for i in idx)
            grid = torch.zeros(len(idx), T, self.n_vq, dtype=torch.long)
            for b, i in enumerate(idx):
                c = torch.as_tensor(codes[i])
                if c.dim() != 2 or c.shape[1] < self.n_vq:
                    raise AudioTokenizerError(
                        f"clip {i}: codes of shape {tuple(c.shape)}; expected [T, {self.n_vq}]"
                    )
                grid[b, : c.shape[0]] = c[:, : self.n_vq]
            audio = self.decode_padded(grid).cpu().numpy()
            for b, i in enumerate(idx):
                n = int(codes[i].shape[0]) * self.hop
                out[i] = np.ascontiguousarray(audio[b, :n, None])
        return out

    # ---- encode ----

    @torch.inference_mode()
    def encode_padded(
        self, wav: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """wav [B, S] at the codec rate (right-padded), lengths [B] samples -> (codes
        [B, T, n_vq], code lengths [B]) as the published batch_encode computes them."""
        if self.encoder is None:
            self._load_encoder()
        c = self.config
        wav = wav.to(self.device, torch.float32)
        lengths = lengths.to(self.device)
        S = wav.shape[1]
        if S % self.hop:
            wav = F.pad(wav, (0, self.hop - S % self.hop))
        x = wav[:, :, None]
        for stage in self.encoder:
            if isinstance(stage, _Transformer):
                x = stage(x)
            else:
                x = _patch_down(x, stage)
                lengths = lengths // stage
        z = x.float()
        B, T, _ = z.shape
        in_w, qs = self._enc_quant
        if in_w is not None:
            z = F.linear(z, *in_w)
        mask = (torch.arange(T, device=z.device)[None, :] < lengths[:, None])[..., None]
        residual = z
        codes = []
        for e, proj_in, proj_out in qs:
            r = residual * mask
            ze = F.linear(r, *proj_in) if proj_in is not None else r
            flat, cb = ze.reshape(-1, ze.shape[-1]), e
            if c.normalized_codes:
                flat, cb = F.normalize(flat), F.normalize(cb)
            dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ cb.T + cb.pow(2).sum(1)[None, :]
            idx = dist.argmin(dim=1).view(B, T)
            zq = F.embedding(idx, e)
            if proj_out is not None:
                zq = F.linear(zq, *proj_out)
            residual = residual - zq * mask
            codes.append(idx)
        return torch.stack(codes, dim=-1), lengths

    def encode(self, audio: np.ndarray, sample_rate: int) -> torch.Tensor:
        """One clip (S,) or (S, channels) at ``sample_rate`` -> codes [T, n_vq] (long, cpu): mono
        (channel mean), resampled to 24 kHz, loudness-normalised as the reference processor."""
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim == 2:
            audio = audio.mean(axis=1)
        if sample_rate != self.sample_rate:
            import soxr

            audio = soxr.resample(audio, sample_rate, self.sample_rate).astype(np.float32)
        wav = torch.from_numpy(np.ascontiguousarray(audio))
        dbfs = 10.0 * torch.log10(wav.pow(2).mean() + 1e-9)
        wav = wav * 10.0 ** (float(torch.clamp(-20.0 - dbfs, -3.0, 3.0)) / 20.0)
        codes, lengths = self.encode_padded(wav[None], torch.tensor([wav.shape[0]]))
        return codes[0, : int(lengths[0])].cpu().long()

    def close(self) -> None:
        self._ck.close()
