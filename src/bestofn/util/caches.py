"""The worker's cache directory (config ``runtime.cache_dir``), for what a backend keeps across
worker starts.

The worker sets the root once, before any backend loads (``bestofn.worker.startup``); a backend
asks for a sub-directory of its own. No root (tests, `bestofn ab`, a config with
``cache_dir: null``): ``subdir`` returns None and the backend does the work on every start."""

from __future__ import annotations

import os
from pathlib import Path

_root: Path | None = None


def set_root(path: str | os.PathLike | None) -> None:
    global _root
    _root = Path(path) if path else None


def subdir(name: str) -> Path | None:
    """``ROOT/name``, created; None without a root."""
    if _root is None:
        return None
    directory = _root / name
    directory.mkdir(parents=True, exist_ok=True)
    return directory
