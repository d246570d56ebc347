"""A batched resampler for the scorers' input on the GPU: downmix, then a windowed-sinc FIR at a
fixed rational ratio (polyphase, one ``conv1d`` for every take of a group), float32.

Why: soxr on the host cost 0.0058 s/clip for 48 -> 16 kHz on the H200 box (a group's 64 takes,
on 8 threads), which counts in every group's period. Here the takes go to the device once,
are filtered together, and come back at the scorers' rate as numpy arrays (the scorers' input
type is unchanged).

The filter: a Kaiser-windowed sinc, cutoff at ``ROLLOFF`` of the lower Nyquist frequency,
``ZEROS`` zero crossings each side (of the lower rate's sinc). In the passband (up to 0.85 of
the lower Nyquist frequency) it matches soxr's 'HQ' to about 100 dB SNR for 48 or 24 -> 16 kHz
(tests/test_audio_gpu.py holds it to 60 dB); the first and last ~20 ms differ more (edge
handling, max |diff| ~5e-3). It is not bit-identical to soxr, so choosing it is a `bestofn ab`
dial (config/ab_thresholds_resampler.yaml).
Selected per scorer by ``runtime.resampler`` (auto: torch on CUDA, soxr on CPU).
"""

from __future__ import annotations

import functools
import math

import numpy as np

RESAMPLERS = ("auto", "soxr", "torch")
ROLLOFF = 0.95  # cutoff / lower Nyquist: soxr HQ keeps ~0.95 of the band
ZEROS = 32  # sinc zero crossings each side: the filter spans 2 * ZEROS periods of the lower rate
KAISER_BETA = 9.0  # ~ -90 dB sidelobes


def resolve_resampler(value: str | None, device: str) -> str:
    """``runtime.resampler`` of a scorer: auto -> torch on CUDA, soxr elsewhere."""
    if value is None:
        from bestofn.schemas import schema

        backend = schema("config")["$defs"]["backend"]["properties"]["runtime"]
        value = backend["properties"]["resampler"]["default"]
    if value not in RESAMPLERS:
        raise ValueError(f"runtime.resampler must be one of {', '.join(RESAMPLERS)}; got {value!r}")
    if value == "auto":
        return "torch" if str(device).startswith("cuda") else "soxr"
    return value


def out_length(n: int, sr_in: int, sr_out: int) -> int:
    """Output samples for ``n`` input samples: as soxr's one-shot ``resample`` gives."""
    return int(n * sr_out / sr_in + 0.5)


@functools.lru_cache(maxsize=16)
def _kernel(sr_in: int, sr_out: int, device: str):
    """(conv1d weight [up, 1, taps], up, down, left pad): output phase i of every input block of
    ``down`` samples is the sinc centred at ``i * down / up`` input samples."""
    import torch

    g = math.gcd(sr_in, sr_out)
    up, down = sr_out // g, sr_in // g
    cutoff = ROLLOFF * 0.5 * min(up, down) / down  # cycles per input sample
    half = int(math.ceil(ZEROS * max(1.0, down / up)))  # half-width in input samples
    taps = 2 * half + int(math.ceil(down * (up - 1) / up)) + 1  # phases lie in [0, down)
    k = np.arange(taps, dtype=np.float64)
    phases = np.arange(up, dtype=np.float64)[:, None] * down / up
    t = phases + half - k[None, :]  # input-sample offset of each tap from the output time
    window = np.where(
        np.abs(t) <= half, np.i0(KAISER_BETA * np.sqrt(np.clip(1 - (t / half) ** 2, 0, 1))), 0.0
    ) / np.i0(KAISER_BETA)
    h = 2 * cutoff * np.sinc(2 * cutoff * t) * window
    h /= h.sum(axis=1, keepdims=True)  # unit DC gain for every phase
    # conv1d correlates: tap k of phase i reads input sample n * down + k - half, whose offset
    # from the output time n * down + i * down / up is t[i, k]
    weight = torch.tensor(h[:, None, :], dtype=torch.float32, device=device)
    return weight, up, down, half


def resample_batch(audios: list[np.ndarray], sr_in: int, sr_out: int, device: str) -> list:
    """Mono float32 copies of ``audios`` (frames,) or (frames, channels) at ``sr_out``,
    computed on ``device`` in one padded batch; numpy arrays in the input order."""
    import torch

    if not audios:
        return []
    lengths = [int(np.asarray(a).shape[0]) for a in audios]
    signal = torch.zeros((len(audios), max(max(lengths), 1)), dtype=torch.float32, device=device)
    for i, a in enumerate(audios):
        x = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(device)
        if x.ndim == 2:  # downmix on the device: the mean of the channels
            x = x.sum(dim=1) * (1.0 / x.shape[1])
        signal[i, : lengths[i]] = x
    if sr_in == sr_out:
        host = signal.cpu().numpy()
        return [host[i, :n].copy() for i, n in enumerate(lengths)]
    weight, up, down, left = _kernel(sr_in, sr_out, str(device))
    taps = weight.shape[-1]
    n_out = [out_length(n, sr_in, sr_out) for n in lengths]
    blocks = -(-max(n_out) // up)  # output blocks of `up` samples
    need = (blocks - 1) * down + taps  # input samples the last block reads
    padded = torch.nn.functional.pad(signal, (left, max(0, need - left - signal.shape[1])))
    with torch.inference_mode():
        y = torch.nn.functional.conv1d(padded[:, None, :need], weight, stride=down)
    y = y.transpose(1, 2).reshape(len(audios), -1)  # interleave the phases
    host = y.cpu().numpy()
    return [host[i, :n].copy() for i, n in enumerate(n_out)]
