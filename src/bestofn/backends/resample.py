"""Embedded default restorers: pass-through and high-quality resampling (soxr)."""

from __future__ import annotations

import numpy as np

from bestofn.backends.base import Restorer
from bestofn.util.audio import resample

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {
    "identity": {"role": "restorer", "class": "IdentityRestorer", "parallel_build": True},
    "resample": {"role": "restorer", "class": "ResampleRestorer", "parallel_build": True},
}


class IdentityRestorer(Restorer):
    name = "identity"
    table_weights = "–"
    table_options = "–"

    def __init__(self, device: str = "cpu"):
        pass

    def restore(self, audios: list[np.ndarray], sample_rate: int):
        return list(audios), sample_rate


class ResampleRestorer(Restorer):
    """Resample every take to ``sample_rate`` (e.g. to match a production restorer's rate)."""

    name = "resample"
    table_weights = "–"
    table_options = "`sample_rate`"

    def __init__(self, device: str = "cpu", sample_rate: int = 48000):
        if int(sample_rate) <= 0:
            raise ValueError(f"resample: sample_rate must be positive, got {sample_rate}")
        self.sample_rate = int(sample_rate)

    def restore(self, audios: list[np.ndarray], sample_rate: int):
        return [resample(a, sample_rate, self.sample_rate) for a in audios], self.sample_rate

    def provenance(self) -> dict:
        return {"backend": self.name, "sample_rate": self.sample_rate, "library": "soxr HQ"}


# ---------------------------------------------------------------------------------------------
# Resampling on the device (torch): a polyphase windowed-sinc filter (Kaiser window), applied
# to a whole padded batch with one strided conv1d, so the takes never leave the GPU between
# stages that want another rate. Close to soxr HQ in the passband, not bit-identical: a
# backend uses it only where asked (Sidon ``resample: torch``; ``auto`` picks it on CUDA).

SINC_ZERO_CROSSINGS = 32  # filter half-width, in zero crossings of the lower rate
SINC_ROLLOFF = 0.945  # cutoff as a fraction of the lower Nyquist frequency
KAISER_BETA = 14.77


def sinc_kernel(sr_in: int, sr_out: int, device=None, dtype=None):
    """(kernel (phases, 1, taps), left padding, input stride): the filter of a polyphase
    resampler from ``sr_in`` to ``sr_out``, one row per output phase."""
    import math

    import torch

    g = math.gcd(int(sr_in), int(sr_out))
    up, down = int(sr_out) // g, int(sr_in) // g  # phases per block, input samples per block
    cutoff = min(up, down) * SINC_ROLLOFF  # in units of the block's sample grid
    half = math.ceil(SINC_ZERO_CROSSINGS * down / cutoff)
    taps = torch.arange(-half, half + down, dtype=torch.float64) / down
    phases = -torch.arange(up, dtype=torch.float64)[:, None] / up
    t = (phases + taps[None, :]) * cutoff  # distance in zero crossings of the cutoff
    t = t.clamp(-SINC_ZERO_CROSSINGS, SINC_ZERO_CROSSINGS)
    window = torch.special.i0(
        KAISER_BETA * torch.sqrt(1 - (t / SINC_ZERO_CROSSINGS) ** 2)
    ) / torch.special.i0(torch.tensor(KAISER_BETA, dtype=torch.float64))
    kernel = torch.sinc(t) * window * (cutoff / down)
    return kernel[:, None, :].to(device=device, dtype=dtype or torch.float32), half, down


def resample_torch(x, sr_in: int, sr_out: int):
    """Resample a (batch, samples) float tensor along its last axis, on its own device.
    Returns (batch, ceil(samples * sr_out / sr_in)); padding past a take's end stays ~0."""
    import math

    import torch

    if int(sr_in) == int(sr_out):
        return x
    kernel, half, down = sinc_kernel(sr_in, sr_out, x.device, x.dtype)
    up = kernel.shape[0]
    n = x.shape[-1]
    padded = torch.nn.functional.pad(x[:, None, :], (half, half + down))
    # full float32: cuDNN would otherwise run the convolution in TF32 (10-bit mantissa), a
    # noise floor above 16-bit audio's
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        y = torch.nn.functional.conv1d(padded, kernel, stride=down)  # (B, up, blocks)
    y = y.transpose(1, 2).reshape(x.shape[0], -1)
    return y[:, : math.ceil(n * up / down)]


def out_length(n: int, sr_in: int, sr_out: int) -> int:
    """Samples of a take of ``n`` samples at ``sr_out`` (as soxr gives them)."""
    return int(round(n * int(sr_out) / int(sr_in)))
