"""`bestofn weights fetch`: the manifest's repos into one weights root through huggingface_hub
(``snapshot_download`` with the manifest's ``allow_patterns`` and revision, into
``ROOT/<folder>``), so the user's HF token, ``HF_ENDPOINT`` mirror, proxy and resumable
downloads work as with any hub download."""

from __future__ import annotations

from pathlib import Path

from bestofn.weights.manifest import WeightEntry, select


def fetch(root: str | Path, names=None, log=print) -> list[Path]:
    """Fetch the named entries (all for none) under ``root``; returns their folders. An unknown
    name raises before anything is written."""
    entries: list[WeightEntry] = select(names)
    from huggingface_hub import snapshot_download

    root = Path(root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for e in entries:
        if not e.pinned:
            log(
                f"weights fetch: {e.name}: the manifest pins no revision of {e.repo_id} (none "
                "public seen): fetching its default branch; `bestofn weights lock` pins the files"
            )
        target = root / e.folder
        snapshot_download(
            repo_id=e.repo_id,
            revision=e.revision if e.pinned else None,
            allow_patterns=list(e.allow_patterns),
            local_dir=target,
        )
        log(f"weights fetch: {e.name}: {e.repo_id} -> {target}")
        out.append(target)
    return out
