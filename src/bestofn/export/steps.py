"""What every export's run shares: its units and summary, the check of each take's FLAC, a
take's audio as exported, the marker file and the rename into place (bestofn.export.core for the
per-take formats, bestofn.export.pairs for preference pairs)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from bestofn import __version__
from bestofn.export import audio as taudio
from bestofn.export.settings import MARKER, ExportError, ExportSettings
from bestofn.util import durable


@dataclass
class Unit:
    relpath: str
    rows: list[int]
    split: str
    fingerprint: str = ""


@dataclass
class ExportSummary:
    out: Path
    rows: int
    written: int
    reused: int
    skipped: list[str] = field(default_factory=list)
    splits: dict = field(default_factory=dict)
    seconds: float = 0.0

    def lines(self, fmt: str, unit: str) -> list[str]:
        what = "shard(s)" if unit == "shard" else "audio file(s)"
        out = [f"skipped: {s}" for s in self.skipped]
        splits = ", ".join(f"{k}={v}" for k, v in self.splits.items())
        out.append(
            f"export: {self.rows} take(s) as {fmt} in {self.out} ({splits}); wrote "
            f"{self.written} {what}, reused {self.reused} unchanged; {self.seconds:.1f} s"
        )
        return out


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links refused
        shutil.copyfile(src, dst)


def _broken(group_id: str, take: int, why: str) -> str:
    return f"group {group_id} take {take}: {why}"


def _check_sources(results: Path, table: pa.Table, settings: ExportSettings):
    """Every take's FLAC path and identity, after the header check; broken ones stop the export
    unless --skip-broken (then they are dropped and listed)."""
    cols = table.select(["group_id", "take", "flac_path", "sample_rate", "channels", "duration_s"])
    keep, paths, stats, skipped = [], [], [], []
    root = str(results)
    for i, (gid, take, flac, rate, ch, dur) in enumerate(
        zip(*cols.to_pydict().values(), strict=True)
    ):
        path = taudio.source_path(root, gid, flac)
        try:
            stats.append(taudio.probe(path, taudio.Expected(rate, ch, dur)))
        except taudio.BrokenTake as e:
            if not settings.skip_broken:
                raise ExportError(
                    f"{_broken(gid, take, str(e))}; nothing was exported. Pass --skip-broken to "
                    "leave such takes out, or run `bestofn verify --quarantine` and the workflow "
                    "to regenerate the group"
                ) from None
            skipped.append(_broken(gid, take, str(e)))
            continue
        keep.append(i)
        paths.append(path)
    return table.take(pa.array(keep, pa.int64())), paths, stats, skipped


def _audio_of(path: Path, row: dict, settings: ExportSettings):
    """(bytes, rate, channels, frames) of one take as the export holds it."""
    want = taudio.Expected(row["sample_rate"], row["channels"], row["duration_s"])
    rate = settings.sample_rate if settings.sample_rate != want.sample_rate else None
    channels = settings.channels if settings.channels != want.channels else None
    if rate is None and channels is None:
        data = taudio.read_checked(path, want)
        sr, ch, frames = taudio.streaminfo(data[:42])
        return data, sr, ch, frames
    return taudio.converted(path, want, rate, channels)


def reward_card(selection: dict, name: str) -> dict:
    """The card's view of the reward ``name``: its filter and score in the default's place."""
    from bestofn.select.rewards import reward_named, rewards_of

    r = reward_named(rewards_of(selection), name)
    return {**selection, "filter": r.filter, "score": f"{r.score} (reward {name}, top {r.top})"}


def _write_marker(tmp, settings, selection, units, counts, skipped, rows) -> None:
    doc = {
        "bestofn_version": __version__,
        "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": settings.recorded(),
        "selection": {k: selection.get(k) for k in ("filter", "score", "held_out")},
        "rows": rows,
        "splits": counts["split"],
        "skipped": skipped,
        "units": {u.relpath: u.fingerprint for u in units},
    }
    (tmp / MARKER).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    durable.fsync(tmp / MARKER)


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished export into place; an old one is moved aside first, then removed."""
    durable.fsync(tmp)
    if out.exists():
        aside = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        out.rename(aside)
        tmp.rename(out)
        shutil.rmtree(aside)
    else:
        tmp.rename(out)
    durable.fsync(out.parent)
