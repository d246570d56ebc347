"""Config options shared by both MOSS generators (moss-hf and moss-fast), so one config can
switch engines by changing only the backend name; and moss-fast's engine paths, whose defaults
are written in the config schema (``$defs.moss_fast_runtime``) and read from there."""

import math
from functools import cache

from bestofn.moss.budget import PACING_OPTIONS
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
    # the pacing dial: None = the config schema's default ($defs.moss_pacing, read by
    # bestofn.moss.budget.FrameBudget when the backend is built)
    **dict.fromkeys(PACING_OPTIONS),
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
    # what goes into the prompt's Instruction field (instruction_text): "none", "emotion",
    # "emotion_description", or a template such as "extremely {emotion_words}. {description}"
    "instruction": "none",
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


def check_engine_options(options: dict, who: str) -> None:
    """A value the schema does not allow, refused with the field and the allowed values (the
    config's validation does this too; this covers objects built without a config). ``who``:
    the backend, named in the message."""
    for key, sub in _engine_schema().items():
        if key not in options:
            continue
        value = options[key]
        if "enum" in sub and value not in sub["enum"]:
            known = ", ".join("null" if v is None else str(v) for v in sub["enum"])
            raise ValueError(f"{who}: runtime.{key} is {value!r}; known: {known}")
        if sub.get("type") == "boolean" and not isinstance(value, bool):
            raise ValueError(f"{who}: runtime.{key} must be true or false, got {value!r}")
        kinds = sub.get("type") if isinstance(sub.get("type"), list) else [sub.get("type")]
        if "integer" in kinds and not (value is None and "null" in kinds):
            low = sub.get("minimum", -math.inf)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{who}: runtime.{key} must be an integer >= {low}, got {value!r}")


# The Instruction field of the v1.5 prompt (moss.prompt.user_inst_fields) is where the model cards
# put the performance direction, and LAION's voice-acting recipe puts the emotion ("extremely
# {emotion synonyms}...", LAION-AI/moss-8b-voice-acting SYNTHETIC_DATA_RECIPE.md section 1b); the
# recipe leaves it empty when a reference voice is cloned (every wording lowered speaker
# similarity). Sources and the fine-tunes' styles: docs/notes/moss-facts.md, "Voice acting".
INSTRUCTION_MODES = ("none", "emotion", "emotion_description")
TEMPLATE_FIELDS = (
    "emotion", "emotion_words", "emotion_synonyms", "description", "negative_description",
    "vocal_burst",
)  # fmt: skip
NO_INSTRUCTION = "none"  # an emotion sheet's ``instruction`` cell: this emotion gets none


def check_instruction_option(value, who: str = "moss") -> None:
    """Refuse an ``instruction`` option that is neither a mode nor a template of known fields."""
    import string

    if value in INSTRUCTION_MODES:
        return
    if not isinstance(value, str) or "{" not in value:
        raise ValueError(
            f"{who}: option instruction is {value!r}; use one of {', '.join(INSTRUCTION_MODES)} "
            f"or a template with {{fields}} from: {', '.join(TEMPLATE_FIELDS)}"
        )
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
    except ValueError as e:
        raise ValueError(f"{who}: option instruction {value!r} is not a template: {e}") from None
    unknown = [f for f in fields if f not in TEMPLATE_FIELDS]
    if unknown:
        raise ValueError(
            f"{who}: option instruction {value!r} names {{{unknown[0]}}}; a template's fields: "
            f"{', '.join(TEMPLATE_FIELDS)}"
        )


def instruction_option(options: dict, who: str = "moss"):
    """The ``instruction`` option of a MOSS generator's options (the default where unset),
    checked: the one place the option is resolved, for the plan and the generators alike."""
    value = options.get("instruction", COMMON_DEFAULTS["instruction"])
    check_instruction_option(value, who)
    return value


def emotion_words(emotion: str) -> str:
    """An emotion id as words: ``Astonishment_Surprise`` -> ``astonishment surprise``."""
    return " ".join(emotion.replace("_", " ").replace("-", " ").split()).lower()


def instruction_text(
    option, emotion: str, description: str = "", negative: str = "", *,
    vocal_burst: str = "", synonyms: str = "",
):  # fmt: skip
    """The Instruction text of the option (a mode or a template) for one emotion and prompt:
    ``vocal_burst`` is the prompt's, ``synonyms`` the emotion sheet's (else the emotion's
    words: LAION's recipe says "extremely {emotion synonyms from the dir name}" without the
    exact wording, docs/notes/prompt-sources.md). None: none."""
    if option == "emotion":
        return emotion or None
    if option == "emotion_description":
        return description or None
    if option in (None, "none"):
        return None
    text = option.format(
        emotion=emotion, emotion_words=emotion_words(emotion),
        emotion_synonyms=synonyms or emotion_words(emotion), description=description,
        negative_description=negative, vocal_burst=vocal_burst,
    )  # fmt: skip
    return " ".join(text.split()) or None


def group_instruction(option, spec) -> str | None:
    """The Instruction a group's prompt carries: the plan's (``spec.extra["instruction"]``, from
    the emotion sheet or the option; "" = none) where it gave one, else the option's."""
    if "instruction" in spec.extra:
        return spec.extra["instruction"] or None
    return instruction_text(
        option, spec.emotion, spec.emotion_description, spec.negative_description
    )
