"""Production restorer: Sidon (sarulab-speech), 16 kHz in -> 48 kHz out.

Sidon is two networks (facts and sources: .ref/notes/sidon-parakeet-facts.md):

    16 kHz audio --SeamlessM4T log-mel (80 bins, 100 Hz, stacked by 2: 160 dims at 50 Hz)-->
    feature cleanser: the first 8 layers of w2v-BERT 2.0 with a LoRA (r=64, alpha=16) on every
    ffn{1,2}.output_dense, merged into the weights once here  --> features [T, 1024] at 50 Hz
    --> DAC-style decoder (input 1024, channels 1536, rates 8*5*4*3*2 = 960) --> 48 kHz, tanh.

Weights are the "raw" release layout (``sarulab-speech/sidon_raw_weight`` + the
``facebook/w2v-bert-2.0`` base), read from local directories named in config:

    w2v_bert_dir/   config.json, model.safetensors (or pytorch_model.bin)   -> base encoder
    adapter_dir/    adapter_config.json, adapter_model.safetensors (peft LoRA),
                    decoder_state_dict.pt (DAC Decoder state dict, weight-norm g/v pairs)

Any other layout (e.g. the TorchScript ``sidon-v0.1`` export) is refused with an error that
says what was expected. With ``cache_dir`` set, the merged 8-layer cleanser is written once
as safetensors (keyed by content hashes) and later workers load it without the 2.3 GB base.

Batching: takes are resampled to 16 kHz mono, each gets ``tail_pad_s`` of silence (the
decoder's receptive field past a take's end then lies in that silence, so a take restores the
same alone or in any batch), the batch is padded with an attention mask, and each output is
trimmed to exactly ``round(len * 48000 / sr_in)`` frames of its input.

Resampling to 16 kHz (``resample``): ``soxr`` on the host (the CPU default), or ``torch``: the
takes go to the device once, as generated, and are downmixed and resampled there
(``bestofn.backends.resample.resample_torch``, within 4e-7 of soxr HQ below 0.8 x Nyquist);
``auto`` is torch on CUDA. ``compile`` runs the encoder and decoder through ``torch.compile``
(CUDA; dynamic shapes). ``bucket_s`` pads each batch's length up to a multiple of that many
seconds, so compiled kernels and cuDNN plans see few distinct shapes (the tail padding keeps
a take's output the same at any padded length).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bestofn.audio import mono_at
from bestofn.backends.base import Restorer
from bestofn.backends.resample import out_length, resample_torch
from bestofn.dtypes import resolve_dtype
from bestofn.hashing import file_sha256

log = logging.getLogger(__name__)

INPUT_SAMPLE_RATE = 16000
OUTPUT_SAMPLE_RATE = 48000
N_LAYERS = 8  # Sidon keeps the first 8 of w2v-BERT 2.0's 24 layers
DECODER_CHANNELS = 1536
DECODER_RATES = (8, 5, 4, 3, 2)  # product 960 = 48000 / 50 Hz
LORA_TARGET = "output_dense"  # ffn1.output_dense and ffn2.output_dense of each layer
MERGE_VERSION = "1"  # part of the merged-cache key: bump when the merge changes
_PEFT_PREFIX = "base_model.model."
# What runs under autocast: the w2v-BERT conformer layers and the DAC-style decoder.
AUTOCAST_OPS = (
    "linear",
    "depthwise_conv1d",
    "conv1d",
    "conv_transpose1d",
    "layer_norm",
    "attention",
)


class SidonLoadError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# front end: SeamlessM4T log-mel features, computed in torch (on the GPU) for a padded batch.
# Same arithmetic as transformers' SeamlessM4TFeatureExtractor (Kaldi-style fbank): frames of
# 400 samples every 160, DC offset removed, pre-emphasis 0.97, Povey window, |rFFT(512)|^2,
# Kaldi mel bank (80 bins, 20 Hz..8 kHz), log with floor 1.19e-7, per-take per-bin mean/var
# normalisation, then two frames stacked into one 160-dim vector at 50 Hz.


class SeamlessFbank(nn.Module):
    frame_length, hop_length, n_fft, stride = 400, 160, 512, 2
    preemphasis, mel_floor = 0.97, 1.192092955078125e-07

    def __init__(self):
        super().__init__()
        from transformers import SeamlessM4TFeatureExtractor

        # Take the window and mel bank from transformers itself, so constants cannot drift.
        ref = SeamlessM4TFeatureExtractor()
        self.register_buffer("window", torch.tensor(ref.window, dtype=torch.float32), False)
        self.register_buffer("mel", torch.tensor(ref.mel_filters, dtype=torch.float32), False)

    def n_frames(self, n_samples: torch.Tensor) -> torch.Tensor:
        return torch.clamp((n_samples - self.frame_length) // self.hop_length + 1, min=0)

    @torch.autocast("cuda", enabled=False)
    @torch.autocast("cpu", enabled=False)
    def forward(self, wav: torch.Tensor, lengths: torch.Tensor):
        """wav: (B, N) float32 at 16 kHz, zero padded; lengths: (B,) valid samples.
        Returns input_features (B, T, 160) and attention_mask (B, T) as the extractor does."""
        x = wav.float() * 32768.0  # the extractor works on 16-bit integer scale
        frames = x.unfold(-1, self.frame_length, self.hop_length)  # (B, F, 400)
        frames = frames - frames.mean(-1, keepdim=True)
        frames = torch.cat(
            [
                frames[..., :1] * (1 - self.preemphasis),
                frames[..., 1:] - self.preemphasis * frames[..., :-1],
            ],
            dim=-1,
        )
        spec = torch.fft.rfft(frames * self.window, n=self.n_fft).abs().pow(2)  # (B, F, 257)
        feats = torch.log(torch.clamp(spec @ self.mel, min=self.mel_floor))  # (B, F, 80)

        n = self.n_frames(lengths)  # valid frames per take
        valid = torch.arange(feats.shape[1], device=feats.device)[None, :] < n[:, None]
        m = valid.unsqueeze(-1).float()
        count = n.clamp(min=2).float()[:, None, None]
        mean = (feats * m).sum(1, keepdim=True) / count
        var = (((feats - mean) * m) ** 2).sum(1, keepdim=True) / (count - 1)  # ddof=1
        feats = ((feats - mean) / torch.sqrt(var + 1e-7)) * m  # padding frames are 0

        # pad to a multiple of `stride` frames, then stack pairs of frames
        if feats.shape[1] % self.stride:
            feats = nn.functional.pad(feats, (0, 0, 0, self.stride - feats.shape[1] % self.stride))
            valid = nn.functional.pad(valid, (0, self.stride - valid.shape[1] % self.stride))
        b, f, c = feats.shape
        feats = feats.reshape(b, f // self.stride, c * self.stride)
        attention_mask = valid[:, 1 :: self.stride]  # a stacked frame is valid if its 2nd is
        return feats, attention_mask.long()


# ---------------------------------------------------------------------------------------------
# decoder: the DAC Decoder layout (descript-audio-codec, dac.model.dac.Decoder), written out
# here with plain convolutions so the weight norm is folded once at load and the package (and
# its audiotools dependency tree) is not needed. Parameter names match DAC's state dict.


class Snake1d(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x):
        if x.is_cuda and snake_fused():
            try:
                return fused_snake(x, self.alpha)
            except Exception as e:  # e.g. a GPU Triton cannot compile for
                _fused_failed(e)
        # x + sin^2(alpha x) / alpha, with DAC's 1e-9 guard
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


# Snake on CUDA in one pass. Eagerly it is five elementwise kernels over the decoder's largest
# tensors (48 channels at 48 kHz), each reading and writing the whole tensor, in float32 (the
# float32 alpha promotes the autocast conv output). Every Snake feeds a convolution, which
# under autocast reads it in the autocast dtype: the fused kernel computes the same float32
# sequence and writes that dtype directly. BESTOFN_SIDON_SNAKE=eager|fused|auto (auto: fused
# where Triton imports) or set_snake().
#
# On CUDA, torch runs a convolution's bias as a separate broadcast add over the output
# (cuDNN computes the convolution without it): 37 such adds per decoder pass, 20 % of Sidon's
# GPU time once Snake was fused (H200 profile, call H). Where Snake runs fused, the decoder
# therefore calls its convolutions without bias and hands the bias to the kernel that reads
# the output next: a Snake, or a residual unit's sum. The kernels round conv + bias to the
# conv's output dtype first, as the separate add does, so the output is bit for bit the same.
#
# The layout (default channels_last): a 1-D convolution on [B, C, T] makes cuDNN transpose
# its input to NHWC and its output back, around kernels that work in NHWC (15 % of Sidon's GPU
# time). Channels last, the decoder keeps [B, C, 1, T] tensors stored as [B, T, C] from its
# input (the encoder's output, transposed, is that layout already) to its output, and runs the
# equal 2-D convolutions. cuDNN then picks other kernels, so the output differs from nchw's in
# the last fp16 bits (max |diff| 4.9e-4 on an H200, call A); nchw is bit for bit eager.
_SNAKE = {
    "mode": os.environ.get("BESTOFN_SIDON_SNAKE", "auto"),
    "kernel": None,
    "fuse_bias": True,  # False: Snake alone fused (kept for side-by-side benchmarks)
    "layout": "channels_last",  # or nchw: BESTOFN_SIDON_LAYOUT, set_layout()
}
_LAYOUTS = ("nchw", "channels_last")


def set_snake(mode: str) -> None:
    if mode not in ("auto", "fused", "eager"):
        raise ValueError(f"sidon: snake must be auto, fused or eager; got {mode!r}")
    _SNAKE["mode"] = mode


def set_layout(layout: str) -> None:
    """The fused decoder's activation layout: nchw ([B, C, T], as eager) or channels_last."""
    if layout not in _LAYOUTS:
        raise ValueError(f"sidon: layout must be one of {', '.join(_LAYOUTS)}; got {layout!r}")
    _SNAKE["layout"] = layout


try:
    set_layout(os.environ.get("BESTOFN_SIDON_LAYOUT", "channels_last"))
except ValueError as e:
    raise ValueError(f"{e} (environment variable BESTOFN_SIDON_LAYOUT)") from None
DEFAULT_LAYOUT = _SNAKE["layout"]  # this process's default (after BESTOFN_SIDON_LAYOUT)


def decoder_kernels(device: str) -> str:
    """Which decoder code a restorer on ``device`` runs (it changes the output's last bits:
    channels last uses other cuDNN kernels), for provenance."""
    if not str(device).startswith("cuda") or not snake_fused():
        return "eager"
    if not _SNAKE["fuse_bias"]:
        return "fused snake"
    return f"fused snake + conv bias, {_SNAKE['layout']}"


def snake_fused() -> bool:
    mode = _SNAKE["mode"]
    if mode == "eager":
        return False
    if _SNAKE["kernel"] is None:
        try:
            _SNAKE["kernel"] = _snake_kernels()
        except ImportError as e:
            if mode == "fused":
                raise RuntimeError(f"sidon: snake=fused needs Triton ({e})") from e
            _SNAKE["kernel"] = False
    return bool(_SNAKE["kernel"])


def _fused_failed(e: Exception) -> None:
    """The fused kernels failed here (e.g. a GPU Triton cannot compile for): raise under
    snake=fused, else warn and use the eager ops from now on."""
    if _SNAKE["mode"] == "fused":
        raise e
    log.warning("sidon: fused Snake failed here (%s); eager Snake from now on", e)
    _SNAKE["kernel"] = False


def _snake_kernels() -> dict:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    # Both kernels read [B, C, T] (one program row per batch x channel, blocks along T) or,
    # with CL, channels last ([B, C, 1, T] stored as [B, T, C]; T is then the element count
    # and the channel is the fastest index). A bias is rounded to the tensor's dtype, and
    # tensor + bias rounded again, as autocast and torch's separate bias add round them.

    @triton.jit
    def snake(x_ptr, bias_ptr, alpha_ptr, y_ptr, T, C, HAS_BIAS: tl.constexpr,
              CL: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        if CL:
            offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < T
            channel = offsets % C
            a = tl.load(alpha_ptr + channel, mask=mask, other=1.0).to(tl.float32)
            b = tl.load(bias_ptr + channel, mask=mask, other=0.0)
        else:
            row = tl.program_id(0)  # batch * C + channel
            cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            mask = cols < T
            offsets = row.to(tl.int64) * T + cols
            a = tl.load(alpha_ptr + row % C).to(tl.float32)
            b = tl.load(bias_ptr + row % C)
        x = tl.load(x_ptr + offsets, mask=mask)
        if HAS_BIAS:
            x = (x.to(tl.float32) + b.to(x.dtype).to(tl.float32)).to(x.dtype)
        x = x.to(tl.float32)
        s = libdevice.sin(a * x)  # CUDA's sinf, as torch.sin; not sin.approx
        y = x + libdevice.div_rn(1.0, a + 1e-9) * (s * s)
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def residual(x_ptr, xb_ptr, c_ptr, cb_ptr, y_ptr, T, C, X_BIAS: tl.constexpr,
                 CL: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        if CL:
            offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < T
            channel = offsets % C
            xb = tl.load(xb_ptr + channel, mask=mask, other=0.0)
            cb = tl.load(cb_ptr + channel, mask=mask, other=0.0)
        else:
            row = tl.program_id(0)
            cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            mask = cols < T
            offsets = row.to(tl.int64) * T + cols
            xb = tl.load(xb_ptr + row % C)
            cb = tl.load(cb_ptr + row % C)
        x = tl.load(x_ptr + offsets, mask=mask)
        if X_BIAS:
            x = (x.to(tl.float32) + xb.to(x.dtype).to(tl.float32)).to(x.dtype)
        c = tl.load(c_ptr + offsets, mask=mask)
        c = (c.to(tl.float32) + cb.to(c.dtype).to(tl.float32)).to(c.dtype)
        y = x.to(tl.float32) + c.to(tl.float32)
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)

    return {"snake": snake, "residual": residual}


_BLOCK = 1024


def _launch(x: torch.Tensor) -> tuple[tuple, dict, int, int]:
    """(grid, layout flags, T, C) for a [B, C, T] or channels-last [B, C, 1, T] tensor."""
    if x.dim() == 4:
        n, channels = x.numel(), x.shape[1]
        return (-(-n // _BLOCK), 1), {"CL": True}, n, channels
    batch, channels, length = x.shape
    return (batch * channels, -(-length // _BLOCK)), {"CL": False}, length, channels


def _dense(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x.contiguous()


def fused_snake(x: torch.Tensor, alpha: torch.Tensor, bias: torch.Tensor | None = None):
    """Snake1d's value of ``x`` (+ ``bias`` per channel, rounded to x's dtype first), written
    in the dtype the next (autocast) convolution reads; [B, C, T] or channels last."""
    if torch.is_autocast_enabled("cuda"):
        out_dtype = torch.get_autocast_dtype("cuda")
    else:
        out_dtype = torch.promote_types(x.dtype, alpha.dtype)
    x = _dense(x)
    y = torch.empty_like(x, dtype=out_dtype)
    grid, layout, length, channels = _launch(x)
    _SNAKE["kernel"]["snake"][grid](
        x, x if bias is None else bias, alpha.reshape(-1).contiguous(), y, length, channels,
        HAS_BIAS=bias is not None, BLOCK=_BLOCK, **layout,
    )  # fmt: skip
    return y


def fused_residual(x, x_bias, conv_out, conv_bias) -> torch.Tensor:
    """(x + x_bias) + (conv_out + conv_bias), each sum rounded as eager rounds it: a residual
    unit's output where neither bias has been added yet (x_bias may be None)."""
    x, conv_out = _dense(x), _dense(conv_out)
    y = torch.empty_like(x, dtype=torch.promote_types(x.dtype, conv_out.dtype))
    grid, layout, length, channels = _launch(x)
    _SNAKE["kernel"]["residual"][grid](
        x, x if x_bias is None else x_bias, conv_out, conv_bias, y, length, channels,
        X_BIAS=x_bias is not None, BLOCK=_BLOCK, **layout,
    )  # fmt: skip
    return y


def _weight_2d(conv: nn.Module) -> torch.Tensor:
    """The conv's weight as a [.., .., 1, k] channels-last 2-D kernel, made once."""
    w = conv.weight
    key = (w.data_ptr(), w._version, w.dtype, w.device)
    cached = getattr(conv, "_weight_2d", None)
    if cached is None or cached[0] != key:
        cached = (key, w.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last))
        conv._weight_2d = cached
    return cached[1]


def conv_without_bias(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` minus its bias (the fused path adds it in the next kernel). A 4-D ``x`` is
    channels last ([B, C, 1, T]): the conv runs as the equal 2-D one, so cuDNN's NHWC kernels
    read and write it without the NCHW<->NHWC transposes it adds around a 1-D conv."""
    if x.dim() == 4:
        if isinstance(conv, nn.ConvTranspose1d):
            return nn.functional.conv_transpose2d(
                x, _weight_2d(conv), None, (1, *conv.stride), (0, *conv.padding),
                (0, *conv.output_padding), conv.groups, (1, *conv.dilation),
            )  # fmt: skip
        return nn.functional.conv2d(
            x, _weight_2d(conv), None, (1, *conv.stride), (0, *conv.padding),
            (1, *conv.dilation), conv.groups,
        )  # fmt: skip
    if isinstance(conv, nn.ConvTranspose1d):
        return nn.functional.conv_transpose1d(
            x, conv.weight, None, conv.stride, conv.padding, conv.output_padding, conv.groups,
            conv.dilation,
        )  # fmt: skip
    return conv._conv_forward(x, conv.weight, None)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(dim),
            nn.Conv1d(dim, dim, kernel_size=7, dilation=dilation, padding=3 * dilation),
            Snake1d(dim),
            nn.Conv1d(dim, dim, kernel_size=1),
        )

    def forward(self, x):
        y = self.block(x)
        trim = (x.shape[-1] - y.shape[-1]) // 2  # 0 with these paddings; kept for safety
        return (x[..., trim:-trim] if trim > 0 else x) + y

    def fused(self, x, x_bias=None):
        """The same unit through the fused kernels; ``x_bias``: the bias of the convolution
        that made ``x``, not added yet."""
        snake_in, conv7, snake_mid, conv1 = self.block
        h = fused_snake(x, snake_in.alpha, x_bias)
        h = fused_snake(conv_without_bias(conv7, h), snake_mid.alpha, conv7.bias)
        return fused_residual(x, x_bias, conv_without_bias(conv1, h), conv1.bias)


class DecoderBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, stride: int):
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(in_dim),
            nn.ConvTranspose1d(
                in_dim,
                out_dim,
                kernel_size=2 * stride,
                stride=stride,
                padding=math.ceil(stride / 2),
            ),
            ResidualUnit(out_dim, 1),
            ResidualUnit(out_dim, 3),
            ResidualUnit(out_dim, 9),
        )

    def forward(self, x):
        return self.block(x)

    def fused(self, x, x_bias=None):
        snake, up, *units = self.block
        x = conv_without_bias(up, fused_snake(x, snake.alpha, x_bias))
        x = units[0].fused(x, up.bias)
        for unit in units[1:]:
            x = unit.fused(x)
        return x


class DACDecoder(nn.Module):
    def __init__(
        self,
        input_channel: int = 1024,
        channels: int = DECODER_CHANNELS,
        rates=DECODER_RATES,
        d_out: int = 1,
    ):
        super().__init__()
        layers = [nn.Conv1d(input_channel, channels, kernel_size=7, padding=3)]
        for i, stride in enumerate(rates):
            layers.append(DecoderBlock(channels // 2**i, channels // 2 ** (i + 1), stride))
        out_dim = channels // 2 ** len(rates)
        layers += [Snake1d(out_dim), nn.Conv1d(out_dim, d_out, kernel_size=7, padding=3), nn.Tanh()]
        self.model = nn.Sequential(*layers)
        self.hop = int(np.prod(rates))

    def forward(self, x):  # (B, input_channel, T) -> (B, d_out, ~T * hop)
        if x.is_cuda and snake_fused() and _SNAKE["fuse_bias"]:
            try:
                return self._fused(x, channels_last=_SNAKE["layout"] == "channels_last")
            except Exception as e:  # e.g. a GPU Triton cannot compile for
                _fused_failed(e)
        return self.model(x)

    def _fused(self, x, channels_last: bool = False):
        """The same layers with each convolution's bias added in the kernel that reads the
        output next (see _SNAKE): the input conv's and every block's. ``channels_last``: the
        activations stay [B, C, 1, T] channels last from the input conv to the output conv
        (the encoder's [B, T, C] output transposed is that layout already, no copy)."""
        first, *blocks = self.model[: len(self.model) - 3]
        snake, last, tanh = self.model[-3:]
        if channels_last:
            x = _dense(x.unsqueeze(2))
        x, x_bias = conv_without_bias(first, x), first.bias
        for block in blocks:
            x, x_bias = block.fused(x, x_bias), None
        if channels_last:
            x = fused_snake(x, snake.alpha)
            out = conv_without_bias(last, x) + last.bias.view(1, -1, 1, 1).to(x.dtype)
            return tanh(out[:, :, 0])
        return self.model[-3:](x)  # Snake, the output conv, tanh


def fold_weight_norm(state: dict) -> dict:
    """DAC saves weight-normed convs as ``weight_g``/``weight_v`` (torch.nn.utils.weight_norm,
    dim=0) or, with newer torch, ``parametrizations.weight.original0/1``. Fold both into a
    plain ``weight = g * v / ||v||`` (norm over every dim but 0), once, at load."""
    out = {}
    for key, value in state.items():
        for g_suffix, v_suffix in (
            (".weight_g", ".weight_v"),
            (".parametrizations.weight.original0", ".parametrizations.weight.original1"),
        ):
            if key.endswith(v_suffix):
                stem = key[: -len(v_suffix)]
                g = state.get(stem + g_suffix)
                if g is None:
                    raise SidonLoadError(f"decoder state dict has {key} without {stem + g_suffix}")
                v = value.float()
                norm = torch.linalg.vector_norm(v, dim=tuple(range(1, v.ndim)), keepdim=True)
                out[stem + ".weight"] = (v * (g.float() / norm)).to(value.dtype)
                break
            if key.endswith(g_suffix):
                break
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# feature cleanser: w2v-BERT 2.0 (first 8 layers) with the Sidon LoRA merged in


def _read_adapter(adapter_dir: Path) -> tuple[dict, dict]:
    cfg_path = adapter_dir / "adapter_config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(
            f"sidon: {cfg_path} not found (config field: restorer.sidon.adapter_dir; expected the "
            "sarulab-speech/sidon_raw_weight layout: adapter_config.json, "
            "adapter_model.safetensors, decoder_state_dict.pt)"
        )
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise SidonLoadError(
            f"sidon: {cfg_path} is not valid JSON (config field: restorer.sidon.adapter_dir): {e}"
        ) from e
    problems = []
    if cfg.get("peft_type") != "LORA":
        problems.append(f"peft_type={cfg.get('peft_type')!r} (want 'LORA')")
    for flag in ("use_dora", "fan_in_fan_out"):
        if cfg.get(flag):
            problems.append(f"{flag}=true")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        problems.append("rank_pattern/alpha_pattern set")
    if problems:
        raise SidonLoadError(
            f"sidon: unsupported LoRA adapter in {cfg_path}: "
            f"{'; '.join(problems)} (config field: restorer.sidon.adapter_dir)"
        )

    weights = adapter_dir / "adapter_model.safetensors"
    try:
        if weights.is_file():
            from safetensors.torch import load_file

            tensors = load_file(str(weights))
        elif (adapter_dir / "adapter_model.bin").is_file():
            weights = adapter_dir / "adapter_model.bin"
            tensors = torch.load(weights, map_location="cpu", weights_only=True)
        else:
            raise FileNotFoundError(
                f"sidon: {adapter_dir}/adapter_model.safetensors not found "
                "(config field: restorer.sidon.adapter_dir)"
            )
    except FileNotFoundError:
        raise
    except Exception as e:
        raise SidonLoadError(
            f"sidon: cannot read LoRA weights {weights} (corrupt?) "
            f"(config field: restorer.sidon.adapter_dir): {e}"
        ) from e
    return cfg, tensors


@torch.no_grad()
def merge_lora(model: nn.Module, adapter_cfg: dict, tensors: dict, n_layers: int) -> int:
    """Fold ``W += scale * B @ A`` into every adapted Linear, once. LoRA biases (peft
    ``bias="lora_only"`` training) replace the base bias when the adapter carries them.
    Refuses any key it does not understand, and an adapter that misses a target module."""
    r, alpha = int(adapter_cfg["r"]), float(adapter_cfg["lora_alpha"])
    scale = alpha / (math.sqrt(r) if adapter_cfg.get("use_rslora") else r)
    modules = dict(model.named_modules())
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        name = key[len(_PEFT_PREFIX) :] if key.startswith(_PEFT_PREFIX) else key
        parts = name.split(".")
        if len(parts) >= 3 and parts[-1] == "weight" and parts[-2] in ("lora_A", "lora_B"):
            pairs.setdefault(".".join(parts[:-2]), {})[parts[-2]] = value
        elif len(parts) >= 4 and parts[-1] == "weight" and parts[-3] in ("lora_A", "lora_B"):
            pairs.setdefault(".".join(parts[:-3]), {})[parts[-3]] = value  # named adapter
        elif parts[-1] == "bias" and ".".join(parts[:-1]) in modules:
            pairs.setdefault(".".join(parts[:-1]), {})["bias"] = value
        else:
            raise SidonLoadError(f"sidon: unexpected tensor {key!r} in the LoRA adapter")
    expected = {
        f"encoder.layers.{i}.{ffn}.{LORA_TARGET}"
        for i in range(n_layers)
        for ffn in ("ffn1", "ffn2")
    }
    missing = sorted(expected - {m for m, p in pairs.items() if "lora_A" in p})
    extra = sorted(set(pairs) - expected)
    if missing or extra:
        raise SidonLoadError(
            "sidon: the LoRA adapter does not have the Sidon layout (LoRA on ffn1/ffn2."
            f"output_dense of layers 0..{n_layers - 1}); missing: {missing[:4]}"
            f"{'...' if len(missing) > 4 else ''}; unexpected: {extra[:4]}"
        )
    for name, p in pairs.items():
        linear = modules[name]
        if "lora_B" not in p:
            raise SidonLoadError(f"sidon: LoRA pair for {name} lacks lora_B")
        a, b = p["lora_A"].float(), p["lora_B"].float()
        if b.shape[0] != linear.out_features or a.shape[1] != linear.in_features:
            raise SidonLoadError(
                f"sidon: LoRA shapes {tuple(b.shape)}x{tuple(a.shape)} do not "
                f"fit {name} ({linear.out_features}x{linear.in_features})"
            )
        delta = (b @ a) * scale
        linear.weight.copy_((linear.weight.float() + delta).to(linear.weight.dtype))
        if "bias" in p:
            linear.bias.copy_(p["bias"].to(linear.bias.dtype))
    return len(pairs)


def load_base_encoder(w2v_bert_dir: Path, n_layers: int):
    from transformers import Wav2Vec2BertModel

    if not (w2v_bert_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"sidon: {w2v_bert_dir}/config.json not found (config field: "
            "restorer.sidon.w2v_bert_dir; expected a local facebook/w2v-bert-2.0 directory)"
        )
    if not any((w2v_bert_dir / f).is_file() for f in ("model.safetensors", "pytorch_model.bin")):
        raise FileNotFoundError(
            f"sidon: {w2v_bert_dir} has no model.safetensors (config field: "
            "restorer.sidon.w2v_bert_dir)"
        )
    try:
        model = Wav2Vec2BertModel.from_pretrained(
            str(w2v_bert_dir),
            num_hidden_layers=n_layers,
            layerdrop=0.0,
            local_files_only=True,
            dtype=torch.float32,  # merge and autocast from full precision
            add_adapter=False,
        )
    except Exception as e:
        raise SidonLoadError(
            f"sidon: cannot load w2v-BERT 2.0 from {w2v_bert_dir} (corrupt?) "
            f"(config field: restorer.sidon.w2v_bert_dir): {e}"
        ) from e
    return model


def load_decoder(path: Path, hidden_size: int) -> DACDecoder:
    if not path.is_file():
        raise FileNotFoundError(
            f"sidon: decoder weights {path} not found (config fields: "
            "restorer.sidon.decoder_path, or adapter_dir/decoder_state_dict.pt)"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise SidonLoadError(
            f"sidon: cannot read decoder weights {path} (corrupt?) "
            f"(config field: restorer.sidon.decoder_path): {e}"
        ) from e
    if isinstance(state, dict) and "state_dict" in state:  # a Lightning checkpoint
        state = {
            k[len("decoder.") :]: v
            for k, v in state["state_dict"].items()
            if k.startswith("decoder.")
        }
    if (
        not isinstance(state, dict)
        or "model.0.weight_v" not in state
        and "model.0.weight" not in state
        and "model.0.parametrizations.weight.original1" not in state
    ):
        raise SidonLoadError(
            f"sidon: {path} is not a DAC Decoder state dict (no model.0 conv); "
            "TorchScript exports (sidon-v0.1 *_cuda.pt) are not supported"
        )
    state = fold_weight_norm(state)
    in_ch = state["model.0.weight"].shape[1]
    channels = state["model.0.weight"].shape[0]
    if in_ch != hidden_size:
        raise SidonLoadError(
            f"sidon: decoder input has {in_ch} channels, encoder gives {hidden_size} ({path})"
        )
    decoder = DACDecoder(in_ch, channels, DECODER_RATES)
    result = decoder.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise SidonLoadError(
            f"sidon: {path} does not have the DAC Decoder layout (channels {channels}, rates "
            f"{list(DECODER_RATES)}): missing {result.missing_keys[:4]}, "
            f"unexpected {result.unexpected_keys[:4]}"
        )
    return decoder


def _first_file(directory: Path, names: tuple[str, ...], field: str) -> Path:
    for name in names:
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(
        f"sidon: {directory} has no {' or '.join(names)} (config field: restorer.sidon.{field})"
    )


def _sha256(path: Path, memo_dir: Path | None) -> str:
    return file_sha256(path, memo_dir)


# ---------------------------------------------------------------------------------------------


class SidonRestorer(Restorer):
    name = "sidon"
    input_sample_rate = INPUT_SAMPLE_RATE
    output_sample_rate = OUTPUT_SAMPLE_RATE

    def __init__(
        self,
        device: str = "cpu",
        w2v_bert_dir: str | None = None,
        adapter_dir: str | None = None,
        decoder_path: str | None = None,
        cache_dir: str | None = None,  # merged-cleanser cache + hash memo
        batch_size: int = 32,
        dtype: str = "auto",  # auto: float16 on CUDA (as Sidon's own inference), float32 on CPU
        tail_pad_s: float = 0.5,
        num_layers: int = N_LAYERS,
        resample: str = "auto",  # soxr (host) or torch (on the device); auto: torch on CUDA
        compile: bool | str = False,  # torch.compile encoder + decoder (CUDA; "auto": on CUDA)
        bucket_s: float = 0.0,  # pad batch lengths up to a multiple of this (0: off)
    ):
        self._configure(
            device, batch_size, dtype, tail_pad_s, num_layers, resample, compile, bucket_s
        )
        self._attach(*self._load(w2v_bert_dir, adapter_dir, decoder_path, cache_dir))

    @classmethod
    def from_modules(cls, encoder, decoder, device: str = "cpu", **options) -> SidonRestorer:
        """A restorer around modules already in memory (``bestofn.fakes.sidon``, tests): a
        ``Wav2Vec2BertModel`` with the LoRA merged and a ``DACDecoder``. ``options``: the
        constructor's batch_size, dtype, tail_pad_s, num_layers, resample, compile, bucket_s."""
        self = cls.__new__(cls)
        self._configure(device, **options)
        self._attach(encoder, decoder)
        return self

    def _configure(
        self,
        device: str,
        batch_size: int = 32,
        dtype: str = "auto",
        tail_pad_s: float = 0.5,
        num_layers: int = N_LAYERS,
        resample: str = "auto",
        compile: bool | str = False,
        bucket_s: float = 0.0,
    ) -> None:
        self.device = device
        self.batch_size = int(batch_size)
        if self.batch_size <= 0:
            raise ValueError(f"sidon: batch_size must be positive, got {batch_size}")
        is_cuda = str(device).startswith("cuda")
        dtype = ("float16" if is_cuda else "float32") if dtype == "auto" else dtype
        if dtype not in ("float16", "bfloat16", "float32"):
            raise ValueError(
                f"sidon: dtype must be auto, float16, bfloat16 or float32; got {dtype!r}"
            )
        # reduced precision only where this device runs every op under autocast; else float32
        self.dtype = resolve_dtype("sidon", device, dtype, AUTOCAST_OPS)
        self.tail_pad = int(round(float(tail_pad_s) * INPUT_SAMPLE_RATE))
        self.num_layers = int(num_layers)
        self.hashes: dict[str, str] = {}
        self.paths: dict[str, str] = {}
        self.merged_from_cache = False
        if resample not in ("auto", "soxr", "torch"):
            raise ValueError(f"sidon: resample must be auto, soxr or torch; got {resample!r}")
        self.resample = ("torch" if is_cuda else "soxr") if resample == "auto" else resample
        if compile not in (True, False, "auto"):
            raise ValueError(f"sidon: compile must be true, false or auto; got {compile!r}")
        self.compile = is_cuda and compile in (True, "auto")
        if float(bucket_s) < 0:
            raise ValueError(f"sidon: bucket_s must be >= 0, got {bucket_s}")
        self.bucket = int(round(float(bucket_s) * INPUT_SAMPLE_RATE))

    def _attach(self, encoder, decoder) -> None:
        self.fbank = SeamlessFbank().to(self.device)
        self.encoder = encoder.eval().to(self.device)
        self.decoder = decoder.eval().to(self.device)
        for p in [*self.encoder.parameters(), *self.decoder.parameters()]:
            p.requires_grad_(False)
        self.set_speed(compile=self.compile)

    def set_speed(
        self,
        batch_size: int | None = None,
        resample: str | None = None,
        compile: bool | None = None,
        bucket_s: float | None = None,
        dtype: str | None = None,
    ) -> None:
        """Change the speed-only knobs of a loaded restorer (benchmarks compare them in one
        process); ``None`` keeps a knob. ``dtype`` is the autocast dtype (float16, bfloat16
        or float32; the weights stay as loaded)."""
        if dtype is not None:
            if dtype not in ("float16", "bfloat16", "float32"):
                raise ValueError(
                    f"sidon: dtype must be float16, bfloat16 or float32; got {dtype!r}"
                )
            self.dtype = resolve_dtype("sidon", self.device, dtype, AUTOCAST_OPS)
        if batch_size is not None:
            if int(batch_size) <= 0:
                raise ValueError(f"sidon: batch_size must be positive, got {batch_size}")
            self.batch_size = int(batch_size)
        if resample is not None:
            if resample not in ("soxr", "torch"):
                raise ValueError(f"sidon: resample must be soxr or torch; got {resample!r}")
            self.resample = resample
        if bucket_s is not None:
            self.bucket = int(round(float(bucket_s) * INPUT_SAMPLE_RATE))
        if compile is not None:
            self.compile = bool(compile) and str(self.device).startswith("cuda")
            self._encode, self._decode = self.encoder, self.decoder
            if self.compile:
                self._encode = torch.compile(self.encoder, dynamic=True)
                self._decode = torch.compile(self.decoder, dynamic=True)

    # --- loading -------------------------------------------------------------------------------

    def _load(self, w2v_bert_dir, adapter_dir, decoder_path, cache_dir):
        if not w2v_bert_dir:
            raise ValueError(
                "sidon: config field restorer.sidon.w2v_bert_dir is required "
                "(a local facebook/w2v-bert-2.0 directory)"
            )
        if not adapter_dir:
            raise ValueError(
                "sidon: config field restorer.sidon.adapter_dir is required "
                "(a local sarulab-speech/sidon_raw_weight directory)"
            )
        base, adapter = Path(w2v_bert_dir).expanduser(), Path(adapter_dir).expanduser()
        for field, d in (("w2v_bert_dir", base), ("adapter_dir", adapter)):
            if not d.is_dir():
                raise FileNotFoundError(
                    f"sidon: {d} is not a directory (config field: restorer.sidon.{field})"
                )
        dec_path = (
            Path(decoder_path).expanduser() if decoder_path else adapter / "decoder_state_dict.pt"
        )
        if not dec_path.is_file():  # fail before the slow encoder load
            raise FileNotFoundError(
                f"sidon: decoder weights {dec_path} not found (config fields: "
                "restorer.sidon.decoder_path, or adapter_dir/decoder_state_dict.pt)"
            )
        cache = Path(cache_dir).expanduser() if cache_dir else None
        memo = cache / "hash-memo" if cache else None

        adapter_cfg, lora = _read_adapter(adapter)
        base_weights = _first_file(base, ("model.safetensors", "pytorch_model.bin"), "w2v_bert_dir")
        base_config = _first_file(base, ("config.json",), "w2v_bert_dir")
        adapter_weights = _first_file(
            adapter, ("adapter_model.safetensors", "adapter_model.bin"), "adapter_dir"
        )
        for key, p in (
            ("w2v_bert", base_weights),
            ("w2v_bert_config", base_config),
            ("adapter", adapter_weights),
            ("adapter_config", adapter / "adapter_config.json"),
            ("decoder", dec_path),
        ):
            if p.is_file():
                self.paths[key], self.hashes[key] = str(p), _sha256(p, memo)

        encoder = None
        cache_file = None
        if cache is not None:
            key = hashlib.sha256(
                f"{MERGE_VERSION}\0{self.num_layers}\0{self.hashes['w2v_bert']}\0"
                f"{self.hashes['w2v_bert_config']}\0{self.hashes['adapter']}\0"
                f"{self.hashes['adapter_config']}".encode()
            ).hexdigest()[:32]
            cache_file = cache / f"sidon-cleanser-{key}.safetensors"
            if cache_file.is_file():
                encoder = self._encoder_from_cache(base, cache_file)
        if encoder is None:
            encoder = load_base_encoder(base, self.num_layers)
            n = merge_lora(encoder, adapter_cfg, lora, self.num_layers)
            log.info("sidon: merged LoRA into %d modules of %s", n, base)
            if cache_file is not None:
                self._write_cache(encoder, cache_file)
        decoder = load_decoder(dec_path, encoder.config.hidden_size)
        return encoder, decoder

    def _encoder_from_cache(self, base: Path, cache_file: Path):
        from safetensors.torch import load_file
        from transformers import Wav2Vec2BertConfig, Wav2Vec2BertModel

        config = Wav2Vec2BertConfig.from_pretrained(
            str(base), num_hidden_layers=self.num_layers, layerdrop=0.0, add_adapter=False
        )
        with torch.device("meta"):
            model = Wav2Vec2BertModel(config)
        try:
            model.load_state_dict(load_file(str(cache_file)), strict=True, assign=True)
        except Exception as e:  # a broken cache entry is rebuilt, not trusted
            log.warning("sidon: ignoring unreadable merged cache %s: %s", cache_file, e)
            return None
        self.merged_from_cache = True
        return model

    @staticmethod
    def _write_cache(encoder, cache_file: Path) -> None:
        from safetensors.torch import save_file

        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(f".tmp{os.getpid()}")
        state = {k: v.contiguous() for k, v in encoder.state_dict().items()}
        save_file(state, str(tmp))
        os.replace(tmp, cache_file)  # atomic: a crash never leaves a half entry

    # --- inference -----------------------------------------------------------------------------

    def _autocast(self):
        if self.dtype == "float32":
            return contextlib.nullcontext()
        kind = "cuda" if str(self.device).startswith("cuda") else "cpu"
        return torch.autocast(device_type=kind, dtype=getattr(torch, self.dtype))

    @torch.inference_mode()
    def _restore_tensor(self, wav_t: torch.Tensor, n16: list[int]) -> np.ndarray:
        """Restore a (B, N) 16 kHz batch on the device, zero past each take's ``n16`` samples;
        returns the 48 kHz batch on the host (one device->host copy)."""
        lengths = [n + self.tail_pad for n in n16]
        # every take needs at least one full fbank frame pair
        n_max = max(max(lengths), 2 * SeamlessFbank.frame_length)
        if self.bucket:
            n_max = -(-n_max // self.bucket) * self.bucket
        if wav_t.shape[1] < n_max:
            wav_t = nn.functional.pad(wav_t, (0, n_max - wav_t.shape[1]))
        wav_t = wav_t[:, :n_max]
        lengths_t = torch.tensor(lengths, device=self.device)
        feats, mask = self.fbank(wav_t, lengths_t)
        with self._autocast():
            hidden = self._encode(input_features=feats, attention_mask=mask).last_hidden_state
            hidden = hidden * mask.unsqueeze(-1).to(hidden.dtype)  # padded frames -> 0
            out = self._decode(hidden.transpose(1, 2))[:, 0].float()
        if not out.is_cuda:
            return out.numpy()
        # through page-locked memory (torch's caching host allocator reuses the block once the
        # arrays are freed): a pageable copy of a 32-take batch took 51 ms on an H200, 6 % of
        # the restore
        host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        host.copy_(out)
        return host.numpy()

    def _trim(self, out: np.ndarray, n16: list[int]) -> list[np.ndarray]:
        ratio = OUTPUT_SAMPLE_RATE // INPUT_SAMPLE_RATE
        restored = []
        for i, n in enumerate(n16):
            y = out[i, : n * ratio]
            if y.shape[0] < n * ratio:  # only without tail padding
                y = np.pad(y, (0, n * ratio - y.shape[0]))
            restored.append(y)
        return restored

    def restore_batch(self, audios16k: list[np.ndarray]) -> list[np.ndarray]:
        """Restore 16 kHz mono takes; returns 48 kHz takes of exactly 3x their length."""
        n16 = [len(a) for a in audios16k]
        wav = np.zeros((len(audios16k), max(max(n16), 1)), dtype=np.float32)
        for i, a in enumerate(audios16k):
            wav[i, : len(a)] = a
        return self._trim(self._restore_tensor(torch.from_numpy(wav).to(self.device), n16), n16)

    @torch.inference_mode()
    def _to_16k_on_device(self, audios: list[np.ndarray], sr: int):
        """The takes as one (B, N) 16 kHz mono batch on the device: copied once as generated,
        downmixed and resampled there, zero past each take's end. Returns (batch, lengths)."""
        n = [int(a.shape[0]) for a in audios]
        x = torch.zeros(len(audios), max(max(n), 1), device=self.device)
        for b, a in enumerate(audios):
            t = torch.from_numpy(np.asarray(a, dtype=np.float32)).to(self.device)
            x[b, : n[b]] = t.mean(-1) if t.ndim == 2 else t
        y = resample_torch(x, sr, INPUT_SAMPLE_RATE)
        n16 = [out_length(k, sr, INPUT_SAMPLE_RATE) for k in n]
        keep = (
            torch.arange(y.shape[1], device=self.device)[None, :]
            < torch.tensor(n16, device=self.device)[:, None]
        )
        return y * keep, n16

    def restore(self, audios: list[np.ndarray], sample_rate: int):
        sr = int(sample_rate)
        targets = [int(round(a.shape[0] * OUTPUT_SAMPLE_RATE / sr)) for a in audios]
        # sort by duration: little padding per batch
        order = sorted(range(len(audios)), key=lambda i: audios[i].shape[0])
        on_device = self.resample == "torch"
        audios16k = None if on_device else mono_at(audios, sr, INPUT_SAMPLE_RATE)
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(audios)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            if on_device:
                wav_t, n16 = self._to_16k_on_device([audios[i] for i in idx], sr)
                restored = self._trim(self._restore_tensor(wav_t, n16), n16)
            else:
                restored = self.restore_batch([audios16k[i] for i in idx])
            for i, y in zip(idx, restored, strict=True):
                # exact length of the input take at 48 kHz (soxr may be off by a sample)
                t = targets[i]
                out[i] = (y[:t] if len(y) >= t else np.pad(y, (0, t - len(y)))).astype(np.float32)
        return out, OUTPUT_SAMPLE_RATE

    def provenance(self) -> dict:
        return {
            "backend": self.name,
            "paths": self.paths or "in-memory modules",
            "sha256": self.hashes,
            "num_layers": self.num_layers,
            "lora_merged": True,
            "merged_from_cache": self.merged_from_cache,
            "dtype": self.dtype,
            "batch_size": self.batch_size,
            "resample": self.resample,
            "compiled": self.compile,
            "decoder_kernels": decoder_kernels(self.device),
            "bucket_samples_16k": self.bucket,
            "tail_pad_samples_16k": self.tail_pad,
            "sample_rates": [INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE],
        }

    def close(self) -> None:
        self.encoder = self.decoder = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
