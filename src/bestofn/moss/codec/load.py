"""The audio codecs behind MOSS-TTS: ``Codec`` is what an engine needs: batched ``decode`` of
code sequences to audio and ``encode`` of a reference voice.

Engines get one with ``load_codec(codec_dir, device=..., n_vq=..., weight_dtype=...,
compute_dtype=..., decode_batch_size=...)``. Both MOSS codecs are MOSS-Audio-Tokenizer, v1
(24 kHz mono, 32 quantizers; the codec of MOSS-TTS Delay) and v2 (48 kHz stereo, of which
MOSS-TTS-Local v1.5 decodes 12 codebooks), and both run through our own batched
implementation, ``bestofn.moss.codec.tokenizer.MossAudioTokenizer`` (fp32 / bf16 / fp8), which
reads the version and the module list from ``codec_dir/config.json``. No remote code runs.
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
    kernels: str = "auto",
) -> Codec:
    """The ``Codec`` for ``codec_dir`` (see the module docstring for which class). Options as
    in config: ``codec_weight_dtype`` / ``codec_compute_dtype`` (fp32, bf16; fp8 for
    MOSS-Audio-Tokenizer on GPUs with fp8 matmuls), ``decode_batch_size``, ``kernels``
    (runtime ``codec_kernels``: auto, eager, compiled)."""
    import json

    path = Path(codec_dir).expanduser() / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (config field: codec_dir)")
    try:
        cfg = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e}) (config field: codec_dir)") from None
    from bestofn.moss.codec.tokenizer import MossAudioTokenizer, is_audio_tokenizer_config

    if not isinstance(cfg, dict) or not is_audio_tokenizer_config(cfg):
        raise ValueError(
            f"{path}: not a MOSS-Audio-Tokenizer (v1 or v2) config.json: it needs "
            "encoder_kwargs, decoder_kwargs, quantizer_kwargs and sampling_rate (config field: "
            "codec_dir)"
        )
    return MossAudioTokenizer(
        path.parent,
        device=device,
        compute_dtype=compute_dtype or "bf16",
        weight_dtype=weight_dtype,
        n_vq=n_vq,
        decode_batch_size=decode_batch_size,
        kernels=kernels,
    )
