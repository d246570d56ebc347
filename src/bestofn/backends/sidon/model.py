"""Sidon's networks (facts and sources: .ref/notes/sidon-parakeet-facts.md), as modules:

    16 kHz audio --SeamlessM4T log-mel (80 bins, 100 Hz, stacked by 2: 160 dims at 50 Hz)-->
    feature cleanser: the first 8 layers of w2v-BERT 2.0 (transformers' Wav2Vec2BertModel)
    with the Sidon LoRA merged in (``bestofn.backends.sidon.loader``) --> features [T, 1024]
    at 50 Hz --> DAC-style decoder (input 1024, channels 1536, rates 8*5*4*3*2 = 960)
    --> 48 kHz, tanh.

The decoder runs eagerly, or, on CUDA, through the fused kernels of the ``DecoderKernels`` it
is given (``use_kernels``; ``bestofn.backends.sidon.kernels``)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from bestofn.backends.sidon.kernels import DecoderKernels, conv_without_bias, dense

INPUT_SAMPLE_RATE = 16000
OUTPUT_SAMPLE_RATE = 48000
N_LAYERS = 8  # Sidon keeps the first 8 of w2v-BERT 2.0's 24 layers
DECODER_CHANNELS = 1536
DECODER_RATES = (8, 5, 4, 3, 2)  # product 960 = 48000 / 50 Hz


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
        self.kernels: DecoderKernels | None = None  # set by DACDecoder.use_kernels

    def forward(self, x):
        k = self.kernels
        if x.is_cuda and k is not None and k.fused():
            try:
                return k.snake(x, self.alpha)
            except Exception as e:  # e.g. a GPU Triton cannot compile for
                k.failed(e)
        # x + sin^2(alpha x) / alpha, with DAC's 1e-9 guard
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


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

    def fused(self, k: DecoderKernels, x, x_bias=None):
        """The same unit through the fused kernels ``k``; ``x_bias``: the bias of the
        convolution that made ``x``, not added yet."""
        snake_in, conv7, snake_mid, conv1 = self.block
        h = k.snake(x, snake_in.alpha, x_bias)
        h = k.snake(conv_without_bias(conv7, h), snake_mid.alpha, conv7.bias)
        return k.residual(x, x_bias, conv_without_bias(conv1, h), conv1.bias)


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

    def fused(self, k: DecoderKernels, x, x_bias=None):
        snake, up, *units = self.block
        x = conv_without_bias(up, k.snake(x, snake.alpha, x_bias))
        x = units[0].fused(k, x, up.bias)
        for unit in units[1:]:
            x = unit.fused(k, x)
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
        self.kernels: DecoderKernels | None = None  # None: the eager ops

    def use_kernels(self, kernels: DecoderKernels | None) -> DACDecoder:
        """Run on CUDA through ``kernels`` (the restorer's own; None: the eager ops)."""
        self.kernels = kernels
        for m in self.modules():
            if isinstance(m, Snake1d):
                m.kernels = kernels
        return self

    def forward(self, x):  # (B, input_channel, T) -> (B, d_out, ~T * hop)
        k = self.kernels
        if x.is_cuda and k is not None and k.fused() and k.fuse_bias:
            try:
                return self._fused(k, x, channels_last=k.layout == "channels_last")
            except Exception as e:  # e.g. a GPU Triton cannot compile for
                k.failed(e)
        return self.model(x)

    def _fused(self, k: DecoderKernels, x, channels_last: bool = False):
        """The same layers with each convolution's bias added in the kernel that reads the
        output next (``bestofn.backends.sidon.kernels``): the input conv's and every block's.
        ``channels_last``: the activations stay [B, C, 1, T] channels last from the input
        conv to the output conv (the encoder's [B, T, C] output transposed is that layout
        already, no copy)."""
        first, *blocks = self.model[: len(self.model) - 3]
        snake, last, tanh = self.model[-3:]
        if channels_last:
            x = dense(x.unsqueeze(2))
        x, x_bias = conv_without_bias(first, x), first.bias
        for block in blocks:
            x, x_bias = block.fused(k, x, x_bias), None
        if channels_last:
            x = k.snake(x, snake.alpha)
            out = conv_without_bias(last, x) + last.bias.view(1, -1, 1, 1).to(x.dtype)
            return tanh(out[:, :, 0])
        return self.model[-3:](x)  # Snake, the output conv, tanh
