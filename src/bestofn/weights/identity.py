"""A weights path's identity by content, never by place: the manifest's repo and revision of
its folder plus the lock's digest of the files under it, or (no lock, or a path the lock does
not cover) the sha256 of its files. Moving the weights and changing ``weights_root`` keeps
every identity; changing a file's bytes changes the identity of each path holding it (with a
lock: once it is written again, which ``bestofn check`` asks for on any mismatch)."""

from __future__ import annotations

from pathlib import Path

from bestofn.util import hashing
from bestofn.weights import lock, manifest, paths


def _find_lock(path: Path) -> Path | None:
    for parent in path.parents:
        candidate = lock.lock_path(parent)
        if candidate.is_file():
            return candidate
    return None


def _sources(path: Path) -> dict:
    """The manifest's repo@revision of the folder the path is (or lies in), by the folder's
    name: the manifest's layout is kept wherever the tree is moved."""
    for part in (path, *path.parents):
        entries = manifest.entries_in_folder(part.name)
        if entries:
            return {"sources": [f"{e.repo_id}@{e.revision}" for e in entries]}
    return {}


def path_identity(path: str | Path, memo_dir: Path | None = None) -> dict:
    """{sha256, and the manifest's repo@revision of its folder} of a weights path: the same
    with a lock as without while the files match it (the lock spares the hashing)."""
    path = Path(path).expanduser().absolute()
    found = _find_lock(path)
    out = _sources(path)
    if found is not None:
        rel = path.relative_to(found.parent).as_posix()
        files = lock.read_lock(found)
        inside = {
            r[len(rel) :].lstrip("/") or Path(r).name: f["sha256"]
            for r, f in files.items()
            if r == rel or r.startswith(rel + "/")
        }
        if inside:
            out["sha256"] = hashing.combined_sha256(inside)
            return out
    if path.is_dir():
        out["sha256"] = hashing.combined_sha256(hashing.dir_digest(path, memo_dir))
    elif path.is_file():
        out["sha256"] = hashing.combined_sha256({path.name: hashing.file_sha256(path, memo_dir)})
    else:  # nothing there: the plan refuses it before this is asked
        out["missing"] = path.name
    return out


def models_content(models: dict, memo_dir: Path | None = None) -> dict:
    """A copy of a models section (weights paths absolute) with every weights path replaced by
    its ``path_identity``."""
    import copy

    out = copy.deepcopy(models)
    for *_, entry, key, value in paths.weight_options(out):
        entry["options"][key] = path_identity(value, memo_dir)
    return out
