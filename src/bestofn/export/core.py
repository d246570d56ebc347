"""One export, start to end: check, select, split, plan units, write or reuse them, publish.

A unit is what an export writes as one file: a shard of rows (hf, webdataset) or one take's
audio file (lhotse, nemo, whose manifests are rewritten whole: they are small). Each unit has a
fingerprint of everything that makes its bytes (its rows, its takes' files, the audio settings);
``bestofn_export.json`` keeps them, and a re-export hard-links every unit whose fingerprint is
unchanged from the export it replaces. The new export is built in a hidden sibling directory
and renamed into place, so a crash never leaves a half-written export under the real name."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from bestofn.export import audio as taudio
from bestofn.export.card import write_card
from bestofn.export.formats import registry
from bestofn.export.rows import open_database, select_rows, split_of
from bestofn.export.settings import MARKER, ExportError, ExportSettings
from bestofn.export.steps import (
    ExportSummary,
    Unit,
    _audio_of,
    _check_sources,
    _link_or_copy,
    _publish,
    _write_marker,
    reward_card,
)
from bestofn.util import durable

# Units written at once: two keep both cores of a small box busy (reading the next takes while
# one shard is written); more only adds memory (a shard's audio is held while it is written).
WRITE_THREADS = 2


def _old_units(out: Path) -> dict[str, str]:
    try:
        return json.loads((out / MARKER).read_text())["units"]
    except (OSError, ValueError, KeyError):
        return {}


def _plan_units(writer, table: pa.Table, splits: list[str], settings: ExportSettings):
    units: list[Unit] = []
    by_split: dict[str, list[int]] = {s: [] for s in settings.fractions}
    for i, s in enumerate(splits):
        by_split[s].append(i)
    if writer.unit == "shard":
        for split, idx in by_split.items():
            for n, start in enumerate(range(0, len(idx), settings.shard_size)):
                rows = idx[start : start + settings.shard_size]
                units.append(Unit(writer.shard_path(split, n), rows, split))
    else:
        gids, takes = table.column("group_id").to_pylist(), table.column("take").to_pylist()
        for i, s in enumerate(splits):
            units.append(Unit(writer.audio_path(gids[i], takes[i]), [i], s))
    return units


def _fingerprint(unit: Unit, meta: pa.Table, stats: list[str], key: str, writer) -> str:
    h = hashlib.sha256(f"{writer.name}\n{key}\n".encode())
    h.update("\n".join(stats[i] for i in unit.rows).encode())
    if writer.unit == "shard":  # the rows' metadata is in the shard too
        sink = pa.BufferOutputStream()
        part = meta.take(pa.array(unit.rows, pa.int64()))
        with pa.ipc.new_stream(sink, part.schema) as w:
            w.write_table(part)
        h.update(sink.getvalue().to_pybytes())
    else:
        h.update(f"{meta['group_id'][unit.rows[0]]}/{meta['take'][unit.rows[0]]}".encode())
    return h.hexdigest()


def export_results(
    results: str | Path, settings: ExportSettings, selection: dict, log=print, texts=None
) -> ExportSummary:
    """Export ``results`` (a results directory with bestofn.duckdb) as ``settings`` asks.

    ``selection``: the config's selection section (filter, score, held_out), which must be the
    one the database was built with. ``log`` gets a line per skipped take and the summary.
    ``texts`` (format pairs): (emotion, prompt_id) -> (its Instruction or None, its direction)."""
    t0 = time.perf_counter()
    results = Path(results)
    settings.check()
    settings.check_out_dir(results)
    writer = registry()[settings.format]()  # imports the format's library: fails if absent
    if writer.unit == "whole":
        return writer.export(results, settings, selection, log, t0, texts)
    con = open_database(results)
    try:
        table = select_rows(con, settings, selection)
        if not table.num_rows:
            raise ExportError(f"no take matches ({settings.which}, --where {settings.where!r})")
        table, sources, stats, skipped = _check_sources(results, table, settings)
        if not table.num_rows:
            raise ExportError(f"every take was broken and skipped: {skipped[:5]}")
        key = "prompt_id" if settings.split_by == "prompt" else "group_id"
        splits = split_of(table.column(key).to_pylist(), settings.fractions, settings.split_seed)
        meta = table.drop_columns(["flac_path", "_group_finished"])
        meta = meta.append_column("split", pa.array(splits, pa.string()))
        writer.begin(meta, settings)
        units = _plan_units(writer, meta, splits, settings)
        for u in units:
            u.fingerprint = _fingerprint(u, meta, stats, settings.audio_key(), writer)
        tmp = settings.out.parent / f".{settings.out.name}.partial-{uuid.uuid4().hex[:8]}"
        settings.out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        try:
            written, reused = _write_units(writer, units, tmp, meta, sources, settings)
            meta = writer.finish(tmp, meta, units, settings)
            counts = _counts(meta)
            card_selection = selection
            if settings.reward:  # the card names the reward that ranked the takes
                card_selection = reward_card(selection, settings.reward)
            write_card(
                tmp / "README.md", con, meta, settings, card_selection, writer, counts, skipped
            )
            _write_marker(tmp, settings, selection, units, counts, skipped, meta.num_rows)
            _publish(tmp, settings.out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        con.close()
    summary = ExportSummary(
        settings.out, meta.num_rows, written, reused, skipped, counts["split"],
        time.perf_counter() - t0,
    )  # fmt: skip
    for line in summary.lines(settings.format, writer.unit):
        log(line)
    return summary


def _write_units(writer, units, tmp: Path, meta: pa.Table, sources, settings):
    """Link each unchanged unit from the export being replaced (and each passed-through take
    of a per-take format from its group); write the others on WRITE_THREADS threads (file
    reads, parquet and tar writes, FLAC codecs and soxr run without the GIL)."""
    old = _old_units(settings.out) if settings.out.exists() else {}
    passthrough = settings.sample_rate is None and settings.channels is None
    made: set[Path] = set()
    todo, reused = [], 0
    for u in units:
        dst = tmp / u.relpath
        if dst.parent not in made:
            dst.parent.mkdir(parents=True, exist_ok=True)
            made.add(dst.parent)
        if old.get(u.relpath) == u.fingerprint and (settings.out / u.relpath).is_file():
            _link_or_copy(settings.out / u.relpath, dst)
            reused += 1
        elif writer.unit == "take" and passthrough:
            _link_or_copy(sources[u.rows[0]], dst)  # the group's own file
        else:
            todo.append(u)
    pool = ThreadPoolExecutor(WRITE_THREADS)
    try:
        for _ in pool.map(lambda u: _write_unit(writer, u, tmp, meta, sources, settings), todo):
            pass
    finally:
        pool.shutdown(cancel_futures=True)
    return len(units) - reused, reused


def _write_unit(writer, u: Unit, tmp: Path, meta: pa.Table, sources, settings) -> None:
    dst = tmp / u.relpath
    part = meta.take(pa.array(u.rows, pa.int64()))
    rows = part.select(["sample_rate", "channels", "duration_s"]).to_pylist()
    try:
        audio = [_audio_of(sources[i], r, settings) for i, r in zip(u.rows, rows, strict=True)]
    except taudio.BrokenTake as e:
        gids = part.column("group_id").to_pylist()
        raise ExportError(f"{e} (a take of group(s) {sorted(set(gids))})") from None
    if writer.unit == "take":
        dst.write_bytes(audio[0][0])
    else:
        writer.write_shard(dst, part, audio, settings)
    durable.fsync(dst)


def _counts(meta: pa.Table) -> dict:
    def count(col):
        vc = pc.value_counts(meta.column(col)).to_pylist()
        return {d["values"]: d["counts"] for d in sorted(vc, key=lambda d: d["values"])}

    both = meta.group_by(["emotion", "split"]).aggregate([([], "count_all")]).to_pylist()
    return {
        "emotion": count("emotion"),
        "split": count("split"),
        "emotion_split": {(r["emotion"], r["split"]): r["count_all"] for r in both},
    }
