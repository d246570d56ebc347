"""Random-weight MOSS-Audio-Tokenizer checkpoints (the 24 kHz codec of MOSS-TTS Delay) in the
published layout: ``config.json`` (the published fields and, at ``real`` size, the published
values) and safetensors with the published key names (weight-normalised 1x1 convolutions as
``parametrizations.weight.original0/1``, fused attention ``in_projs.0``), fp32.

``real``: the published architecture (about 1.8 B parameters, 7 GB; two shards + index);
``tiny``: the same structure, a few thousand times smaller, with a short attention context so
the sliding window is exercised on clips of a few dozen frames. Read by
``bestofn.moss.codec.tokenizer.MossAudioTokenizer`` and by the published code alike.
"""

from __future__ import annotations

import json
from pathlib import Path

from bestofn.fakes import check_size

NOTE = """\
# Random-weight MOSS-Audio-Tokenizer ({size})

Written by `bestofn fake-weights` / `bestofn.fakes.moss_audio_tokenizer.write`: the published
config.json fields and safetensors key layout of OpenMOSS-Team/MOSS-Audio-Tokenizer (24 kHz,
{n_vq} quantizers of {codebook} codes), RANDOM weights. Decoded audio is noise; decode time and
memory are the real codec's at `real` size.
"""


def _transformer(inp: int, out: int, d: int, heads: int, layers: int, ff: int) -> dict:
    return {
        "module_type": "Transformer",
        "input_dimension": inp,
        "output_dimension": out,
        "d_model": d,
        "num_heads": heads,
        "num_layers": layers,
        "dim_feedforward": ff,
        "causal": True,
        "norm": "layer_norm",
        "positional_embedding": "rope",
        "max_period": 10000,
        "gating": "none",
        "layer_scale": 0.01,
        "conv_layout": True,
    }


def _patch(n: int) -> dict:
    return {"module_type": "PatchedPretransform", "patch_size": n}


def config(size: str = "tiny", n_vq: int = 32, codebook_size: int | None = None) -> dict:
    """config.json for ``size``; ``real`` is the published one (n_vq 32, codebook 1024)."""
    tiny = check_size(size)
    if tiny:
        big, small = (32, 2, 2, 64), (32, 2, 2, 64)  # d_model, heads, layers, ff
        patches, duration = (8, 2), 0.004  # contexts of 12 and 6 steps: windows bite
        q = dict(input_dim=24, rvq_dim=16, output_dim=24, codebook_dim=4)
        codebook = 64 if codebook_size is None else codebook_size
    else:
        big, small = (1280, 20, 32, 5120), (768, 12, 12, 3072)
        patches, duration = (240, 2, 2, 2), 10
        q = dict(input_dim=768, rvq_dim=512, output_dim=768, codebook_dim=8)
        codebook = 1024 if codebook_size is None else codebook_size
    encoder, decoder = [], []
    if tiny:
        encoder = [
            _patch(8),
            _transformer(8, 16, *small),
            _patch(2),
            _transformer(32, 24, *big),
        ]
        decoder = [
            _transformer(24, 32, *big),
            _patch(2),
            _transformer(16, 8, *small),
            _patch(8),
        ]
    else:
        # encoder: 240 -> 384 | x2 -> 768 -> 384 | x2 -> 768 -> 640 | x2 -> 1280 -> 768
        encoder = [_patch(240), _transformer(240, 384, *small)]
        for inp, out in ((768, 384), (768, 640)):
            encoder += [_patch(2), _transformer(inp, out, *small)]
        encoder += [_patch(2), _transformer(1280, 768, *big)]
        # decoder: 768 -> 1280 | /2 640 -> 768 | /2 384 -> 768 | /2 384 -> 768 | /2 384 -> 240
        decoder = [_transformer(768, 1280, *big)]
        for out in (768, 768, 240):
            decoder += [_patch(2), _transformer(decoder[-1]["output_dimension"] // 2, out, *small)]
        decoder += [_patch(240)]
    hop = 1
    for p in patches:
        hop *= p
    return {
        "architectures": ["MossAudioTokenizerModel"],
        "auto_map": {
            "AutoConfig": "configuration_moss_audio_tokenizer.MossAudioTokenizerConfig",
            "AutoModel": "modeling_moss_audio_tokenizer.MossAudioTokenizerModel",
        },
        "causal_transformer_context_duration": duration,
        "code_dim": q["output_dim"],
        "decoder_kwargs": decoder,
        "downsample_rate": hop,
        "dtype": "float32",
        "encoder_kwargs": encoder,
        "model_type": "speech_tokenizer",
        "quantizer_kwargs": {
            **q,
            "codebook_size": codebook,
            "num_quantizers": n_vq,
            "quantizer_type": "rlfq",
        },
        "quantizer_type": "rlfq",
        "reversed_decoder_kwargs": encoder,
        "sample_rate": 24000,
        "sampling_rate": 24000,
        "bestofn_random_weights": f"bestofn.fakes.moss_audio_tokenizer ({size})",
    }


# The per-layer key names each version's published checkpoint uses.
KEYS = {
    "v1": ("self_attn.in_projs.0", "self_attn.out_projs.0", "linear1", "linear2"),
    "v2": ("self_attn.in_proj", "self_attn.out_proj", "ffn.0", "ffn.2"),
}


def _transformer_tensors(prefix: str, s: dict, g, version: str = "v1") -> dict:
    import torch

    def lin(out, inp):
        return torch.randn(out, inp, generator=g) / inp**0.5

    d, ff = s["d_model"], s["dim_feedforward"]
    qkv, o, fc1, fc2 = KEYS[version]
    t = {}
    # v2 always has both projections; v1 only where the width differs
    if s["input_dimension"] != d or version == "v2":
        t[f"{prefix}.input_proj.weight"] = lin(d, s["input_dimension"])
    if s["output_dimension"] != d or version == "v2":
        t[f"{prefix}.output_proj.weight"] = lin(s["output_dimension"], d)
    for i in range(s["num_layers"]):
        p = f"{prefix}.transformer.layers.{i}"
        t[f"{p}.{qkv}.weight"] = lin(3 * d, d)
        t[f"{p}.{o}.weight"] = lin(d, d)
        t[f"{p}.{fc1}.weight"] = lin(ff, d)
        t[f"{p}.{fc2}.weight"] = lin(d, ff)
        for n in ("norm1", "norm2"):
            t[f"{p}.{n}.weight"] = 1 + 0.1 * torch.randn(d, generator=g)
            t[f"{p}.{n}.bias"] = 0.1 * torch.randn(d, generator=g)
        for n in ("layer_scale_1", "layer_scale_2"):
            # larger than the 0.01 init, so the random branches matter to the output
            t[f"{p}.{n}.scale"] = 0.1 + 0.05 * torch.rand(d, generator=g)
    return t


def _weight_norm_conv(prefix: str, out: int, inp: int, g) -> dict:
    import torch

    v = torch.randn(out, inp, 1, generator=g)
    return {
        f"{prefix}.parametrizations.weight.original0": 0.5 + torch.rand(out, 1, 1, generator=g),
        f"{prefix}.parametrizations.weight.original1": v,
        f"{prefix}.bias": 0.1 * torch.randn(out, generator=g),
    }


def state_dict(cfg: dict, seed: int = 0, parts=("encoder", "quantizer", "decoder")) -> dict:
    """Random tensors under the published key names (of the version ``cfg`` describes), for
    the ``parts`` asked."""
    import torch

    from bestofn.moss.codec.config import codec_version

    version = codec_version(cfg)
    g = torch.Generator().manual_seed(seed)
    t = {}
    if "encoder" in parts:
        for i, s in enumerate(cfg["encoder_kwargs"]):
            if s["module_type"] == "Transformer":
                t.update(_transformer_tensors(f"encoder.{i}", s, g, version))
    if "quantizer" in parts:
        q = cfg["quantizer_kwargs"]
        if q["input_dim"] != q["rvq_dim"]:
            t.update(_weight_norm_conv("quantizer.input_proj", q["rvq_dim"], q["input_dim"], g))
        if q["rvq_dim"] != q["output_dim"]:
            t.update(_weight_norm_conv("quantizer.output_proj", q["output_dim"], q["rvq_dim"], g))
        for i in range(q["num_quantizers"]):
            p = f"quantizer.quantizers.{i}"
            if q["rvq_dim"] != q["codebook_dim"]:
                t.update(_weight_norm_conv(f"{p}.in_proj", q["codebook_dim"], q["rvq_dim"], g))
                t.update(_weight_norm_conv(f"{p}.out_proj", q["rvq_dim"], q["codebook_dim"], g))
            # later quantizers refine: smaller entries, as a residual quantizer's codebooks
            scale = 1.0 / (1 + i) ** 0.5
            t[f"{p}.codebook.weight"] = scale * torch.randn(
                q["codebook_size"], q["codebook_dim"], generator=g
            )
    if "decoder" in parts:
        for i, s in enumerate(cfg["decoder_kwargs"]):
            if s["module_type"] == "Transformer":
                t.update(_transformer_tensors(f"decoder.{i}", s, g, version))
    return t


def save(out: Path, cfg: dict, seed: int, sharded: bool) -> Path:
    """config.json + random safetensors for ``cfg`` into ``out``: one model.safetensors, or
    (``sharded``) the encoder in one shard, quantizer + decoder in another, plus the index."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    meta = {"format": "pt"}
    if not sharded:
        save_file(state_dict(cfg, seed), str(out / "model.safetensors"), metadata=meta)
        return out
    weight_map = {}
    shards = (("encoder",), ("quantizer", "decoder"))
    for n, parts in enumerate(shards, 1):
        name = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
        tensors = state_dict(cfg, seed + n, parts)
        save_file(tensors, str(out / name), metadata=meta)
        weight_map.update(dict.fromkeys(tensors, name))
        del tensors
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return out


def write(
    out_dir,
    size: str = "tiny",
    seed: int = 0,
    n_vq: int = 32,
    codebook_size: int | None = None,
    config_overrides: dict | None = None,
) -> Path:
    """Write config.json + safetensors (tiny: model.safetensors; real: 2 shards + index)."""
    out = Path(out_dir)
    cfg = {**config(size, n_vq, codebook_size), **(config_overrides or {})}
    save(out, cfg, seed, sharded=size != "tiny")
    q = cfg["quantizer_kwargs"]
    (out / "RANDOM_WEIGHTS.md").write_text(
        NOTE.format(size=size, n_vq=q["num_quantizers"], codebook=q["codebook_size"])
    )
    return out
