"""Empathic-Insight-Voice-Plus with random weights: the BUD-E-Whisper encoder and the heads.

On disk (``write``), as published:

    BUD-E-Whisper/                 a full WhisperForConditionalGeneration checkpoint
                                   (config.json, model.safetensors, preprocessor_config.json)
    Empathic-Insight-Voice-Plus/   model_<Name>_best.pth per head: plain state dicts
                                   proj.* then mlp.{2,5,8,11}.*; emotion heads read the
                                   flattened encoder states, quality heads the pooled ones

Real size: Whisper-Small and 55 emotion + 4 quality heads (each emotion head is 295 MB, as
published: ~17 GB in all). Tiny: a 1-layer 16-wide Whisper (3 s window) and 2 + 2 heads.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch

from bestofn.fakes import check_size

# `bestofn fake-weights` writes this backend's published checkpoint with ``write`` below
# (bestofn.fakes.weights finds this line)
FAKE_WEIGHTS = "empathic-insight"
QUALITY_HEADS = (
    "score_overall_quality",
    "score_speech_quality",
    "score_background_quality",
    "score_content_enjoyment",
)
NAMED_EMOTION_HEADS = (  # published names we know of; the rest are numbered
    "Anger",
    "Jealousy_&_Envy",
    "Gender",
    "Hope_Enthusiasm_Optimism",
    "Intoxication_Altered_States_of_Consciousness",
)
N_HEADS = {"tiny": (2, 2), "real": (55, 4)}  # (emotion, quality)


def random_head_state(
    in_dim: int,
    proj: int = 64,
    hidden=(64, 32, 16),
    device="cpu",
    dtype=torch.float32,
    generator: torch.Generator | None = None,
    compiled: bool = False,
) -> dict:
    """A random head in the published key layout (``compiled`` adds the ``_orig_mod.`` prefix)."""
    dims = [in_dim, proj, *hidden, 1]
    keys = ["proj"] + [
        f"mlp.{2 + 3 * i}" for i in range(len(hidden) + 1)
    ]  # Linear slots of the Sequential
    sd = {}
    for key, d_in, d_out in zip(keys, dims[:-1], dims[1:], strict=True):
        bound = d_in**-0.5
        sd[f"{key}.weight"] = (
            torch.rand(d_out, d_in, generator=generator, device=device, dtype=dtype) * 2 - 1
        ) * bound
        sd[f"{key}.bias"] = (
            torch.rand(d_out, generator=generator, device=device, dtype=dtype) * 2 - 1
        ) * bound
    prefix = "_orig_mod." if compiled else ""
    return OrderedDict((prefix + k, v) for k, v in sd.items())


def head_names(n_emotion: int, n_quality: int) -> tuple[list[str], list[str]]:
    emotion = list(NAMED_EMOTION_HEADS[:n_emotion])
    emotion += [f"Emotion_{i:02d}" for i in range(len(emotion), n_emotion)]
    return emotion, list(QUALITY_HEADS[:n_quality])


def build(
    device: str, size: str = "real", n_emotion_heads: int = 55, n_quality_heads: int = 4, **kw
):
    """An EmpathicInsightScorer with random weights in memory: Whisper-Small encoder with 55
    full-sequence + 4 pooled heads (real), or the tiny encoder (3 s window)."""
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    from bestofn.backends.empathic import EmpathicInsightScorer
    from bestofn.fakes.whisper import whisper_small

    cfg, fe = whisper_small(check_size(size))
    cfg._attn_implementation = "sdpa"
    dtype = kw.pop("dtype", None) or ("bfloat16" if str(device).startswith("cuda") else "float32")
    encoder = WhisperEncoder(cfg).to(device, getattr(torch, dtype))
    # heads are made on the device in the target dtype: 55 fp32 heads on the host are 16 GB
    hd = getattr(torch, dtype)
    flat = cfg.max_source_positions * cfg.d_model
    heads = {
        f"emotion_{i:02d}": random_head_state(flat, device=device, dtype=hd)
        for i in range(n_emotion_heads)
    }
    heads |= {
        f"score_quality_{i}": random_head_state(4 * cfg.d_model, device=device, dtype=hd)
        for i in range(n_quality_heads)
    }
    return EmpathicInsightScorer.from_modules(encoder, fe, heads, device=device, dtype=dtype, **kw)


def write(out_dir, size: str = "tiny", seed: int = 0) -> dict:
    """``out_dir/BUD-E-Whisper`` and ``out_dir/Empathic-Insight-Voice-Plus``; returns the
    scorer options."""
    from transformers import WhisperForConditionalGeneration

    from bestofn.fakes.whisper import whisper_small

    cfg, fe = whisper_small(check_size(size))
    out = Path(out_dir)
    encoder_dir, heads_dir = out / "BUD-E-Whisper", out / "Empathic-Insight-Voice-Plus"
    torch.manual_seed(seed)
    # BUD-E-Whisper is a full ASR checkpoint; the scorer pulls the encoder out of it
    WhisperForConditionalGeneration(cfg).save_pretrained(encoder_dir)
    fe.save_pretrained(encoder_dir)

    heads_dir.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed + 3)
    emotion, quality = head_names(*N_HEADS[size])
    flat, pooled = cfg.max_source_positions * cfg.d_model, 4 * cfg.d_model
    for i, name in enumerate(emotion + quality):
        in_dim = flat if name in emotion else pooled
        # published files carry torch.compile's prefix on some heads: write both kinds
        state = random_head_state(in_dim, generator=g, compiled=i % 2 == 1)
        torch.save(state, heads_dir / f"model_{name}_best.pth")
    return {"encoder_path": str(encoder_dir.resolve()), "heads_path": str(heads_dir.resolve())}
