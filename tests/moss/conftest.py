"""Fixtures of the v2 codec tests (tests/moss/test_moss_codec_v2.py, test_codec_stream.py):
the tiny v2 checkpoint and its fp32 codec (test_moss_audio_tokenizer.py has its own v1 ``ckpt``
and ``codec``, which override these there), and the kernels under Triton's interpreter."""

from __future__ import annotations

from pathlib import Path

import codec_v2
import pytest

from bestofn.moss.codec.tokenizer import MossAudioTokenizer


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return codec_v2.write_ckpt(tmp_path_factory)


@pytest.fixture(scope="module")
def codec(ckpt) -> MossAudioTokenizer:
    return codec_v2.fp32_codec(ckpt)


@pytest.fixture
def interpreted_kernels(triton_interpreter, monkeypatch):
    """``bestofn.moss.codec.kernels`` imported anew under Triton's interpreter, and the compiled
    path's (heads, attend, add_norm) built from it: (module, heads, attend, add_norm). The
    module leaves ``sys.modules`` again, so a later import builds its kernels as before."""
    import sys

    monkeypatch.delitem(sys.modules, "bestofn.moss.codec.kernels", raising=False)
    from bestofn.moss.codec import kernels as codec_triton
    from bestofn.moss.codec import layers as codec_layers

    monkeypatch.setattr(codec_layers, "_COMPILED", {})  # the compiled path's pieces, anew
    heads, attend, add_norm = codec_layers.layer_pieces("compiled")
    monkeypatch.delitem(sys.modules, "bestofn.moss.codec.kernels")
    return codec_triton, heads, attend, add_norm
