"""`bestofn verify RESULTS`: every parquet row matches a FLAC on disk and every FLAC a row."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import soundfile as sf

from bestofn.groupio import SCORES, TAKES, partial_dirs


def verify_results(
    results: str | Path, tolerance_s: float = 1e-3
) -> tuple[list[str], list[str], int]:
    """Return (problems, warnings, groups_checked)."""
    groups_root = Path(results) / "groups"
    problems: list[str] = []
    warnings = [f"leftover partial write (safe to delete): {p}" for p in partial_dirs(groups_root)]
    checked = 0
    for group_dir in sorted(
        p for p in groups_root.glob("*/*") if p.is_dir() and not p.name.startswith(".")
    ):
        checked += 1
        scores = group_dir / SCORES
        if not scores.is_file():
            problems.append(f"{group_dir}: no {SCORES}")
            continue
        try:
            table = pq.read_table(
                scores, columns=["take", "flac_path", "duration_s", "sample_rate"]
            )
        except Exception as e:
            problems.append(f"{scores}: unreadable: {e}")
            continue
        rows = table.to_pylist()
        named = set()
        for row in rows:
            flac = Path(row["flac_path"])
            if flac.is_absolute() or not flac.exists():
                # paths are recorded relative to the workflow directory; resolve from the group
                flac = group_dir / TAKES / flac.name
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
                problems.append(
                    f"{flac}: sample rate {info.samplerate} != row {row['sample_rate']}"
                )
            if abs(seconds - row["duration_s"]) > tolerance_s:
                problems.append(f"{flac}: {seconds:.4f} s on disk != row {row['duration_s']:.4f} s")
        for flac in sorted((group_dir / TAKES).glob("*.flac")):
            if flac.name not in named:
                problems.append(f"{flac}: no row in {scores}")
        if len(named) != len(rows):
            problems.append(f"{scores}: {len(rows)} rows but {len(named)} distinct FLAC paths")
    return problems, warnings, checked
