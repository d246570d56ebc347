"""Shape and token facts of a MOSS-TTS-Local checkpoint, read from its published config.json.

The published config nests a Qwen3 config (backbone) and a GPT-2 style config (the local "depth"
transformer that emits the codebooks of one frame). We read only what inference needs and fill
the defaults the reference code would use (transformers' Qwen3Config / GPT2Config defaults).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Self


class HfJsonConfig:
    """``from_json`` for a config dataclass that reads a published config.json with
    ``from_hf_dict``."""

    @classmethod
    def from_json(cls, path: str | Path) -> Self:
        with open(path, encoding="utf-8") as f:
            return cls.from_hf_dict(json.load(f))


def qwen3_fields(
    q: dict,
    *,
    num_layers: int,
    intermediate_size: int,
    rope_keys: tuple[str, ...] = ("rope_scaling", "rope_parameters"),
) -> dict:
    """The backbone fields (hidden_size .. rms_norm_eps) of a published nested Qwen3 config
    ``q``; ``num_layers`` and ``intermediate_size`` are the defaults where ``q`` has none, and
    ``rope_theta`` falls back to the first of ``rope_keys`` (sub-dicts) that holds it."""
    hidden = int(q.get("hidden_size", 4096))
    heads = int(q.get("num_attention_heads", 32))
    rope_theta = q.get("rope_theta")
    for key in rope_keys:
        if rope_theta is None and isinstance(q.get(key), dict):
            rope_theta = q[key].get("rope_theta")
    return {
        "hidden_size": hidden,
        "num_layers": int(q.get("num_hidden_layers", num_layers)),
        "num_heads": heads,
        "num_kv_heads": int(q.get("num_key_value_heads", heads)),
        "head_dim": int(q.get("head_dim") or hidden // heads),
        "intermediate_size": int(q.get("intermediate_size", intermediate_size)),
        "vocab_size": int(q.get("vocab_size", 151936)),
        "rope_theta": float(rope_theta if rope_theta is not None else 1_000_000.0),
        "rms_norm_eps": float(q.get("rms_norm_eps", 1e-6)),
    }


def qwen3_hf_dict(c, *, tie_word_embeddings: bool) -> dict:
    """The nested Qwen3 (backbone) config in the published layout, from a config with the
    backbone fields of ``qwen3_fields``."""
    return {
        "model_type": "qwen3",
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.intermediate_size,
        "vocab_size": c.vocab_size,
        "rope_theta": c.rope_theta,
        "rms_norm_eps": c.rms_norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": tie_word_embeddings,
        "max_position_embeddings": 40960,
    }


@dataclass
class MossLocalConfig(HfJsonConfig):
    # backbone (Qwen3)
    hidden_size: int = 2560
    num_layers: int = 36
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 9728
    vocab_size: int = 151936
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    # local transformer (GPT-2 shaped, RoPE or learned positions)
    local_layers: int = 1
    local_heads: int = 32
    local_inner: int = 9728
    local_activation: str = "silu"
    local_ln_eps: float = 1e-6
    local_positions: str = "rope"  # "rope" (interleaved, GPT-J style) or "absolute" (wpe)
    local_rope_base: float = 1_000_000.0
    # audio
    n_vq: int = 12
    audio_codebook_sizes: list[int] = field(default_factory=lambda: [1024] * 12)
    audio_pad_code: int = 1024
    sampling_rate: int = 48_000
    frame_rate: float = 12.5
    local_text_head_mode: str = "binary"
    # special tokens
    pad_token_id: int = 151643
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    audio_start_token_id: int = 151669
    audio_end_token_id: int = 151670
    audio_user_slot_token_id: int = 151654
    audio_assistant_slot_token_id: int = 151656

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.hidden_size % self.local_heads:
            raise ValueError("hidden_size must be divisible by local_heads")
        if len(self.audio_codebook_sizes) != self.n_vq:
            raise ValueError("audio_codebook_sizes must have n_vq entries")
        if self.audio_pad_code < max(self.audio_codebook_sizes):
            raise ValueError("audio_pad_code must lie outside every codebook")
        if self.local_positions not in ("rope", "absolute"):
            raise ValueError(f"unknown local position type {self.local_positions!r}")

    @property
    def local_head_dim(self) -> int:
        return self.hidden_size // self.local_heads

    @property
    def audio_vocab(self) -> int:
        return max(self.audio_codebook_sizes)

    # ---- published config.json <-> this dataclass -------------------------------------------

    @classmethod
    def from_hf_dict(cls, cfg: dict) -> MossLocalConfig:
        q = cfg.get("qwen3_config") or cfg.get("language_config") or {}
        g = cfg.get("gpt2_config") or {}
        backbone = qwen3_fields(q, num_layers=32, intermediate_size=22016)
        hidden = backbone["hidden_size"]
        n_vq = int(cfg.get("n_vq", 12))
        sizes = cfg.get("audio_codebook_sizes") or [int(cfg.get("audio_vocab_size", 1024))] * n_vq
        local_hidden = int(g.get("n_embd", g.get("hidden_size", hidden)))
        if local_hidden != hidden:
            raise ValueError("local transformer width must equal backbone width (tied embeddings)")
        slot = cfg.get("audio_assistant_gen_slot_token_id")
        if slot is None:
            slot = cfg.get("audio_assistant_slot_token_id", 151656)
        return cls(
            **backbone,
            local_layers=int(cfg.get("local_transformer_layers", g.get("n_layer", 1))),
            local_heads=int(g.get("n_head", g.get("num_attention_heads", max(1, hidden // 80)))),
            local_inner=int(g.get("n_inner") or 4 * hidden),
            local_activation=str(g.get("activation_function", "gelu_new")),
            local_ln_eps=float(g.get("layer_norm_epsilon", 1e-5)),
            local_positions=str(g.get("position_embedding_type", "absolute")).lower(),
            local_rope_base=float(g.get("rope_base", 10000.0)),
            n_vq=n_vq,
            audio_codebook_sizes=[int(s) for s in sizes],
            audio_pad_code=int(cfg.get("audio_pad_code", cfg.get("audio_pad_token_id", 1024))),
            sampling_rate=int(cfg.get("sampling_rate", 48000)),
            local_text_head_mode=_text_head_mode(cfg.get("local_text_head_mode", "binary")),
            pad_token_id=int(cfg.get("pad_token_id", 151643)),
            im_start_token_id=int(cfg.get("im_start_token_id", 151644)),
            im_end_token_id=int(cfg.get("im_end_token_id", 151645)),
            audio_start_token_id=int(cfg.get("audio_start_token_id", 151669)),
            audio_end_token_id=int(cfg.get("audio_end_token_id", 151670)),
            audio_user_slot_token_id=int(cfg.get("audio_user_slot_token_id", 151654)),
            audio_assistant_slot_token_id=int(slot),
        )

    def to_hf_dict(self) -> dict:
        """A config.json in the published layout (what the reference remote code reads)."""
        qwen3 = qwen3_hf_dict(self, tie_word_embeddings=True)
        gpt2 = {
            "model_type": "gpt2",
            "vocab_size": self.vocab_size,
            "n_embd": self.hidden_size,
            "n_layer": self.local_layers,
            "n_head": self.local_heads,
            "n_inner": self.local_inner,
            "n_positions": self.n_vq + 1,
            "n_ctx": self.n_vq + 1,
            "activation_function": self.local_activation,
            "layer_norm_epsilon": self.local_ln_eps,
            "position_embedding_type": self.local_positions,
            "rope_base": self.local_rope_base,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }
        return {
            "architectures": ["MossTTSLocalModel"],
            "model_type": "moss_tts_local",
            "qwen3_config": qwen3,
            "gpt2_config": gpt2,
            "n_vq": self.n_vq,
            "audio_vocab_size": self.audio_vocab,
            "audio_codebook_sizes": list(self.audio_codebook_sizes),
            "audio_pad_token_id": self.audio_pad_code,
            "pad_token_id": self.pad_token_id,
            "im_start_token_id": self.im_start_token_id,
            "im_end_token_id": self.im_end_token_id,
            "audio_start_token_id": self.audio_start_token_id,
            "audio_end_token_id": self.audio_end_token_id,
            "audio_user_slot_token_id": self.audio_user_slot_token_id,
            "audio_assistant_slot_token_id": self.audio_assistant_slot_token_id,
            "sampling_rate": self.sampling_rate,
            "local_transformer_layers": self.local_layers,
            "local_text_head_mode": self.local_text_head_mode,
            "tie_word_embeddings": True,
        }

    def to_dict(self) -> dict:
        return asdict(self)


def _text_head_mode(value) -> str:
    v = str(value or "full_vocab").strip().lower()
    return "full_vocab" if v in ("full", "full-vocab", "vocab", "full_vocab") else v


def local_v15_config() -> MossLocalConfig:
    """The real MOSS-TTS-Local-Transformer-v1.5 shape (Qwen3-4B backbone, 1-layer local)."""
    return MossLocalConfig()
