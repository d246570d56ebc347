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


def _locked_sha256(path: Path) -> str | None:
    """The path's identity from the lock above it (the digests it lists under the path), or
    None: no lock, or one that does not cover the path."""
    found = _find_lock(path)
    if found is None:
        return None
    rel = path.relative_to(found.parent).as_posix()
    files = lock.read_lock(found)
    inside = {
        r[len(rel) :].lstrip("/") or Path(r).name: f["sha256"]
        for r, f in files.items()
        if r == rel or r.startswith(rel + "/")
    }
    return hashing.combined_sha256(inside) if inside else None


def _files_of(path: Path) -> list[Path] | None:
    """The files whose bytes make the identity of an unlocked weights path (None: nothing
    there)."""
    if path.is_dir():
        return hashing.files_under(path)
    return [path] if path.is_file() else None


def path_identity(
    path: str | Path, memo_dir: Path | None = None, digests: dict[str, str] | None = None
) -> dict:
    """{sha256, and the manifest's repo@revision of its folder} of a weights path: the same
    with a lock as without while the files match it (the lock spares the hashing).
    ``digests``: {str(file): sha256} already known (``models_content`` hashes every path's
    files in one pool); the files it lacks are hashed here."""
    path = Path(path).expanduser().absolute()
    out = _sources(path)
    locked = _locked_sha256(path)
    if locked is not None:
        out["sha256"] = locked
        return out
    files = _files_of(path)
    if files is None:  # nothing there: the plan refuses it before this is asked
        out["missing"] = path.name
        return out
    known = dict(digests or {})
    known.update(hashing.hash_files([p for p in files if str(p) not in known], memo_dir))
    if path.is_dir():
        mapping = {str(p.relative_to(path)): known[str(p)] for p in files}
    else:
        mapping = {path.name: known[str(path)]}
    out["sha256"] = hashing.combined_sha256(mapping)
    return out


def models_content(models: dict, memo_dir: Path | None = None) -> dict:
    """A copy of a models section (weights paths absolute) with every weights path replaced by
    its ``path_identity``. The files of every unlocked path are hashed in one pool: most
    checkpoints are one large file, so hashing path after path ran on one core at a time."""
    import copy

    out = copy.deepcopy(models)
    found = [(entry, key, value) for *_, entry, key, value in paths.weight_options(out)]
    files: dict[str, Path] = {}
    for *_, value in found:
        path = Path(value).expanduser().absolute()
        if _locked_sha256(path) is None:
            files.update((str(p), p) for p in _files_of(path) or [])
    digests = hashing.hash_files(list(files.values()), memo_dir)
    for entry, key, value in found:
        entry["options"][key] = path_identity(value, memo_dir, digests)
    return out
