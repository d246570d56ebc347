"""`bestofn verify RESULTS`: every parquet row matches a FLAC on disk and every FLAC a row.

`bestofn verify --quarantine` moves each broken group directory out of ``RESULTS/groups`` to
``RESULTS/quarantine/<emotion>/<prompt_id>[-N]/`` with a ``REASON.txt``: Snakemake then sees
the group missing and the next run regenerates exactly those groups."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import soundfile as sf

from bestofn.core.groupio import SCORES, TAKES, partial_dirs, take_name

QUARANTINE = "quarantine"
REASON = "REASON.txt"


def _group_dirs(groups_root: Path) -> list[Path]:
    return sorted(p for p in groups_root.glob("*/*") if p.is_dir() and not p.name.startswith("."))


def verify_group(group_dir: Path, tolerance_s: float = 1e-3) -> list[str]:
    """Every problem of one published group directory (empty: the group is sound)."""
    problems: list[str] = []
    scores = group_dir / SCORES
    if not scores.is_file():
        return [f"{group_dir}: no {SCORES}"]
    try:
        table = pq.read_table(scores, columns=["take", "flac_path", "duration_s", "sample_rate"])
    except Exception as e:
        return [f"{scores}: unreadable: {e}"]
    rows = table.to_pylist()
    named = set()
    for row in rows:
        recorded = Path(row["flac_path"])
        want = (group_dir.parent.name, group_dir.name, TAKES, take_name(row["take"]))
        if recorded.parts[-4:] != want:
            problems.append(
                f"{scores} take {row['take']}: flac_path {row['flac_path']!r} does not name "
                f"this take ({'/'.join(want)})"
            )
        # flac_path is relative to the workflow directory; the group's own file is what is
        # checked, so a results directory moved or copied elsewhere verifies as well
        flac = group_dir / TAKES / recorded.name
        named.add(flac.name)
        if not flac.is_file():
            problems.append(f"{scores} take {row['take']}: {row['flac_path']} does not exist")
            continue
        try:
            info = sf.info(str(flac))
            sf.read(str(flac), frames=-1, dtype="float32")  # decodes the whole stream
        except Exception as e:
            problems.append(f"{flac}: does not decode: {e}")
            continue
        seconds = info.frames / info.samplerate
        if info.samplerate != row["sample_rate"]:
            problems.append(f"{flac}: sample rate {info.samplerate} != row {row['sample_rate']}")
        if abs(seconds - row["duration_s"]) > tolerance_s:
            problems.append(f"{flac}: {seconds:.4f} s on disk != row {row['duration_s']:.4f} s")
    for flac in sorted((group_dir / TAKES).glob("*.flac")):
        if flac.name not in named:
            problems.append(f"{flac}: no row in {scores}")
    if len(named) != len(rows):
        problems.append(f"{scores}: {len(rows)} rows but {len(named)} distinct FLAC paths")
    return problems


def verify_groups(
    results: str | Path, tolerance_s: float = 1e-3
) -> tuple[dict[Path, list[str]], list[str]]:
    """Return ({group dir: its problems} for every published group, warnings)."""
    groups_root = Path(results) / "groups"
    warnings = [f"leftover partial write (safe to delete): {p}" for p in partial_dirs(groups_root)]
    return {g: verify_group(g, tolerance_s) for g in _group_dirs(groups_root)}, warnings


def verify_results(
    results: str | Path, tolerance_s: float = 1e-3
) -> tuple[list[str], list[str], int]:
    """Return (problems, warnings, groups_checked)."""
    per_group, warnings = verify_groups(results, tolerance_s)
    problems = [p for group_problems in per_group.values() for p in group_problems]
    return problems, warnings, len(per_group)


def quarantine_group(results: str | Path, group_dir: Path, problems: list[str]) -> Path:
    """Move a broken group to ``RESULTS/quarantine/<emotion>/<prompt_id>[-N]`` (never over an
    earlier quarantined copy) with a ``REASON.txt`` listing ``problems``; return where."""
    group_dir = Path(group_dir)
    parent = Path(results) / QUARANTINE / group_dir.parent.name
    parent.mkdir(parents=True, exist_ok=True)
    dest, n = parent / group_dir.name, 0
    while dest.exists():
        n += 1
        dest = parent / f"{group_dir.name}-{n}"
    # Same filesystem (both under RESULTS): a rename, so the group leaves groups/ at once.
    os.rename(group_dir, dest)
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    (dest / REASON).write_text(
        f"quarantined by `bestofn verify --quarantine` at {stamp}\n"
        f"from: {group_dir}\n"
        "The next workflow run regenerates this group; this copy is kept for inspection and "
        "can be deleted.\n"
        f"problems ({len(problems)}):\n" + "".join(f"  {p}\n" for p in problems)
    )
    return dest
