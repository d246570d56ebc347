"""Config options shared by both MOSS generators (moss-hf and moss-fast), so one config can
switch engines by changing only the backend name; and moss-fast's engine paths, whose defaults
are written in the config schema (``$defs.moss_fast_runtime``) and read from there."""

from functools import cache

from bestofn.moss.budget import DEFAULT_FRAMES_PER_WORD, DEFAULT_MAX_FRAMES, DEFAULT_MIN_FRAMES
from bestofn.schemas import schema

COMMON_DEFAULTS = {
    "model_dir": None,  # checkpoint dir: config.json, weights, tokenizer (+ remote code: moss-hf)
    "codec_dir": None,  # MOSS-Audio-Tokenizer-v2 directory
    "lora": None,  # optional peft LoRA adapter directory, merged once at load (cached)
    "cache_dir": None,  # merged-LoRA cache + hash memo; default ~/.cache/bestofn/moss
    "dtype": "auto",  # model weights: bfloat16 on cuda, float32 on cpu
    "codec_weight_dtype": "bf16",
    "codec_compute_dtype": "bf16",
    "batch_size": 64,  # takes per engine call
    "decode_batch_size": 16,  # takes per codec decode call
    # the frame budget (bestofn.moss.budget says what each does)
    "frames_per_word": DEFAULT_FRAMES_PER_WORD,
    "min_frames": DEFAULT_MIN_FRAMES,
    "max_frames": DEFAULT_MAX_FRAMES,
    # sampling: the model card's recommendation (docs/moss_tts_model_card.md)
    "do_sample": True,
    "audio_temperature": 1.7,
    "audio_top_p": 0.8,
    "audio_top_k": 25,
    "audio_repetition_penalty": 1.0,
    "text_temperature": 1.0,
    "text_top_p": 1.0,
    "text_top_k": 50,
    "language": None,  # override the tag; default from GroupSpec.language
    "instruction": "none",  # "none" | "emotion" | "emotion_description" -> template Instruction
    "max_reference_s": 30.0,  # longer reference audio is cut (prompt length = cost)
    "mono": False,  # True: average the two channels
    "hash_weights": True,  # content hashes in provenance (memoised on disk)
}


def _engine_schema() -> dict:
    return schema("config")["$defs"]["moss_fast_runtime"]["properties"]


@cache
def engine_defaults() -> dict:
    """moss-fast's engine paths -> their defaults (fused, decode_attention, local_attention,
    compile_mode), as the config schema declares them. Shared: do not modify."""
    return {key: sub["default"] for key, sub in _engine_schema().items()}


def check_engine_options(options: dict, who: str = "moss-fast") -> None:
    """A value the schema does not allow, refused with the field and the allowed values (the
    config's validation does this too; this covers objects built without a config)."""
    for key, sub in _engine_schema().items():
        if key not in options:
            continue
        value = options[key]
        if "enum" in sub and value not in sub["enum"]:
            known = ", ".join("null" if v is None else str(v) for v in sub["enum"])
            raise ValueError(f"{who}: runtime.{key} is {value!r}; known: {known}")
        if sub.get("type") == "boolean" and not isinstance(value, bool):
            raise ValueError(f"{who}: runtime.{key} must be true or false, got {value!r}")
