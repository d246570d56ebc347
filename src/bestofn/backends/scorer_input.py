"""A batched resampler for the scorers' input on the GPU: the takes of a group go to the device
once, are downmixed and filtered together (polyphase windowed sinc, float32), and come back.

Why: soxr on the host cost 0.0058 s/clip for 48 -> 16 kHz on the H200 box (a group's 64 takes,
on 8 threads), which counts in every group's period. The scorers' input type is unchanged
(numpy arrays at their rate).

The filter is the one Sidon's ``resample: torch`` runs (``bestofn.backends.resample.
resample_torch``: Kaiser-windowed sinc, one strided ``conv1d``, TF32 off). Up to 0.8 of the lower
Nyquist frequency it matches soxr's 'HQ' to over 100 dB SNR for 48 or 24 -> 16 kHz
(tests/backends/test_audio_gpu.py holds it to 90 dB); nearer the cutoff, and in the first and
last ~20 ms (edge handling), the two differ more. It is not bit-identical to soxr, so choosing
it is a `bestofn ab` dial (config/ab_thresholds_resampler.yaml). Selected per scorer by
``runtime.resampler`` (auto: torch on CUDA, soxr on CPU).
"""

from __future__ import annotations

import numpy as np

from bestofn.util.audio import mono_at


def resample_batch(audios: list[np.ndarray], sr_in: int, sr_out: int, device: str) -> list:
    """Mono float32 copies of ``audios`` (frames,) or (frames, channels) at ``sr_out``,
    computed on ``device`` in one padded batch; numpy arrays in the input order."""
    import torch

    from bestofn.backends.resample import out_length, resample_torch

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
    with torch.inference_mode():
        y = resample_torch(signal, sr_in, sr_out)
    n_out = [out_length(n, sr_in, sr_out) for n in lengths]
    host = y.cpu().numpy()
    return [host[i, :n].copy() for i, n in enumerate(n_out)]


def scorer_input(
    audios: list[np.ndarray], sr: int, want: int, resampler: str = "soxr", device: str = "cpu"
) -> list[np.ndarray]:
    """Mono copies of a group's takes at ``want`` Hz, by the scorer's resolved ``resampler``:
    'soxr' on the host (``bestofn.util.audio.mono_at``) or 'torch' in one batch on ``device``."""
    if resampler == "torch":
        return resample_batch(audios, sr, want, device)
    return mono_at(audios, sr, want)
