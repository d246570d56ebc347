"""The weights lock: size and sha256 of every file under a weights root, in
``ROOT/bestofn-weights.lock.json``, written by ``bestofn weights lock`` and verified by
``bestofn check`` (and before any group job: the workflow builds its plan through the same
check). Sizes are compared on every check; hashes through the sha256 memo (keyed by path,
size, mtime and inode: bestofn.util.hashing), so an unchanged tree re-hashes nothing and a
rewritten file is hashed again.

``repos`` records, per manifest entry that ``bestofn weights fetch`` downloaded, the hub repo
and the commit sha it resolved: ``bestofn weights fetch --lock`` fetches exactly those commits
on another machine and checks every file against ``files``. A lock written over files that
were not fetched (``bestofn weights lock`` alone) has no ``repos`` and pins by content only."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bestofn.util import hashing
from bestofn.util.user_input import UserInputError
from bestofn.weights import paths

LOCK_NAME = "bestofn-weights.lock.json"
FORMAT = 1


class LockError(UserInputError):
    """A lock file (or weights root) that cannot be read, named: ``bestofn`` prints it as
    ``error: <file>: <what>`` with exit status 2."""


def lock_path(root: str | Path) -> Path:
    return Path(root) / LOCK_NAME


def write_lock(root: str | Path, memo_dir: Path | None = None, repos: dict | None = None) -> Path:
    """Hash every file under ``root`` (hidden entries such as huggingface_hub's ``.cache`` left
    out) into the lock file; returns its path. ``repos`` ({entry name: {repo_id, commit,
    folder}}, from a fetch) is added to those of the lock already there whose folder is still
    under ``root``."""
    root = Path(root)
    if not root.is_dir():
        raise LockError(root, "not a directory (the weights root to lock)")
    out = lock_path(root)
    kept = {}
    if out.is_file():
        try:
            kept = read_repos(out)
        except LockError:
            kept = {}  # a lock that does not parse is replaced whole
    kept = {n: r for n, r in kept.items() if (root / r["folder"]).is_dir()}
    repos = {**kept, **(repos or {})}
    files = [p for p in hashing.files_under(root) if p.name != LOCK_NAME]
    digests = hashing.hash_files(files, memo_dir)
    table = {
        p.relative_to(root).as_posix(): {"size": p.stat().st_size, "sha256": digests[str(p)]}
        for p in files
    }
    doc = {"format": FORMAT, "files": table}
    if repos:
        doc["repos"] = repos
    tmp = out.with_name(f".{LOCK_NAME}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    os.replace(tmp, out)
    return out


_cache: dict = {}


def _is_commit(value) -> bool:
    return isinstance(value, str) and len(value) == 40 and all(c in HEX for c in value)


HEX = "0123456789abcdef"


def _read(path: str | Path) -> dict:
    """The checked document of a lock file, memoized by path, size and mtime."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise LockError(path, "no such weights lock") from None
    key = (str(path.absolute()), st.st_size, st.st_mtime_ns)
    if key in _cache:
        return _cache[key]
    try:
        data = json.loads(path.read_text())
        files = data["files"]
        if data.get("format") != FORMAT or not isinstance(files, dict):
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        for rel, entry in files.items():
            if not (isinstance(entry["size"], int) and len(entry["sha256"]) == 64):
                raise ValueError(f"entry {rel!r} has no integer size and sha256")
        repos = data.get("repos", {})
        if not isinstance(repos, dict):
            raise ValueError("'repos' is not a mapping")
        for name, repo in repos.items():
            if not (isinstance(repo["repo_id"], str) and isinstance(repo["folder"], str)):
                raise ValueError(f"repo {name!r} has no repo_id and folder")
            if not _is_commit(repo["commit"]):
                raise ValueError(f"repo {name!r}: commit {repo['commit']!r} is not a 40-hex sha")
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
        raise LockError(
            path,
            f"does not parse as a weights lock ({e}); write it again with "
            f"`bestofn weights lock --root {path.parent}`",
        ) from None
    _cache[key] = data
    return data


def read_lock(path: str | Path) -> dict[str, dict]:
    """{relative path: {size, sha256}} of a lock file; a file that is missing or does not parse
    raises LockError naming it."""
    return _read(path)["files"]


def read_repos(path: str | Path) -> dict[str, dict]:
    """{manifest entry name: {repo_id, commit, folder}}: the hub commits a lock pins (empty for
    a lock written over files that were not fetched)."""
    return _read(path).get("repos", {})


def _covers(rel: str, prefix: str) -> bool:
    return prefix in ("", ".") or rel == prefix or rel.startswith(prefix.rstrip("/") + "/")


def verify(
    root: Path, prefixes: list[str] | None = None, memo_dir: Path | None = None, lock=None
) -> list:
    """The lock's files under ``prefixes`` (paths relative to ``root``; None: all) against the
    disk: missing, other size, other sha256, or a file there that the lock does not list. Each
    problem names the file. ``lock``: a lock file elsewhere (default: ROOT's)."""
    lock = Path(lock) if lock else lock_path(root)
    files = read_lock(lock)
    prefixes = [""] if prefixes is None else prefixes
    problems, to_hash = [], []
    for rel, entry in sorted(files.items()):
        if not any(_covers(rel, p) for p in prefixes):
            continue
        path = root / rel
        try:
            size = path.stat().st_size
        except OSError:
            problems.append(f"{path}: missing (listed in {lock})")
            continue
        if size != entry["size"]:
            problems.append(f"{path}: {size} bytes, the lock {lock} says {entry['size']}")
        else:
            to_hash.append((path, entry["sha256"]))
    for prefix in prefixes:
        base = root / prefix
        extra = hashing.files_under(base) if base.is_dir() else []
        for path in extra:
            rel = path.relative_to(root).as_posix()
            if rel not in files and path.name != LOCK_NAME:
                problems.append(f"{path}: not in the lock {lock} (lock again if it belongs)")
    digests = hashing.hash_files([p for p, _ in to_hash], memo_dir)
    for path, want in to_hash:
        if digests[str(path)] != want:
            problems.append(f"{path}: sha256 differs from the lock {lock}")
    return list(dict.fromkeys(problems))  # two options may name one folder


def memo_dir_for(config: dict, base: str | Path = ".") -> Path | None:
    """The sha256 memo the workers use (RESULTS/runtime.cache_dir/sha256-memo), if any."""
    cache_dir = (config.get("runtime") or {}).get("cache_dir", "cache")
    if not cache_dir:
        return None
    results = Path(base) / config.get("results", "results")
    return results / Path(cache_dir).expanduser() / "sha256-memo"


def check_config(config: dict, base: str | Path = ".") -> list[str]:
    """The lock problems of the weights a config uses (empty: verified, or no lock to verify:
    see ``lock_state``). Each problem names the file; a weights_root that does not exist or a
    lock that does not parse is one problem too."""
    try:
        root = paths.weights_root(config, base)
    except paths.WeightsRootError as e:
        return [str(e)]
    if root is None or not lock_path(root).is_file():
        return []
    prefixes = []
    for *_, value in paths.weight_options(config["models"]):
        path = paths.resolve(value, root, base)
        if path.is_relative_to(root):
            prefixes.append(path.relative_to(root).as_posix())
    if not prefixes:
        return []
    try:
        return verify(root, prefixes, memo_dir_for(config, base))
    except LockError as e:
        return [str(e)]


def lock_state(config: dict, base: str | Path = ".") -> str:
    """One line: whether the config's weights have a lock to verify."""
    try:
        root = paths.weights_root(config, base)
    except paths.WeightsRootError as e:
        return str(e)
    if root is None:
        return "no weights_root in the config: no lock to verify"
    if not lock_path(root).is_file():
        return f"no lock at {lock_path(root)} (write one: bestofn weights lock --root {root})"
    return f"the files the config uses match the lock {lock_path(root)}"
