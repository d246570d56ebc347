"""A take's audio as an export holds it: the group's FLAC passed through byte for byte, or,
when a rate or channel count is asked, decoded, converted (soxr) and encoded again.

A pass-through take is checked without decoding: the file exists and its FLAC STREAMINFO
(rate, channels, frames) matches the database row. The full decode of every sample is
``bestofn verify``'s job; a resampled take is decoded whole anyway."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np
import soundfile as sf

RESAMPLE_QUALITY = "HQ"  # soxr's; recorded in the card


class BrokenTake(Exception):
    """A take whose FLAC is missing or does not match its row (message says how)."""


def source_path(results: str, group_id: str, flac_path: str) -> str:
    """The take's FLAC under ``results``: flac_path is recorded relative to the workflow
    directory (``<results>/groups/<group_id>/takes/NNN.flac``), so its tail from
    ``groups/<group_id>/`` is joined to the results directory the export was given. (Strings,
    not Paths: this runs once per take.)"""
    marker = f"groups/{group_id}/"
    at = flac_path.rfind(marker)
    return flac_path if at < 0 else os.path.join(results, flac_path[at:])


def streaminfo(head: bytes) -> tuple[int, int, int]:
    """(sample rate, channels, frames) from a FLAC file's first 42 bytes (the 'fLaC' marker,
    then the STREAMINFO block, which FLAC requires first)."""
    if len(head) < 42 or head[:4] != b"fLaC" or head[4] & 0x7F != 0:
        raise BrokenTake("not a FLAC file (no fLaC marker and STREAMINFO block)")
    bits = int.from_bytes(head[18:26], "big")  # rate 20 | channels-1 3 | bps-1 5 | frames 36
    return bits >> 44, ((bits >> 41) & 0x7) + 1, bits & ((1 << 36) - 1)


@dataclass(frozen=True)
class Expected:
    sample_rate: int
    channels: int
    duration_s: float


def check_header(head: bytes, want: Expected) -> None:
    rate, channels, frames = streaminfo(head)
    if rate != want.sample_rate or channels != want.channels:
        raise BrokenTake(
            f"FLAC is {rate} Hz {channels} ch, the row says {want.sample_rate} Hz "
            f"{want.channels} ch"
        )
    if frames == 0 or abs(frames / rate - want.duration_s) > 1.0 / rate + 1e-6:
        raise BrokenTake(f"FLAC has {frames} frames, the row says {want.duration_s:.4f} s")


def probe(path: str, want: Expected) -> str:
    """Check the take's FLAC header against its row, without reading the rest; returns the
    file's identity for incremental exports (size and mtime: a group is replaced, never edited
    in place, so a rewritten take always changes them)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise BrokenTake(f"{path} is missing") from None
    except OSError as e:
        raise BrokenTake(f"{path} does not open: {e}") from None
    try:
        head, st = os.read(fd, 42), os.fstat(fd)
    finally:
        os.close(fd)
    try:
        check_header(head, want)
    except BrokenTake as e:
        raise BrokenTake(f"{path}: {e}") from None
    return f"{st.st_size}:{st.st_mtime_ns}"


def read_checked(path: str, want: Expected) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise BrokenTake(f"{path} is missing") from None
    except OSError as e:
        raise BrokenTake(f"{path} does not read: {e}") from None
    try:
        check_header(data[:42], want)
    except BrokenTake as e:
        raise BrokenTake(f"{path}: {e}") from None
    return data


def converted(path: str, want: Expected, rate: int | None, channels: int | None):
    """(FLAC bytes, rate, channels, frames) of the take at ``rate``/``channels``."""
    try:
        audio, sr = sf.read(str(path), dtype="float32", always_2d=True)
        subtype = sf.info(str(path)).subtype
    except FileNotFoundError:
        raise BrokenTake(f"{path} is missing") from None
    except Exception as e:
        raise BrokenTake(f"{path} does not decode: {e}") from None
    if sr != want.sample_rate or audio.shape[1] != want.channels or not len(audio):
        raise BrokenTake(
            f"{path}: decodes to {sr} Hz {audio.shape[1]} ch {len(audio)} frames, the row says "
            f"{want.sample_rate} Hz {want.channels} ch {want.duration_s:.4f} s"
        )
    if channels == 1 and audio.shape[1] > 1:
        audio = audio.mean(axis=1, keepdims=True)
    elif channels == 2 and audio.shape[1] == 1:
        audio = np.repeat(audio, 2, axis=1)
    if rate is not None and rate != sr:
        import soxr

        audio = soxr.resample(audio, sr, rate, quality=RESAMPLE_QUALITY)
        sr = rate
    buf = io.BytesIO()
    sf.write(buf, np.clip(audio, -1.0, 1.0), sr, format="FLAC", subtype=subtype)
    return buf.getvalue(), sr, audio.shape[1], len(audio)
