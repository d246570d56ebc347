"""What every prompt source reduces to (a Prompt), the parsing rules they share (bracket tags,
quoted dialogue, the 4-word floor), the seeded draw per emotion, and the atomic write of
``emotions.tsv``, ``prompts.tsv`` and the ``import.json`` sidecar."""

from __future__ import annotations

import csv
import json
import os
import random
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from bestofn.prompts.heads import emotion_id

MIN_DIALOGUE_WORDS = 4  # LAION's recipe skips prompts with fewer dialogue words (about 4 %)

_BRACKET_TAG = re.compile(r"\[[^\]]*\]")
_PARENTHETICAL = re.compile(r"\([^)]*\)")
_QUOTED = re.compile(r'"([^"]*)"')
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


# the language names the sets write -> the ISO 639-1 codes of the prompts sheet
LANGUAGES = {"english": "en", "french": "fr", "spanish": "es", "german": "de"}


def language_code(value: str) -> str | None:
    """``French`` or ``fr`` -> ``fr``; None for a name not in LANGUAGES."""
    value = value.strip().lower()
    return LANGUAGES.get(value) or (value if value in LANGUAGES.values() else None)


class SourceError(ValueError):
    """Bad input, said as ``<file>: <what>`` (the command prints ``error: `` before it)."""


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    text: str
    head: str | None  # the Empathic-Insight head of its emotion; None: the set has no labels
    instruction: str = ""
    vocal_burst: str = ""
    language: str = "en"
    synonyms: str = ""  # the emotion's words as the source names it (its folder)


@dataclass
class Parsed:
    """A source's prompts, how many were skipped for too few dialogue words, what was read."""

    prompts: list[Prompt] = field(default_factory=list)
    skipped_short: int = 0
    files: list[str] = field(default_factory=list)


def strip_tags(text: str) -> str:
    """``[bracket tags]`` out, whitespace collapsed."""
    return " ".join(_BRACKET_TAG.sub(" ", text).split())


def quoted_dialogue(prompt: str) -> str:
    """Every double-quoted segment, joined, tags stripped: a DramaBox prompt's spoken text."""
    return strip_tags(" ".join(_QUOTED.findall(prompt)))


def dialogue_words(text: str) -> int:
    """Words spoken: (parenthetical cues such as ``(SIGH)``) and [tags] are not words."""
    return len(_PARENTHETICAL.sub(" ", _BRACKET_TAG.sub(" ", text)).split())


def safe_id(*parts: str) -> str:
    """A prompt id from the source's own names (``^[A-Za-z0-9][A-Za-z0-9_.-]*$``)."""
    raw = "-".join(_ID_UNSAFE.sub("_", str(p)).strip("_.-") for p in parts if str(p))
    return raw.lstrip("_.-") or "p"


def add(parsed: Parsed, prompt: Prompt) -> None:
    """Keep ``prompt``, or count it as skipped below the dialogue-word floor."""
    if dialogue_words(prompt.text) < MIN_DIALOGUE_WORDS:
        parsed.skipped_short += 1
    else:
        parsed.prompts.append(prompt)


def draw(prompts: list[Prompt], per_emotion: int | None, seed: int) -> list[Prompt]:
    """Up to ``per_emotion`` prompts per emotion, drawn with ``seed``: the same source, seed and
    count give the same sheets whatever order the files were listed in."""
    by_head: dict[str | None, list[Prompt]] = {}
    for p in sorted(prompts, key=lambda p: p.prompt_id):
        by_head.setdefault(p.head, []).append(p)
    out: list[Prompt] = []
    for head in sorted(by_head, key=lambda h: h or ""):
        group = by_head[head]
        if per_emotion is not None and per_emotion < len(group):
            rng = random.Random(f"{seed}:{head}")
            group = sorted(rng.sample(group, per_emotion), key=lambda p: p.prompt_id)
        out += group
    return out


def unique_ids(prompts: list[Prompt]) -> list[Prompt]:
    """Prompt ids made unique by a ``.N`` suffix (a source may repeat a name)."""
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        n = seen.get(p.prompt_id, 0)
        seen[p.prompt_id] = n + 1
        if n:
            p = replace(p, prompt_id=f"{p.prompt_id}.{n}")
        out.append(p)
    return out


NO_LABEL_EMOTION = "unlabelled"  # the one emotion of prompts their set gives no emotion

# class: the sets do not say which emotions are non-verbal; every emotion is written as speech
# (the recipes' filters read the column), for the user to mark (the import says so)
EMOTION_COLUMNS = ["emotion", "description", "ei_head", "synonyms", "class"]
PROMPT_COLUMNS = ["prompt_id", "text", "emotions", "instruction", "vocal_burst", "language"]


def _cell(value: str) -> str:
    # a sheet cell is one line: tabs and line breaks of a multi-line source prompt become spaces
    return " ".join(str(value).split())


def sheet_rows(prompts: list[Prompt]) -> tuple[list[list[str]], list[list[str]]]:
    """(emotions rows, prompts rows) in the sheets' column order."""
    emotions: dict[str, list[str]] = {}
    rows = []
    for p in prompts:
        if p.head is None:
            eid = NO_LABEL_EMOTION
            emotions.setdefault(
                eid, [eid, "as each prompt's instruction directs (its set names no emotion)",
                      "", "", "speech"],
            )  # fmt: skip
        else:
            eid = emotion_id(p.head)
            words = p.synonyms or " ".join(eid.lower().split("_"))
            emotions.setdefault(eid, [eid, words, p.head, p.synonyms, "speech"])
        rows.append(
            [p.prompt_id, _cell(p.text), eid, _cell(p.instruction), _cell(p.vocal_burst),
             p.language]
        )  # fmt: skip
    return [emotions[k] for k in sorted(emotions)], rows


def write_outputs(out: Path, prompts: list[Prompt], sidecar: dict) -> None:
    """``emotions.tsv``, ``prompts.tsv`` and ``import.json`` into ``out``: each written beside
    its place and renamed over it, the sidecar last, so an interrupted import never leaves
    sheets that look complete next to an older sidecar."""
    emotion_rows, prompt_rows = sheet_rows(prompts)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "emotions.tsv": _tsv(EMOTION_COLUMNS, emotion_rows),
        "prompts.tsv": _tsv(PROMPT_COLUMNS, prompt_rows),
        "import.json": json.dumps(sidecar, indent=2, sort_keys=True) + "\n",
    }
    temps = []
    try:
        for name, text in files.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out)
            temps.append((tmp, out / name))
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(text)
        for tmp, final in temps:
            os.replace(tmp, final)
    finally:
        for tmp, _ in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _tsv(header: list[str], rows: list[list[str]]) -> str:
    import io

    buf = io.StringIO()
    w = csv.writer(buf, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()
