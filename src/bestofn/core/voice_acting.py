"""How each emotion reaches the generator and how its takes are measured against it, decided
when the plan is built: the Instruction a group's prompt carries (the emotion sheet's
``instruction`` column, else the generator's ``instruction`` option), the Empathic-Insight head
that scores the group's own emotion (``ei_head``), and the plan-time checks around both."""

from __future__ import annotations

from pathlib import Path

from bestofn.backends.registry import backend_class
from bestofn.moss.options import NO_INSTRUCTION, instruction_option, instruction_text

EMPATHIC = "empathic-insight"
TARGET = "target"  # the Empathic-Insight column of the group's own emotion: <prefix>target


def generator_instruction(models: dict) -> tuple[bool, object]:
    """(whether the generator takes an ``instruction`` option, the option's value)."""
    gen = models["generator"]
    try:
        known = backend_class("generator", gen["backend"]).known_options()
    except Exception:  # an unknown or unimportable backend is refused by check_models
        return False, None
    if "instruction" not in known:
        return False, None
    # resolved and checked where the generators resolve it (ValueError: refused)
    return True, instruction_option(gen.get("options") or {}, "config models.generator.options")


def group_extra(emotion: dict, prompt: dict, takes_instruction: bool, option) -> dict:
    """What an emotion and a prompt add to their group's identity (GroupSpec.extra): the
    Instruction text (``""``: none, where the option would have given one) and the emotion's
    ``ei_head``. The Instruction is the prompt sheet's ``instruction`` cell, else the emotion
    sheet's, else the option (a template's ``{vocal_burst}`` is the prompt's, its
    ``{emotion_synonyms}`` the emotion's); a cell ``none`` means none. Only the resolved text
    enters the identity: a changed template replans exactly the groups whose text changed."""
    extra: dict = {}
    if emotion.get("ei_head"):
        extra["ei_head"] = emotion["ei_head"]
    if not takes_instruction:
        return extra
    derived = instruction_text(
        option, emotion["emotion"], emotion.get("description", ""),
        emotion.get("negative_description", ""), vocal_burst=prompt.get("vocal_burst") or "",
        synonyms=emotion.get("synonyms") or "",
    )  # fmt: skip
    text = derived
    for row in (prompt, emotion):
        cell = (row.get("instruction") or "").strip()
        if cell.lower() == NO_INSTRUCTION:
            text = None
            break
        if cell:
            text = " ".join(cell.split())
            break
    if text is not None:
        extra["instruction"] = text
    elif derived is not None:
        extra["instruction"] = ""  # a sheet says none: cloning a voice, as the recipe does
    return extra


def missing_bursts(option, prompts: list[dict], sheet: Path) -> list[str]:
    """A note when the option's template reads ``{vocal_burst}`` and prompts that take their
    Instruction from it have no burst: their text would say "vocal burst: ." with nothing."""
    if not isinstance(option, str) or "{vocal_burst}" not in option:
        return []
    bare = [
        p["prompt_id"] for p in prompts
        if not (p.get("vocal_burst") or "").strip() and not (p.get("instruction") or "").strip()
    ]  # fmt: skip
    if not bare:
        return []
    more = f" and {len(bare) - 5} more" if len(bare) > 5 else ""
    return [
        f"note: {sheet}: the instruction template reads {{vocal_burst}}, but prompt(s) "
        f"{', '.join(bare[:5])}{more} have no vocal_burst: their instruction leaves it empty"
    ]


# ASR backends that read one language only, and that language
ENGLISH_ONLY_ASR = {"whisper-asr": "faster-whisper tiny.en"}


def check_languages(models: dict, groups: dict, sheet: Path) -> list[str]:
    """Errors for prompts in a language an ASR scorer cannot read: whisper-asr runs Whisper
    tiny.en, an English-only model, which writes English-sounding words for French or German
    speech, so every such take's WER would be near 1 and the selection would drop good takes
    as unintelligible. Parakeet TDT 0.6B v3 is multilingual (25 European languages)."""
    from bestofn.util.textnorm import is_english

    foreign = sorted(
        {(s.prompt_id, s.language) for s in groups.values() if not is_english(s.language)}
    )
    if not foreign:
        return []
    errors = []
    for scorer in models.get("scorers", []):
        model = ENGLISH_ONLY_ASR.get(scorer.get("backend"))
        if model is None:
            continue
        listed = ", ".join(f"{p} ({lang})" for p, lang in foreign[:5])
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        errors.append(
            f"{sheet}: prompt(s) {listed}{more} are not English, and scorer {scorer['backend']} "
            f"runs {model}, which reads English only (their WER would measure nothing); use "
            "the parakeet scorer (multilingual) or keep those prompts out"
        )
    return errors


def same_for_every_emotion(groups: dict, sheet: Path) -> list[str]:
    """A warning when every emotion would reach the generator the same way: no Instruction and,
    for each prompt, one reference voice whatever the emotion (the takes of two emotions then
    differ only by their seeds)."""
    emotions = {e for e, _ in groups}
    if len(emotions) < 2:
        return []
    by_prompt: dict[str, set] = {}
    for (_, prompt), spec in groups.items():
        if spec.extra.get("instruction"):
            return []
        by_prompt.setdefault(prompt, set()).add(spec.extra.get("reference_audio_blake2b"))
    if any(len(voices) > 1 for voices in by_prompt.values()):
        return []
    voices = {v for vs in by_prompt.values() for v in vs} - {None}
    how = (
        f"{len(voices)} reference voice(s) shared by every emotion"
        if voices
        else "no reference voice"
    )
    return [
        f"{sheet}: every emotion reaches the generator the same way (no instruction, {how}): "
        f"the {len(emotions)} emotions would be {len(emotions)} copies of one reading. Set "
        "models.generator.options.instruction (e.g. emotion_description or a template), an "
        "'instruction' column in the emotions sheet, or a reference_audio per emotion"
    ]


def _empathic_entries(models: dict) -> list[dict]:
    return [s for s in models.get("scorers", []) if s.get("backend") == EMPATHIC]


def check_targets(
    config: dict, groups: dict, sheet: Path, base: Path = Path(".")
) -> tuple[list[str], list[str]]:
    """(errors, notes) about ``ei_target``: the selection (filter, score or held_out) uses the
    Empathic-Insight column of each group's own emotion, so an emotion that maps to no head is
    an error, naming it and the heads found in the scorer's ``heads_path``; where the selection
    does not use it, a note."""
    from bestofn.select.held_out import referenced_columns

    entries = _empathic_entries(config["models"])
    if not entries:
        return [], []
    from bestofn.backends.empathic import column_name, emotion_head_names, resolve_head

    sel = config["selection"]
    used = referenced_columns(sel["filter"], "filter") | referenced_columns(sel["score"], "score")
    for item in sel.get("held_out") or []:
        used.add((item if isinstance(item, str) else item.get("column", "")).lower())
    errors, notes = [], []
    for entry in entries:
        options = entry.get("options") or {}
        column = column_name(TARGET, options.get("column_prefix", "ei_"))
        heads_path = options.get("heads_path")
        path = Path(heads_path or "").expanduser()
        path = path if path.is_absolute() else base / path
        if not heads_path or not path.is_dir():
            continue  # check_models names a missing weights path
        heads = emotion_head_names(path)
        emotions = {spec.emotion: spec.extra.get("ei_head") for spec in groups.values()}
        unmapped = sorted(e for e, h in emotions.items() if resolve_head(e, h, heads) is None)
        if not unmapped:
            continue
        where = (
            f"{sheet}: emotion(s) {', '.join(unmapped)} map to no Empathic-Insight head "
            f"(by the sheet's ei_head, else the emotion's name); heads in {heads_path}: "
            f"{', '.join(heads)}"
        )
        if column.lower() in used:
            errors.append(f"{where}. The selection uses {column}: name the head in ei_head")
        else:
            notes.append(f"note: {where}. Their {column} is NaN (the selection does not use it)")
    return errors, notes
