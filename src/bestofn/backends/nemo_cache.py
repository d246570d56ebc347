"""A ``.nemo`` archive's members, extracted once into the worker cache and kept there.

Why: NeMo's restore unpacks the whole archive (gigabytes for Parakeet-TDT-0.6b-v3) into a
temporary directory on every worker start, and it can restore from a directory instead
(``SaveRestoreConnector.model_extracted_dir``), which builds Parakeet faster (ledger figure
worker_start.parakeet_build_extracted).

- **Named by content**: ``ROOT/nemo-extracted/SHA256/``, the archive's digest (the one its
  provenance records), so a changed archive gets its own directory.
- **Complete or not used**: the members are extracted into a hidden sibling, each file is
  fsync'd, a manifest of names and sizes is written last, and the directory is renamed into
  place. A directory whose manifest is missing or does not match its files is extracted again.
- **One extraction**: workers starting together (8 on a box, many SLURM jobs on a shared
  results directory) take an exclusive lock per digest; one extracts, the others wait and read
  it. Extractions cut short earlier (hidden siblings) are removed under that lock.
- **Never worse than no cache**: with no cache root, no digest (``hash_weights: false``) or a
  Python whose tarfile lacks the ``data`` filter (before 3.11.4), NeMo unpacks the archive as
  before; so it does after any error of the cache itself (disk full, a read-only cache, a lock
  the filesystem refuses), with a warning naming ``runtime.cache_dir``. A corrupt archive is
  left to NeMo's restore, whose error names the config field. Old digests' directories stay
  until removed by hand.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from bestofn.util import caches, durable

log = logging.getLogger(__name__)

MANIFEST = ".bestofn-extracted.json"  # written last: every member's path and size


def extracted(nemo: Path, digest: str | None) -> Path | None:
    """The directory holding ``nemo``'s members (extracted now if need be); None: restore from
    the archive itself (see the module docstring for when)."""
    if not digest or not hasattr(tarfile, "data_filter"):
        return None
    try:
        root = caches.subdir("nemo-extracted")
        return None if root is None else _extract_once(Path(nemo), digest, root)
    except tarfile.TarError:  # the archive's own fault: NeMo's restore says so, naming the field
        return None
    except OSError as e:  # the cache's
        log.warning(
            "could not keep %s extracted in the worker cache (config field runtime.cache_dir): "
            "%s: %s; NeMo unpacks it instead", nemo, type(e).__name__, e,
        )  # fmt: skip
        return None


def is_complete(directory: Path) -> bool:
    """``directory`` holds every file its manifest names, each of the size it names."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        return all((directory / name).stat().st_size == size for name, size in manifest.items())
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def _extract_once(nemo: Path, digest: str, root: Path) -> Path:
    target = root / digest
    with open(root / f".{digest}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one extracts; the others wait here, then read it
        if is_complete(target):
            return target
        for stale in root.glob(f".{digest[:16]}-*"):  # cut short earlier; none runs now
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists():  # incomplete (a crash after the rename, files removed): again
            shutil.rmtree(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}-", dir=root))
        try:
            with tarfile.open(nemo) as tar:
                tar.extractall(tmp, filter="data")  # nothing outside tmp, no links out
            manifest = {}
            for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
                durable.fsync(path)
                manifest[str(path.relative_to(tmp))] = path.stat().st_size
            (tmp / MANIFEST).write_text(json.dumps(manifest, sort_keys=True))
            durable.fsync(tmp / MANIFEST)
            os.rename(tmp, target)
            durable.fsync(root)  # the rename itself
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone after the rename; else the rest
    return target
