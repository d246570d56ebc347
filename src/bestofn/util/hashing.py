"""Content hashes of weight files for provenance, memoised so 8 GB checkpoints hash once."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The memo a caller without its own uses: set by a worker from config runtime.cache_dir
# (bestofn.worker.startup.use_cache_dir); None: no memo.
_memo_dir: Path | None = None


def set_memo_dir(path: str | os.PathLike | None) -> None:
    """The memo directory of every ``file_sha256`` call that names none (None: no memo)."""
    global _memo_dir
    _memo_dir = Path(path) if path else None


def file_sha256(path: str | os.PathLike, memo_dir: Path | None = None) -> str:
    """sha256 of a file's bytes, memoised on disk by (path, size, mtime_ns, inode).

    Hashing 8 GB of weights takes seconds; the memo makes every later worker start free
    while any rewrite of the file (new mtime/size/inode) still forces a re-hash. ``memo_dir``
    None: the process's memo (``set_memo_dir``), if any.
    """
    memo_dir = memo_dir if memo_dir is not None else _memo_dir
    path = Path(path).resolve()
    st = path.stat()
    memo_file = None
    if memo_dir is not None:
        stamp = f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"
        memo_file = Path(memo_dir) / hashlib.sha256(stamp.encode()).hexdigest()
        with contextlib.suppress(OSError):
            cached = memo_file.read_text().strip()
            if len(cached) == 64:
                return cached
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if memo_file is not None:
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_file.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(digest)
        os.replace(tmp, memo_file)
    return digest


def hash_files(paths, memo_dir: Path | None = None) -> dict[str, str]:
    """{str(path): sha256} for ``paths``, in their order, hashed in threads (hashlib drops the
    GIL while it hashes, so the files of a checkpoint hash at once on as many cores: a cold
    worker start spent 29 s on moss-fast's files and 22 s on Empathic-Insight's, one file at a
    time). ``memo_dir`` as for ``file_sha256``."""
    paths = [str(p) for p in paths]
    workers = min(8, os.cpu_count() or 1, len(paths))
    if workers <= 1:
        return {p: file_sha256(p, memo_dir) for p in paths}
    with ThreadPoolExecutor(workers, thread_name_prefix="bestofn-hash") as pool:
        digests = list(pool.map(lambda p: file_sha256(p, memo_dir), paths))
    return dict(zip(paths, digests, strict=True))


def files_under(directory: Path) -> list[Path]:
    """Regular files under ``directory``, sorted, skipping hidden entries (.cache, .git)."""
    out = []
    for p in sorted(Path(directory).rglob("*")):
        rel = p.relative_to(directory)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        out.append(p)
    return out


def dir_digest(directory: Path, memo_dir: Path | None = None) -> dict[str, str]:
    """{relative path: sha256} for every file of a checkpoint directory."""
    directory = Path(directory)
    files = files_under(directory)
    digests = hash_files(files, memo_dir)
    return {str(p.relative_to(directory)): digests[str(p)] for p in files}


def combined_sha256(mapping: dict[str, str]) -> str:
    """One sha256 for a {name: sha256} mapping (e.g. a whole checkpoint directory)."""
    return hashlib.sha256(json.dumps(mapping, sort_keys=True).encode()).hexdigest()
