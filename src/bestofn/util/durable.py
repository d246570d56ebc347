"""Flushing what was written to disk before it is published (groups, exports, bundles, caches):
a rename is durable only once the files it points at and the directory it changed are."""

from __future__ import annotations

import os
from pathlib import Path


def fsync(path: str | os.PathLike) -> None:
    """fsync a file's or a directory's data (a directory: its entries, e.g. a rename in it)."""
    fd = os.open(Path(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
