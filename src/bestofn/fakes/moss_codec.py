"""Random-weight MOSS-Audio-Tokenizer-v2 checkpoints (the 48 kHz stereo codec of MOSS-TTS-Local
v1.5) in the published layout: ``config.json`` with the v2 module list and fields
(``number_channels`` 2, ``enable_channel_interleave``, a ``context_duration`` per stage) and
F32 safetensors under the published v2 key names (``self_attn.in_proj`` / ``out_proj``,
``ffn.0`` / ``ffn.2``, ``layer_scale_{1,2}.scale``, ``input_proj`` / ``output_proj`` in every
stage, weight-normalised quantizer projections ``parametrizations.weight.original0/1``).

``real``: the published architecture (the hub's v2 configuration defaults: six transformer
stages per side, 32 layers at 1280 then five of 12 layers at 768, patches 240 x 2^5, decoder
windows 125/250/400/400/400/400 steps; 32 quantizers of 1024 codes of dim 8; about 2.1 B
parameters, 8.5 GB: encoder and quantizer + decoder shards + index). ``tiny``: the same
module list with a few thousand times fewer parameters and short windows, so that every
stage's window bites on clips of a few dozen frames. Read by ``bestofn.moss.codec.tokenizer``
and, for parity, by the vendored published code; the weights are random, so decoded audio
is noise, but decode time and memory at ``real`` size are the real codec's.
"""

from __future__ import annotations

from pathlib import Path

from bestofn.fakes import check_size
from bestofn.fakes.moss_audio_tokenizer import _patch, _transformer, save

N_VQ = 32  # quantizers in the checkpoint; MOSS-TTS-Local decodes the first 12
CODEBOOK = {"tiny": 64, "real": 1024}

NOTE = """\
# Random-weight MOSS-Audio-Tokenizer-v2 ({size})

Written by `bestofn fake-weights` / `bestofn.fakes.moss_codec.write`: the published config.json
fields (v2 module list) and safetensors key layout of OpenMOSS-Team/MOSS-Audio-Tokenizer-v2
(48 kHz stereo, {n_vq} quantizers of {codebook} codes), RANDOM weights, decoded by our own code
(`bestofn.moss.codec.tokenizer`). Decoded audio is noise; decode time and memory are the real
codec's at `real` size.
"""


def _stage(inp: int, out: int, shape: tuple, duration: float) -> dict:
    return {**_transformer(inp, out, *shape), "context_duration": duration}


def config(size: str = "tiny", n_vq: int = N_VQ) -> dict:
    """config.json for ``size``; ``real`` has the published v2 architecture."""
    tiny = check_size(size)
    if tiny:
        big, small = (32, 2, 1, 64), (16, 2, 1, 32)  # d_model, heads, layers, ff
        # windows of 5, 10, 16, 16, 16, 16 steps: every stage's window bites at ~20 frames
        durations = (0.4, 0.4, 0.32, 0.16, 0.08, 0.04)
        q = dict(input_dim=24, rvq_dim=16, output_dim=24, codebook_dim=4)
        enc_widths = [(240, 8), (16, 8), (16, 8), (16, 8), (16, 16)]
        enc_last = (32, 24)
        dec_first = (24, 32)
        dec_widths = [(16, 16), (8, 16), (8, 16), (8, 16), (8, 240)]
    else:
        big, small = (1280, 20, 32, 5120), (768, 12, 12, 3072)
        durations = (10.0, 10.0, 8.0, 4.0, 2.0, 1.0)  # decoder order; the encoder's reversed
        q = dict(input_dim=768, rvq_dim=512, output_dim=768, codebook_dim=8)
        enc_widths = [(240, 384), (768, 384), (768, 384), (768, 384), (768, 640)]
        enc_last = (1280, 768)
        dec_first = (768, 1280)
        dec_widths = [(640, 768), (384, 768), (384, 768), (384, 768), (384, 240)]
    encoder = [_patch(240)]
    for (inp, out), duration in zip(enc_widths, durations[::-1], strict=False):
        encoder += [_stage(inp, out, small, duration), _patch(2)]
    encoder.append(_stage(*enc_last, big, durations[0]))
    decoder = [_stage(*dec_first, big, durations[0])]
    for (inp, out), duration in zip(dec_widths, durations[1:], strict=True):
        decoder += [_patch(2), _stage(inp, out, small, duration)]
    decoder.append(_patch(240))
    return {
        "architectures": ["MossAudioTokenizerModel"],
        "model_type": "moss-audio-tokenizer",
        "version": "v2",
        "sampling_rate": 48000,
        "downsample_rate": 3840,
        "number_channels": 2,
        "enable_channel_interleave": True,
        "causal_transformer_context_duration": 10.0,
        "encoder_kwargs": encoder,
        "decoder_kwargs": decoder,
        "quantizer_type": "rlfq",
        "quantizer_kwargs": {
            **q,
            "codebook_size": CODEBOOK[size],
            "num_quantizers": n_vq,
            "quantizer_type": "rlfq",
        },
        "code_dim": q["output_dim"],
        "dtype": "float32",
        "bestofn_random_weights": f"bestofn.fakes.moss_codec ({size})",
    }


def write(out_dir, size: str = "tiny", seed: int = 0) -> Path:
    """Write the v2 codec directory: config.json, safetensors (tiny: one file; real: two
    shards + model.safetensors.index.json), RANDOM_WEIGHTS.md."""
    out = Path(out_dir)
    cfg = config(size)
    save(out, cfg, seed, sharded=size != "tiny")
    (out / "RANDOM_WEIGHTS.md").write_text(
        NOTE.format(size=size, n_vq=N_VQ, codebook=CODEBOOK[size])
    )
    return out
