"""Whisper-Small shapes shared by the Whisper-based scorers' random-weight builders (BUD-E-Whisper
keeps openai/whisper-small's shape; VoiceCLAP's audio tower is BUD-E-Whisper-Small), plus a
seconds-on-CPU tiny variant with the same structure."""

from __future__ import annotations


def whisper_small(tiny: bool = False):
    """(WhisperConfig, WhisperFeatureExtractor): Whisper-Small (80 mels, 30 s window, 12 + 12
    layers of 768) or a tiny variant (16 mels, 3 s window, 1 + 1 layers of 16). The decoder
    sizes matter only where a full checkpoint is written (BUD-E-Whisper ships one)."""
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
            vocab_size=64,
            max_target_positions=16,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
        )
        return cfg, WhisperFeatureExtractor(feature_size=16, chunk_length=3)
    cfg = WhisperConfig(
        d_model=768,
        encoder_layers=12,
        encoder_attention_heads=12,
        encoder_ffn_dim=3072,
        decoder_layers=12,
        decoder_attention_heads=12,
        decoder_ffn_dim=3072,
        num_mel_bins=80,
        max_source_positions=1500,
        max_target_positions=448,
    )
    return cfg, WhisperFeatureExtractor(feature_size=80, chunk_length=30)
