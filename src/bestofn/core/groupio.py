"""One group = one directory, complete or absent.

A group is written into a hidden temporary sibling (``.{prompt_id}.partial-*``), every file
fsync'd, scores.parquet last, then renamed into place. A crash leaves only the hidden partial
directory, which nothing mistakes for a finished group (and ``bestofn verify`` reports).

Nothing that would not decode is published: a take without audio frames is refused before
anything is written (libsndfile writes such a take as a 0-byte file), and every FLAC is
reopened after writing and its header (frames, rate, channels) compared with the take. The
full decode of every frame is ``bestofn verify``'s job (a second pass over every sample)."""

from __future__ import annotations

import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf

from bestofn.util import durable
from bestofn.util.audio import write_flac

SCORES = "scores.parquet"
TAKES = "takes"
PARTIAL_MARK = ".partial-"


def write_threads(threads: int | None) -> int:
    """Threads that encode a group's FLACs (config ``runtime.write_threads``); None: half the
    CPUs this process may use (the other half for the thread that feeds the GPU, the scorers'
    host work and the next group's), at least 4 (the writes also wait on fsync), at most 8."""
    if threads is not None:
        return max(1, int(threads))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(8, max(4, (cpus or 1) // 2))


def take_name(take: int) -> str:
    return f"{take:03d}.flac"


class UnpublishableTake(ValueError):
    """A take that would not make a decodable FLAC; the group is not published."""


def _check_audio(group_dir: Path, take: int, audio: np.ndarray) -> None:
    if audio.ndim not in (1, 2) or audio.shape[0] == 0 or (audio.ndim == 2 and not audio.shape[1]):
        raise UnpublishableTake(
            f"{group_dir}: take {take} has no audio frames (shape {audio.shape}); a FLAC of it "
            "would not decode, so the group is not published"
        )


def _write_checked(path: Path, take: int, audio: np.ndarray, rate: int, subtype: str) -> None:
    write_flac(path, audio, rate, subtype)
    try:
        info = sf.info(str(path))
    except Exception as e:
        raise UnpublishableTake(f"{path} (take {take}) does not open after writing: {e}") from e
    channels = 1 if audio.ndim == 1 else audio.shape[1]
    if (info.frames, info.samplerate, info.channels) != (audio.shape[0], rate, channels):
        raise UnpublishableTake(
            f"{path} (take {take}): header says {info.frames} frames, {info.samplerate} Hz, "
            f"{info.channels} ch; the take has {audio.shape[0]} frames, {rate} Hz, {channels} ch"
        )


def write_group(
    group_dir: Path,
    audios: list[np.ndarray],
    sample_rate: int,
    rows: pa.Table,
    flac_subtype: str = "PCM_16",
    io_threads: int | None = None,
    finalize=None,
) -> None:
    """Atomically publish ``group_dir`` with ``takes/NNN.flac`` and ``scores.parquet``.

    ``finalize(rows) -> rows`` runs after the FLACs are written, before the parquet (timings).
    ``io_threads``: FLACs encoded at once (None: ``write_threads(None)``).
    Raises UnpublishableTake (and publishes nothing) for a take that would not decode."""
    group_dir = Path(group_dir)
    audios = [np.asarray(a) for a in audios]
    for i, audio in enumerate(audios):
        _check_audio(group_dir, i, audio)
    parent = group_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{group_dir.name}{PARTIAL_MARK}{uuid.uuid4().hex[:8]}"
    (tmp / TAKES).mkdir(parents=True)
    try:
        # libsndfile releases the GIL, so FLAC encoding of many takes overlaps on threads.
        with ThreadPoolExecutor(max_workers=write_threads(io_threads)) as pool:
            list(
                pool.map(
                    lambda ia: _write_checked(
                        tmp / TAKES / take_name(ia[0]), ia[0], ia[1], sample_rate, flac_subtype
                    ),
                    enumerate(audios),
                )
            )
        durable.fsync(tmp / TAKES)
        if finalize is not None:
            rows = finalize(rows)
        with open(tmp / SCORES, "wb") as f:
            pq.write_table(rows, f)
            f.flush()
            os.fsync(f.fileno())
        durable.fsync(tmp)
        publish(tmp, group_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish(tmp: Path, group_dir: Path) -> None:
    """Rename a finished temporary directory into place, replacing an older group if any."""
    old = None
    if group_dir.exists():
        old = group_dir.parent / f".{group_dir.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(group_dir, old)
    os.rename(tmp, group_dir)
    durable.fsync(group_dir.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def partial_dirs(results_groups: Path) -> list[Path]:
    """Leftovers of interrupted writes (safe to delete)."""
    return sorted(p for p in Path(results_groups).glob("*/.*") if p.is_dir())
