"""``laion/voice-acting-instructions``: casting rows with ready-made ``instruction`` and
``text`` columns and no emotion labels (LAION-AI/laion-moss-local-1.5-voice-acting-4.55b
SYNTHETIC_DATA_RECIPE.md section 1c: "124,349 CSV rows"; text keeps inline burst cues such as
``(SIGH)``, which WER normalisation leaves out).

NOT published: the files' names and folders, and whether a Parquet conversion sits beside the
CSVs. This reader takes every ``*.csv`` and ``*.parquet`` in the snapshot; a ``language``
column, where a file has one, gives each row's language (English, French, Spanish or German,
by name or code; else English)."""

from __future__ import annotations

import csv
from pathlib import Path

from bestofn.prompts.sheets import (
    LANGUAGES,
    Parsed,
    Prompt,
    SourceError,
    add,
    language_code,
    safe_id,
    strip_tags,
)

REPO = "laion/voice-acting-instructions"
PATTERNS = ["*.csv", "**/*.csv", "*.parquet", "**/*.parquet"]
REQUIRED = ("instruction", "text")


def parse(folder: Path) -> Parsed:
    paths = sorted(p for p in folder.rglob("*") if p.suffix in (".csv", ".parquet"))
    if not paths:
        raise SourceError(f"{folder}: no *.csv or *.parquet files (the layout of {REPO})")
    parsed = Parsed()
    for path in paths:
        parsed.files.append(str(path.relative_to(folder)))
        rows = _parquet(path) if path.suffix == ".parquet" else _csv(path)
        stem = path.stem
        for n, row in rows:
            text = strip_tags(str(row.get("text") or ""))
            if not text:
                raise SourceError(f"{path} row {n}: empty text")
            named = str(row.get("language") or "en")
            language = language_code(named)
            if language is None:
                raise SourceError(
                    f"{path} row {n}: language {named!r} is none of "
                    f"{', '.join(f'{v} ({k.title()})' for k, v in LANGUAGES.items())}"
                )
            add(parsed, Prompt(
                prompt_id=safe_id("vai", stem, str(n)), text=text, head=None,
                instruction=" ".join(str(row.get("instruction") or "").split()),
                language=language,
            ))  # fmt: skip
    return parsed


def _check_columns(path: Path, columns) -> None:
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise SourceError(
            f"{path}: no {', '.join(repr(c) for c in missing)} column (columns: "
            f"{', '.join(map(str, columns)) or 'none'})"
        )


def _csv(path: Path):
    """(line number, row) per data row."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise SourceError(f"{path}: not UTF-8 text ({e})") from None
    reader = csv.DictReader(text.splitlines(keepends=True), strict=True)
    try:
        _check_columns(path, reader.fieldnames or [])
        rows = []
        for row in reader:
            if None in row:  # more fields than the header
                raise SourceError(f"{path} line {reader.line_num}: more fields than the header")
            rows.append((reader.line_num, row))
    except csv.Error as e:
        raise SourceError(f"{path} line {reader.line_num}: malformed CSV ({e})") from None
    return rows


def _parquet(path: Path):
    """(row index, row) per row."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise SourceError(f"{path}: malformed parquet ({e})") from None
    _check_columns(path, table.column_names)
    keep = [c for c in (*REQUIRED, "language") if c in table.column_names]
    return list(enumerate(table.select(keep).to_pylist()))
