"""``laion/voice-acting-prompts``: emotion-labelled texts with a vocal burst each.

Published layout (LAION-AI/laion-moss-local-1.5-voice-acting-4.55b SYNTHETIC_DATA_RECIPE.md
sections 1b and 9): tar archives such as ``geminittsprompts-output-en.tar`` holding files
``speaker/emotion/vocal_burst.json``; the emotion folders map onto the Empathic-Insight heads
with three renames; ``text`` = the prompt with ``[bracket tags]`` stripped.

NOT published: what a JSON file holds. This reader takes a string, a list of strings, an
object with one of the keys in ``TEXT_KEYS``, or a list of such objects (about 16,000 files
for about 68,000 texts suggests several texts per file); anything else is refused by file.
The language is the archive name's ``-xx`` suffix (``-en``), else English: also an assumption.
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path, PurePosixPath

from bestofn.prompts.heads import EMOTION_HEADS, head_for
from bestofn.prompts.sheets import Parsed, Prompt, SourceError, add, safe_id, strip_tags

REPO = "laion/voice-acting-prompts"
PATTERNS = ["*.tar", "**/*.tar", "*/*/*.json", "**/*/*/*.json"]
TEXT_KEYS = ("prompt", "text", "prompts", "texts")
_LANG_SUFFIX = re.compile(r"-([a-z]{2})$")


def parse(folder: Path) -> Parsed:
    parsed = Parsed()
    tars = sorted(folder.rglob("*.tar"))
    loose = sorted(p for p in folder.rglob("*.json") if len(p.relative_to(folder).parts) >= 3)
    if not tars and not loose:
        raise SourceError(
            f"{folder}: no *.tar archives and no speaker/emotion/vocal_burst.json files "
            f"(the layout of {REPO})"
        )
    for path in tars:
        parsed.files.append(str(path.relative_to(folder)))
        lang = _LANG_SUFFIX.search(path.stem)
        language = lang.group(1) if lang else "en"
        try:
            with tarfile.open(path) as tar:
                # speaker/emotion/vocal_burst.json, under any wrapping folder; a JSON file
                # higher up (a manifest, a card) is not a prompt file
                members = sorted(
                    (
                        m for m in tar.getmembers()
                        if m.isfile() and m.name.endswith(".json")
                        and len(PurePosixPath(m.name).parts) >= 3
                    ),
                    key=lambda m: m.name,
                )  # fmt: skip
                for m in members:
                    where = f"{path}:{m.name}"
                    data = tar.extractfile(m).read()
                    _file(parsed, where, PurePosixPath(m.name).parts, data, language)
        except (tarfile.TarError, EOFError) as e:
            raise SourceError(f"{path}: not a readable tar archive ({e})") from None
    for path in loose:
        parsed.files.append(str(path.relative_to(folder)))
        _file(parsed, str(path), path.relative_to(folder).parts, path.read_bytes(), "en")
    return parsed


def _texts(where: str, data: bytes) -> list[str]:
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SourceError(f"{where}: malformed JSON ({e})") from None
    items = value if isinstance(value, list) else [value]
    texts = []
    for i, item in enumerate(items):
        if isinstance(item, dict):
            key = next((k for k in TEXT_KEYS if k in item), None)
            if key is None:
                raise SourceError(
                    f"{where}: item {i} has none of the keys {', '.join(TEXT_KEYS)} "
                    f"(keys: {', '.join(map(str, item)) or 'none'})"
                )
            item = item[key]
        found = item if isinstance(item, list) else [item]
        if not all(isinstance(t, str) for t in found):
            raise SourceError(f"{where}: item {i} is not text ({type(item).__name__})")
        texts += found
    return texts


def _file(parsed: Parsed, where: str, parts: tuple, data: bytes, language: str) -> None:
    speaker, emotion, name = parts[-3], parts[-2], PurePosixPath(parts[-1]).stem
    head = head_for(emotion)
    if head is None:
        raise SourceError(
            f"{where}: emotion folder {emotion!r} maps to no Empathic-Insight head (heads: "
            f"{', '.join(EMOTION_HEADS)})"
        )
    burst = " ".join(name.replace("_", " ").split()).lower()
    synonyms = " ".join(emotion.replace("_", " ").split()).lower()
    for i, raw in enumerate(_texts(where, data)):
        text = strip_tags(raw)
        if not text:
            raise SourceError(f"{where}: text {i} is empty")
        add(parsed, Prompt(
            prompt_id=safe_id(speaker, emotion, name, str(i)), text=text, head=head,
            vocal_burst=burst, language=language, synonyms=synonyms,
        ))  # fmt: skip
