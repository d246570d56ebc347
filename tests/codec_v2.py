"""The tiny MOSS-Audio-Tokenizer-v2 of the codec tests (tests/moss/test_moss_codec_v2.py, the
one-shot decode; tests/moss/test_codec_stream.py, the service's streaming decode): its random
checkpoint in the published layout, the fp32 codec on it, random codes."""

from __future__ import annotations

from pathlib import Path

import torch

from bestofn.fakes import moss_codec
from bestofn.moss.codec.tokenizer import MossAudioTokenizer

CODEBOOK = moss_codec.CODEBOOK["tiny"]


def write_ckpt(tmp_path_factory) -> Path:
    return moss_codec.write(tmp_path_factory.mktemp("v2") / "MOSS-Audio-Tokenizer-v2", "tiny", 3)


def fp32_codec(ckpt: Path) -> MossAudioTokenizer:
    return MossAudioTokenizer(ckpt, compute_dtype="fp32", n_vq=12, decode_batch_size=8)


def clips(lengths, seed=0, n_vq=12) -> list[torch.Tensor]:
    """Random codes [n, n_vq] of each length."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, CODEBOOK, (n, n_vq), generator=g) for n in lengths]
