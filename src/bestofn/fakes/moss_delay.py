"""MOSS-TTS v1.5 Delay (8B) with random weights: configs, state dicts and checkpoint
directories in the published layout (OpenMOSS/MOSS-TTS ``moss_tts_delay/``).

- ``tiny_config()``: a small ``MossDelayConfig`` (4 codebooks of 16) for engine tests and
  ``bestofn parity``. Its text vocabulary keeps the real size's special ids (151643..151662):
  the published ``generate`` indexes the delay slot by its literal id 151662.
- ``SIZES``: ``real`` = Qwen3-8B backbone (hidden 4096, 36 layers, 32 query / 8 KV heads of
  128, SwiGLU 12288, vocab 151936) with 32 codebooks of 1024 (+1 pad row); ``tiny`` = the
  32 codebooks of 64 (as the tiny MOSS-Audio-Tokenizer) on a 2-layer, 32-wide backbone.

A checkpoint directory holds config.json (published keys + ``auto_map``), the weights
(model.safetensors, or 4 GiB shards + index at real size), a tokenizer whose MOSS specials sit
at the published ids (text: bytes tiny, GPT-2's BPE real, as ``bestofn.fakes.moss``), a
Qwen-style chat template and processor_config.json. The remote code is not ours:
``add_remote_code`` copies it from a copy of ``moss_tts_delay/``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from bestofn.fakes import check_size
from bestofn.fakes.moss import (
    copy_remote_code,
    qwen3_layer_tensors,
    text_tokenizer,
    write_safetensors,
)
from bestofn.moss.delay import MossDelayConfig

SIZES = {
    "real": dict(hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, inner=12288,
                 vocab=151936, n_vq=32, codebook=1024),
    "tiny": dict(hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, inner=64,
                 vocab=151680, n_vq=32, codebook=64),
}  # fmt: skip
INIT_STD = {"tiny": 0.2, "real": 0.02}
SHARD_BYTES = {"tiny": None, "real": 4 * 2**30}
REMOTE_CODE_FILES = (
    "configuration_moss_tts.py",
    "modeling_moss_tts.py",
    "inference_utils.py",
    "processing_moss_tts.py",
    "tts_robust_normalizer_single_script.py",
)
SPECIAL_NAMES = {  # published ids (configuration_moss_tts.py defaults) -> token text here
    "pad_token_id": "<|endoftext|>",
    "im_start_token_id": "<|im_start|>",
    "im_end_token_id": "<|im_end|>",
    "audio_start_token_id": "<|audio_start|>",
    "audio_end_token_id": "<|audio_end|>",
    "audio_user_slot_token_id": "<|audio_user_slot|>",
    "audio_assistant_gen_slot_token_id": "<|audio_assistant_gen_slot|>",
    "audio_assistant_delay_slot_token_id": "<|audio_assistant_delay_slot|>",
}
# Qwen's chat template reduced to what the processor renders (one message, optional prompt)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_config(n_vq: int = 4, codebook: int = 16, vocab_size: int = 151680) -> MossDelayConfig:
    return MossDelayConfig(
        hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
        intermediate_size=48, vocab_size=vocab_size, rope_theta=10000.0, n_vq=n_vq,
        audio_vocab_size=codebook, audio_pad_code=codebook,
    )  # fmt: skip


def size_config(size: str) -> MossDelayConfig:
    check_size(size)
    s = SIZES[size]
    return MossDelayConfig(
        hidden_size=s["hidden"], num_layers=s["layers"], num_heads=s["heads"],
        num_kv_heads=s["kv_heads"], head_dim=s["head_dim"], intermediate_size=s["inner"],
        vocab_size=s["vocab"], n_vq=s["n_vq"], audio_vocab_size=s["codebook"],
        audio_pad_code=s["codebook"],
    )  # fmt: skip


def published_config(cfg: MossDelayConfig) -> dict:
    return {
        **cfg.to_hf_dict(),
        "auto_map": {
            "AutoConfig": "configuration_moss_tts.MossTTSDelayConfig",
            "AutoModel": "modeling_moss_tts.MossTTSDelayModel",
        },
    }


def random_tensors(
    cfg: MossDelayConfig,
    seed: int = 0,
    std: float = 0.2,
    always_continue: bool = False,
    start_audio: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Published-layout tensors, float32 on the CPU, one at a time (an 8B checkpoint is
    written without holding it in memory). ``always_continue``: inside an audio block the text
    head always prefers the gen slot to the delay slot (benchmarks: takes run to the budget on
    both engines): every text embedding carries +30 in dimension 0, which dominates that
    dimension of the final hidden, and the two slot rows of the text head read it as +-10.
    ``start_audio`` (implied by it): after "assistant\n" the text head picks audio_start (its
    row reads that dimension as +10), as a trained model does; the random gen/delay choice
    then ends takes after a few frames."""
    start_audio = start_audio or always_continue
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=std):
        return torch.randn(*shape, generator=g) * scale

    H, V1 = cfg.hidden_size, cfg.audio_vocab_size + 1
    p = "language_model."
    embed = rnd(cfg.vocab_size, H, scale=1.0)
    if start_audio:
        embed[:, 0] += 30.0
    yield p + "embed_tokens.weight", embed
    yield from qwen3_layer_tensors(cfg, p, rnd)
    for k in range(cfg.n_vq):
        yield f"emb_ext.{k}.weight", rnd(V1, H, scale=1.0 / cfg.n_vq**0.5)
    text_head = rnd(cfg.vocab_size, H, scale=1.0 / H**0.5)
    if start_audio:
        text_head[cfg.audio_start_token_id, 0] = 10.0
    if always_continue:
        text_head[cfg.audio_assistant_gen_slot_token_id, 0] = 10.0
        text_head[cfg.audio_assistant_delay_slot_token_id, 0] = -10.0
    yield "lm_heads.0.weight", text_head
    for k in range(cfg.n_vq):
        yield f"lm_heads.{k + 1}.weight", rnd(V1, H, scale=3.0 / H**0.5)


def random_state_dict(cfg: MossDelayConfig, seed: int = 0, std: float = 0.2) -> dict:
    return dict(random_tensors(cfg, seed, std))


def write_tokenizer(out: Path, cfg: MossDelayConfig, size: str = "tiny") -> None:
    """The MOSS specials at the config's ids over ``bestofn.fakes.moss.text_tokenizer``'s text
    vocabulary (bytes tiny, GPT-2's BPE real: the stand-in for Qwen3's), with the chat template."""
    from transformers import PreTrainedTokenizerFast

    specials = {name: getattr(cfg, field) for field, name in SPECIAL_NAMES.items()}
    tok = text_tokenizer(size, specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>",
                                   eos_token="<|im_end|>")  # fmt: skip
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def write_model(out_dir, size: str = "tiny", seed: int = 0, codec_dir=None,
                cfg: MossDelayConfig | None = None, shard_bytes="auto",
                always_continue: bool = False) -> Path:  # fmt: skip
    """A Delay checkpoint directory with random weights (float32 tiny, bfloat16 real)."""
    tiny = check_size(size)
    cfg = cfg or size_config(size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(published_config(cfg), indent=1))
    write_tokenizer(out, cfg, size)
    processor_config = {
        "processor_class": "MossTTSDelayProcessor",
        "auto_map": {"AutoProcessor": "processing_moss_tts.MossTTSDelayProcessor"},
        "audio_tokenizer_name_or_path": str(codec_dir or "OpenMOSS-Team/MOSS-Audio-Tokenizer"),
    }
    (out / "processor_config.json").write_text(json.dumps(processor_config, indent=1))
    if shard_bytes == "auto":
        shard_bytes = SHARD_BYTES[size]
    dtype = torch.float32 if tiny else torch.bfloat16
    tensors = random_tensors(cfg, seed, INIT_STD[size], always_continue, start_audio=True)
    write_safetensors(out, tensors, dtype, shard_bytes)
    return out


def add_remote_code(model_dir, code_dir) -> Path:
    """Copy the published Delay code (a copy of ``moss_tts_delay/``) into ``model_dir``."""
    expected = "OpenMOSS/MOSS-TTS moss_tts_delay/"
    return copy_remote_code(model_dir, code_dir, REMOTE_CODE_FILES, "MOSS Delay", expected)


def is_delay_code(code_dir) -> bool:
    path = Path(code_dir) / "modeling_moss_tts.py"
    return path.is_file() and "MossTTSDelayModel" in path.read_text(errors="replace")


def write(out_dir, size: str = "tiny", seed: int = 0, code_dir=None, codec_dir=None) -> dict:
    """``out_dir/MOSS-TTS-Delay-v1.5`` (remote code copied in when ``code_dir`` names a copy
    of moss_tts_delay/); its codec: ``codec_dir`` (default ``out_dir/MOSS-Audio-Tokenizer``,
    written by ``bestofn.fakes.moss_audio_tokenizer``). Returns the generator options."""
    out = Path(out_dir)
    codec_dir = Path(codec_dir or out / "MOSS-Audio-Tokenizer")
    model_dir = write_model(out / "MOSS-TTS-Delay-v1.5", size, seed, codec_dir)
    if code_dir:
        add_remote_code(model_dir, code_dir)
    return {"model_dir": str(model_dir.resolve()), "codec_dir": str(codec_dir.resolve())}
