"""The writer of each format, and what they share: a take's key and its row as JSON.

A writer has ``name``, ``unit`` ('shard': files of many rows; 'take': one audio file per take,
plus manifests written by ``finish``), the paths of its units, ``begin`` (once, with every
row), ``write_shard`` (shard writers), ``finish`` (manifests; returns the rows as exported) and
``load_lines`` (the Python a trainer loads it with, for the card and README)."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pyarrow.compute as pc


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
