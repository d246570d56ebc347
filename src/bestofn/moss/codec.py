"""The audio codecs behind MOSS-TTS: ``Codec`` is what an engine needs: batched ``decode`` of
code sequences to audio and ``encode`` of a reference voice.

Engines get one with ``load_codec(codec_dir, device=..., n_vq=..., weight_dtype=...,
compute_dtype=..., decode_batch_size=...)``, which picks the implementation from
``codec_dir/config.json``:

- MOSS-Audio-Tokenizer (24 kHz mono, 32 quantizers; the codec of MOSS-TTS Delay):
  ``bestofn.moss.audio_tokenizer.MossAudioTokenizer``, our own batched implementation
  (fp32 / bf16 / fp8), no remote code.
- anything else, i.e. MOSS-Audio-Tokenizer-v2 of MOSS-TTS-Local v1.5 (48 kHz stereo, 12
  codebooks of 1024, 3840 samples per frame) and the random STAND-IN that ``bestofn
  fake-weights`` writes for it: ``RemoteCodec``, the codec's own published code loaded from the
  directory (transformers ``trust_remote_code``, no download). The v2 modeling code is published
  only next to its weights on the model hub, so there is no independent implementation of it yet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch


class Codec(Protocol):
    sample_rate: int
    channels: int

    def decode(self, codes: list[torch.Tensor]) -> list[np.ndarray]:
        """Code sequences [T_i, n_vq] -> float32 audio (S_i, channels), one batched call."""
        ...

    def encode(self, audio: np.ndarray, sample_rate: int) -> torch.Tensor:
        """One clip (S,) or (S, channels) at ``sample_rate`` -> codes [T, n_vq]."""
        ...


def load_codec(
    codec_dir,
    device: str = "cpu",
    n_vq: int | None = None,
    weight_dtype: str | None = "bf16",
    compute_dtype: str | None = "bf16",
    decode_batch_size: int = 16,
) -> Codec:
    """The ``Codec`` for ``codec_dir`` (see the module docstring for which class). Options as
    in config: ``codec_weight_dtype`` / ``codec_compute_dtype`` (fp32, bf16; fp8 for
    MOSS-Audio-Tokenizer on GPUs with fp8 matmuls), ``decode_batch_size``."""
    import json

    path = Path(codec_dir).expanduser() / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (config field: codec_dir)")
    try:
        cfg = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e}) (config field: codec_dir)") from None
    from bestofn.moss.audio_tokenizer import MossAudioTokenizer, is_audio_tokenizer_config

    if is_audio_tokenizer_config(cfg):
        return MossAudioTokenizer(
            path.parent,
            device=device,
            compute_dtype=compute_dtype or "bf16",
            weight_dtype=weight_dtype,
            n_vq=n_vq,
            decode_batch_size=decode_batch_size,
        )
    for option, value in (
        ("codec_weight_dtype", weight_dtype),
        ("codec_compute_dtype", compute_dtype),
    ):
        if value == "fp8":
            raise ValueError(
                f"{option}: fp8 is implemented for MOSS-Audio-Tokenizer (24 kHz) only; "
                f"{path} is another codec (run through its remote code): use bf16 or fp32"
            )
    return RemoteCodec(
        path.parent,
        n_vq=12 if n_vq is None else n_vq,
        device=device,
        weight_dtype=weight_dtype or "bf16",
        compute_dtype=compute_dtype,
        decode_batch_size=decode_batch_size,
    )


class RemoteCodec:
    """MOSS-Audio-Tokenizer-v2 through its published remote code, batched on one device."""

    def __init__(
        self,
        codec_dir: str | Path,
        n_vq: int = 12,
        device: str = "cpu",
        weight_dtype: str = "bf16",
        compute_dtype: str | None = "bf16",
        decode_batch_size: int = 16,
    ):
        from transformers import AutoModel

        self.codec_dir = Path(codec_dir)
        if not (self.codec_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"codec directory {self.codec_dir} has no config.json (config field: codec_dir)"
            )
        on_gpu = torch.device(device).type == "cuda"
        kwargs = {"codec_weight_dtype": weight_dtype if on_gpu else "fp32"}
        self.model = AutoModel.from_pretrained(
            str(self.codec_dir), trust_remote_code=True, local_files_only=True, **kwargs
        )
        if on_gpu and compute_dtype and hasattr(self.model, "set_compute_dtype"):
            self.model.set_compute_dtype(compute_dtype)
        self.model.to(device).eval()
        self.device, self.n_vq = device, n_vq
        self.decode_batch_size = max(1, int(decode_batch_size))
        cfg = self.model.config
        self.sample_rate = int(
            getattr(self.model, "sampling_rate", getattr(cfg, "sampling_rate", 48000))
        )
        self.channels = int(getattr(cfg, "channels", 2))

    @torch.inference_mode()
    def decode(self, codes: list[torch.Tensor]) -> list[np.ndarray]:
        out: list[np.ndarray] = [np.zeros((0, self.channels), np.float32)] * len(codes)
        todo = [i for i, c in enumerate(codes) if c.shape[0] > 0]
        for start in range(0, len(todo), self.decode_batch_size):
            idx = todo[start : start + self.decode_batch_size]
            T = max(int(codes[i].shape[0]) for i in idx)
            grid = torch.zeros(self.n_vq, len(idx), T, dtype=torch.long, device=self.device)
            mask = torch.zeros(len(idx), T, dtype=torch.bool, device=self.device)
            for b, i in enumerate(idx):
                n = codes[i].shape[0]
                grid[:, b, :n] = codes[i][:, : self.n_vq].T.to(self.device)
                mask[b, :n] = True
            res = self.model.decode(
                grid, padding_mask=mask, num_quantizers=self.n_vq, return_dict=True
            )
            for b, i in enumerate(idx):
                n = int(res.audio_lengths[b])
                wav = res.audio[b, :, :n].to(torch.float32).cpu().numpy()
                out[i] = np.ascontiguousarray(wav.T)
        return out

    @torch.inference_mode()
    def encode(self, audio: np.ndarray, sample_rate: int) -> torch.Tensor:
        if sample_rate != self.sample_rate:
            import soxr

            audio = soxr.resample(audio, sample_rate, self.sample_rate)
        wav = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
        wav = wav[None, :] if wav.ndim == 1 else wav.T  # [channels, S]
        if wav.shape[0] == 1 and self.channels == 2:
            wav = wav.repeat(2, 1)
        wav = _loudness_normalize(wav[: self.channels])
        res = self.model.batch_encode([wav.to(self.device)], num_quantizers=self.n_vq)
        n = int(res.audio_codes_lengths[0])
        return res.audio_codes[:, 0, :n].T.contiguous().cpu().long()


def _loudness_normalize(wav: torch.Tensor, target_dbfs=-20.0, max_gain_db=3.0) -> torch.Tensor:
    # As the reference processor does before encoding a voice: -20 dBFS, gain within +-3 dB.
    dbfs = 10.0 * torch.log10(wav.pow(2).mean() + 1e-9)
    gain = float(torch.clamp(target_dbfs - dbfs, -max_gain_db, max_gain_db))
    return wav * 10.0 ** (gain / 20.0)
