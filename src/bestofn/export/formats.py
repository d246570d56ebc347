"""The writer base every export format subclasses, the registry of formats, and what the
writers share: a take's key and its row as JSON.

A format is one module of ``bestofn.export`` holding one ``Writer`` subclass: subclassing
registers it under its ``name`` (what ``--format`` and the schema's ``export.format`` enum
spell), and ``registry()`` finds every such module. A new format is its module and its test
(tests/export/test_formats.py checks the schema's enum against the registry)."""

from __future__ import annotations

import datetime as dt
import importlib
import json
import pkgutil
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc

_WRITERS: dict[str, type[Writer]] = {}


class Writer:
    """One export format. ``unit`` says what the export writes as one file: 'shard' (files of
    many rows: ``shard_path`` and ``write_shard``), 'take' (one audio file per take at
    ``audio_path``, manifests written by ``finish``) or 'whole' (the writer runs the export
    itself: ``export``). The constructor imports the format's library, so a missing one fails
    before any work."""

    name: ClassVar[str]
    unit: ClassVar[str]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.unit not in ("shard", "take", "whole"):
            raise TypeError(f"{cls.__name__}.unit {cls.unit!r}: 'shard', 'take' or 'whole'")
        if cls.name in _WRITERS and _WRITERS[cls.name] is not cls:
            raise TypeError(f"export format {cls.name!r} declared twice: {cls.__name__}")
        _WRITERS[cls.name] = cls

    def shard_path(self, split: str, n: int) -> str:
        """A shard's path in the export ('shard' writers)."""
        raise NotImplementedError

    def audio_path(self, group_id: str, take: int) -> str:
        """A take's audio file in the export ('take' writers)."""
        return audio_path(group_id, take)

    def begin(self, meta: pa.Table, settings) -> None:
        """Once, with every row, before any unit is written."""

    def write_shard(self, path, part: pa.Table, audio: list[tuple], settings) -> None:
        """Write one shard of rows ('shard' writers); ``audio``: (bytes, rate, channels,
        frames) per row."""
        raise NotImplementedError

    def finish(self, tmp, meta: pa.Table, units, settings) -> pa.Table:
        """After every unit: write the manifests; returns the rows as exported."""
        return meta

    def card_yaml(self, splits: list[str]) -> dict:
        """What the format adds to the card's YAML front matter."""
        return {}

    def load_lines(self, out: str, splits: list[str]) -> str:
        """The Python a trainer loads the export with, for the card."""
        raise NotImplementedError

    def export(self, results, settings, selection: dict, log, t0: float, texts):
        """The whole export ('whole' writers); returns its ExportSummary."""
        raise NotImplementedError


def registry() -> dict[str, type[Writer]]:
    """Every export format, by name: the Writer subclasses of the modules of bestofn.export
    (imported here, not at startup: a writer imports its library only when built)."""
    package = importlib.import_module("bestofn.export")
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"bestofn.export.{module.name}")
    return dict(sorted(_WRITERS.items()))


def take_key(group_id: str, take: int) -> str:
    """``emotion/prompt_id/NNN``, with '%' and '.' escaped: WebDataset splits a member name at
    its first dot, and ids may hold dots."""
    return f"{group_id.replace('%', '%25').replace('.', '%2E')}/{take:03d}"


def _plain(v):
    return v.isoformat() if isinstance(v, dt.datetime | dt.date) else v


def json_rows(table: pa.Table) -> list[dict]:
    """The rows as JSON-ready dicts (timestamps as ISO 8601 strings)."""
    rows = table.to_pylist()
    stamps = [f.name for f in table.schema if pa.types.is_temporal(f.type)]
    for r in rows:
        for c in stamps:
            r[c] = _plain(r[c])
    return rows


def dumps(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False, allow_nan=True)


def with_audio_facts(part: pa.Table, audio: list[tuple]) -> pa.Table:
    """The rows with the rate, channels and sample count of the audio as exported."""
    for i, (name, typ) in enumerate(
        (("sample_rate", pa.int32()), ("channels", pa.int32()), ("num_samples", pa.int64()))
    ):
        col = pa.array([a[i + 1] for a in audio], typ)
        at = part.schema.get_field_index(name)
        part = part.set_column(at, name, col) if at >= 0 else part.append_column(name, col)
    return part


def audio_path(group_id: str, take: int) -> str:
    """A take's audio file in a lhotse or nemo export (ids may hold dots: paths may too)."""
    return f"audio/{group_id}/{take:03d}.flac"


def with_exported_files(tmp, meta: pa.Table, units, settings) -> pa.Table:
    """The rows of a per-take export with ``audio_filepath`` (relative to the export, or
    absolute where it will be published) and the rate, channels, sample count and duration
    of the file as written (read back from its FLAC header)."""
    from bestofn.export.audio import streaminfo

    out = settings.out.resolve()
    paths, audio = [None] * meta.num_rows, [None] * meta.num_rows
    for u in units:
        (i,) = u.rows
        with open(tmp / u.relpath, "rb") as f:
            rate, ch, frames = streaminfo(f.read(42))
        audio[i] = (None, rate, ch, frames)
        paths[i] = str(out / u.relpath) if settings.paths == "absolute" else u.relpath
    meta = with_audio_facts(meta, audio)
    dur = pc.divide(
        pc.cast(meta.column("num_samples"), pa.float64()),
        pc.cast(meta.column("sample_rate"), pa.float64()),
    )
    meta = meta.set_column(meta.schema.get_field_index("duration_s"), "duration_s", dur)
    return meta.append_column("audio_filepath", pa.array(paths, pa.string()))
