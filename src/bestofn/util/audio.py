"""Audio helpers shared by backends and the pipeline (float32, soundfile layout)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr


def to_mono(audio: np.ndarray) -> np.ndarray:
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim == 1:
        return audio
    # Channel by channel: mean(axis=1) over 2 interleaved columns strides through memory and is
    # several times slower, and a group of 64 takes pays it per stage.
    mono = audio[:, 0].copy()
    for c in range(1, audio.shape[1]):
        mono += audio[:, c]
    mono *= np.float32(1.0 / audio.shape[1])
    return mono


def mono_at(audios: list[np.ndarray], sr: int, want: int) -> list[np.ndarray]:
    """Mono copies of a group's takes at ``want`` Hz with soxr, on a thread pool (soxr releases
    the GIL; on the H200 box 48k->16k cost 6 ms per 15 s take serially). The scorers' GPU
    alternative is ``bestofn.backends.scorer_input.scorer_input``."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda a: resample(to_mono(a), sr, want), audios))


def resample(audio: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    if sr_in == sr_out:
        return np.asarray(audio, dtype=np.float32)
    return soxr.resample(np.asarray(audio, dtype=np.float32), sr_in, sr_out, quality="HQ").astype(
        np.float32, copy=False
    )


def n_frames(audio: np.ndarray) -> int:
    return int(audio.shape[0])


def write_flac(path: Path, audio: np.ndarray, sample_rate: int, subtype: str = "PCM_16") -> None:
    """Write and fsync one FLAC file, so a later directory rename publishes durable data."""
    clipped = np.clip(audio, -1.0, 1.0)
    with open(path, "wb") as f:
        sf.write(f, clipped, sample_rate, format="FLAC", subtype=subtype)
        f.flush()
        os.fsync(f.fileno())


def load_audio(path: str | os.PathLike, sample_rate: int | None = None, mono: bool = True):
    """Read a file as float32; optionally mono and resampled. Returns (audio, sample_rate)."""
    audio, sr = sf.read(str(path), dtype="float32", always_2d=False)
    if mono:
        audio = to_mono(audio)
    if sample_rate is not None and sr != sample_rate:
        audio, sr = resample(audio, sr, sample_rate), sample_rate
    return audio, sr
