"""How each emotion reaches the generator and how its takes are measured against it, decided
when the plan is built: the Instruction a group's prompt carries (the emotion sheet's
``instruction`` column, else the generator's ``instruction`` option), the Empathic-Insight head
that scores the group's own emotion (``ei_head``), and the plan-time checks around both."""

from __future__ import annotations

from pathlib import Path

from bestofn.backends.registry import backend_class
from bestofn.moss.options import NO_INSTRUCTION, instruction_option, instruction_text


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


def check_languages(models: dict, groups: dict, sheet: Path) -> list[str]:
    """Errors for prompts in a language an ASR scorer cannot read: whisper-asr runs Whisper
    tiny.en, an English-only model, which writes English-sounding words for French or German
    speech, so every such take's WER would be near 1 and the selection would drop good takes
    as unintelligible (a scorer says so in ``english_only``; Parakeet TDT 0.6B v3 is
    multilingual, 25 European languages)."""
    from bestofn.util.textnorm import is_english

    foreign = sorted(
        {(s.prompt_id, s.language) for s in groups.values() if not is_english(s.language)}
    )
    if not foreign:
        return []
    errors = []
    for scorer in models.get("scorers", []):
        model = backend_class("scorer", scorer["backend"]).english_only
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


def check_scorers(
    config: dict, groups: dict, sheet: Path, base: Path = Path(".")
) -> tuple[list[str], list[str]]:
    """(errors, notes) of each scorer's own plan-time check (``Scorer.check_plan``), such as
    Empathic-Insight's: the selection reads the head of each group's own emotion, so an emotion
    that maps to no head is an error where the selection uses it, else a note."""
    from bestofn.select.held_out import SelectionError, referenced_columns
    from bestofn.select.rewards import rewards_of
    from bestofn.select.scales import uses_spec

    sel = config["selection"]
    try:
        rewards = rewards_of(sel)
    except SelectionError as e:  # a misnamed reward: the plan's error, not a traceback
        return [str(e)], []
    used: set[str] = set()
    spec = False  # ei_spec reads the group's own head (<prefix>target) too

    def selection_uses(column: str) -> bool:  # the SQL is parsed only when a check asks
        nonlocal spec
        if not used:  # every reward's filter and score, and the held-out columns
            for reward in rewards:
                used.update(referenced_columns(reward.filter, "filter"))
                used.update(referenced_columns(reward.score, "score"))
                spec = spec or uses_spec(f"{reward.filter} {reward.score}")
            for item in sel.get("held_out") or []:
                used.add((item if isinstance(item, str) else item.get("column", "")).lower())
            used.add("")  # parsed
        return column.lower() in used or (spec and column.lower().endswith("target"))

    errors, notes = [], []
    for entry in config["models"].get("scorers", []):
        cls = backend_class("scorer", entry["backend"])
        options = entry.get("options") or {}
        found = cls.check_plan(options, groups, selection_uses, sheet, base)
        errors += found[0]
        notes += found[1]
    return errors, notes
