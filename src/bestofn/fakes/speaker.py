"""microsoft/wavlm-base-plus-sv with random weights, in its published layout.

On disk (``write``), as the published folder: ``config.json`` (``WavLMForXVector``),
``preprocessor_config.json`` (``Wav2Vec2FeatureExtractor``, 16 kHz) and the weights, written by
transformers' ``save_pretrained`` (``model.safetensors``; the published folder may hold
``pytorch_model.bin``, which the loader reads as well).

Real size: WavLM-Base-Plus (12 layers, width 768, x-vector TDNN 512-512-512-512-1500, 512-d
embedding), transformers' ``WavLMConfig`` defaults, which are the base model's. Tiny: one
16-wide layer, small convolutions and TDNN. Unknown here: the published
``preprocessor_config.json``'s ``do_normalize`` and ``return_attention_mask`` values; the tiny
and real folders write transformers' defaults (normalised input, attention masks: batched).
"""

from __future__ import annotations

from pathlib import Path

import torch

from bestofn.fakes import check_size

# `bestofn fake-weights` writes this backend's published checkpoint with ``write`` below
# (bestofn.fakes.weights finds this line)
FAKE_WEIGHTS = "wavlm-speaker"
FOLDER = "wavlm-base-plus-sv"


def config(tiny: bool):
    from transformers import WavLMConfig

    if not tiny:
        return WavLMConfig(architectures=["WavLMForXVector"])
    return WavLMConfig(
        architectures=["WavLMForXVector"],
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(16, 16, 16, 16, 16, 16, 16),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        num_buckets=32,
        max_bucket_distance=64,
        tdnn_dim=(16, 16, 16, 16, 32),
        xvector_output_dim=16,
        classifier_proj_size=16,
        num_labels=2,
    )


def feature_extractor():
    from transformers import Wav2Vec2FeatureExtractor

    return Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True,
        return_attention_mask=True,
    )  # fmt: skip


def build_model(tiny: bool, seed: int = 0):
    from transformers import WavLMForXVector

    torch.manual_seed(seed)
    return WavLMForXVector(config(tiny)).eval()


def build(device: str, size: str = "real", **kw):
    """A SpeakerScorer with random weights in memory."""
    from bestofn.backends.speaker import SpeakerScorer

    model = build_model(check_size(size))
    return SpeakerScorer.from_modules(model, feature_extractor(), device=device, **kw)


def write(out_dir, size: str = "tiny", seed: int = 0) -> dict:
    """``out_dir/wavlm-base-plus-sv``; returns the scorer options."""
    folder = Path(out_dir) / FOLDER
    build_model(check_size(size), seed + 7).save_pretrained(folder)
    feature_extractor().save_pretrained(folder)
    return {"model_path": str(folder.resolve())}
