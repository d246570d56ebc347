"""Whisper-Small encoder shapes shared by the Whisper-based scorers' random-weight builders
(BUD-E-Whisper keeps openai/whisper-small's encoder shape), plus a seconds-on-CPU tiny one."""

from __future__ import annotations


def whisper_encoder_shape(tiny: bool = False):
    """(WhisperConfig, WhisperFeatureExtractor): real Whisper-Small (80 mels, 30 s window) or a
    tiny variant with the same structure (16 mels, 3 s window)."""
    from transformers import WhisperConfig, WhisperFeatureExtractor

    if tiny:
        cfg = WhisperConfig(
            d_model=16,
            encoder_layers=1,
            encoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_layers=1,
            decoder_attention_heads=2,
            decoder_ffn_dim=32,
            num_mel_bins=16,
            max_source_positions=150,
        )
        return cfg, WhisperFeatureExtractor(feature_size=16, chunk_length=3)
    cfg = WhisperConfig(
        d_model=768,
        encoder_layers=12,
        encoder_attention_heads=12,
        encoder_ffn_dim=3072,
        num_mel_bins=80,
        max_source_positions=1500,
    )
    return cfg, WhisperFeatureExtractor(feature_size=80, chunk_length=30)
