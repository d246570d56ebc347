"""DramaBox scenes from a local clone of LAION-AI/Voice-Acting-Pipeline (they live on GitHub,
not the hub).

Published layout (LAION-AI/Voice-Acting-Pipeline ``data/dramabox_*.json``): a JSON list of
objects with ``id``, ``language`` (English, French, Spanish, German), ``dramabox_prompt`` and
``sample_info``, whose emotions are ``emotions_sampled`` (the sit_situation file) or
``emotions`` (the archetype files), e.g. ``Jealousy & Envy (clearly present), Pleasure/Ecstasy
(clearly present)``; the acting-challenge and extreme-physical files name none (their scenes go
to the sheets' one unlabelled emotion). Some prompts are cut off before any dialogue
(``"dramabox_prompt": "A "``): skipped and counted. Parsing per
LAION-AI/laion-moss-local-1.5-voice-acting-4.55b SYNTHETIC_DATA_RECIPE.md section 1a: text =
every double-quoted segment joined (tags stripped), instruction = the whole prompt, dialogue
included. A scene names up to three emotions; its
group is scored by the first one named (our choice: the recipe ranks DramaBox groups without a
target emotion)."""

from __future__ import annotations

import json
from pathlib import Path

from bestofn.prompts.heads import EMOTION_HEADS, head_for
from bestofn.prompts.sheets import (
    LANGUAGES,
    Parsed,
    Prompt,
    SourceError,
    add,
    language_code,
    quoted_dialogue,
    safe_id,
)


def files(folder: Path) -> list[Path]:
    return sorted(folder.glob("data/dramabox_*.json")) or sorted(folder.glob("dramabox_*.json"))


def parse(folder: Path) -> Parsed:
    paths = files(folder)
    if not paths:
        raise SourceError(
            f"{folder}: no data/dramabox_*.json (a clone of LAION-AI/Voice-Acting-Pipeline)"
        )
    parsed = Parsed()
    for path in paths:
        parsed.files.append(str(path.relative_to(folder)))
        try:
            items = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SourceError(f"{path}: malformed JSON ({e})") from None
        if not isinstance(items, list):
            raise SourceError(f"{path}: expected a JSON list of scenes, got {type(items).__name__}")
        subset = path.stem.removeprefix("dramabox_")
        for i, item in enumerate(items):
            add(parsed, _scene(path, subset, i, item))
    return parsed


def _scene(path: Path, subset: str, i: int, item) -> Prompt:
    if not isinstance(item, dict):
        raise SourceError(f"{path} item {i}: expected an object, got {type(item).__name__}")
    where = f"{path} item {i} (id {item.get('id', '?')})"
    prompt = item.get("dramabox_prompt")
    if not isinstance(prompt, str):
        raise SourceError(f"{where}: no dramabox_prompt text")
    # no "language": the file's _de suffix says German, else English (an assumption)
    name = str(item.get("language") or ("German" if subset.endswith("_de") else "English"))
    language = language_code(name)
    if language is None:
        raise SourceError(
            f"{where}: language {name!r} is none of {', '.join(s.title() for s in LANGUAGES)}"
        )
    info = item.get("sample_info")
    info = info if isinstance(info, dict) else {}
    named = info.get("emotions_sampled") or info.get("emotions")
    head = None  # the acting-challenge and extreme-physical files name no emotion
    if named is not None:
        if not isinstance(named, str):
            raise SourceError(f"{where}: sample_info emotions are not text: {named!r}")
        first = named.split(",")[0].split("(")[0].strip()
        head = head_for(first)
        if head is None:
            raise SourceError(
                f"{where}: emotion {first!r} maps to no Empathic-Insight head (heads: "
                f"{', '.join(EMOTION_HEADS)})"
            )
    # an empty or cut-off prompt has no dialogue: skipped and counted with the short ones
    return Prompt(
        prompt_id=safe_id("db", subset, str(item.get("id", i))),
        text=quoted_dialogue(prompt),
        head=head,
        instruction=prompt,
        language=language,
    )
