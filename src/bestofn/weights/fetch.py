"""`bestofn weights fetch`: the manifest's repos into one weights root through huggingface_hub
(``snapshot_download`` with the manifest's ``allow_patterns``, into ``ROOT/<folder>``), so the
user's HF token, ``HF_ENDPOINT`` mirror, proxy and resumable downloads work as with any hub
download.

Each repo's revision (the manifest's commit, the lock's, or the default branch) is resolved to
its commit sha first (``HfApi.model_info(...).sha``), and that sha is what is downloaded and
what the lock records: a branch that moves between the two requests cannot mix two commits,
and a second machine fetches the same commit by the lock (``fetch --lock``)."""

from __future__ import annotations

from pathlib import Path

from bestofn.weights.manifest import WeightEntry, select


class FetchError(RuntimeError):
    """The hub refused or could not be reached: the repo and revision named."""


def _hub_errors() -> tuple[type[BaseException], ...]:
    # huggingface_hub's own errors are OSErrors; a refused connection surfaces as httpx's
    try:
        import httpx

        return (OSError, httpx.HTTPError)
    except ImportError:
        return (OSError,)


def resolve_commit(repo_id: str, revision: str | None) -> str:
    """The commit sha a revision (branch, tag, sha; None: the default branch) names now."""
    from huggingface_hub import HfApi

    return HfApi().model_info(repo_id, revision=revision).sha


def fetch(root: str | Path, names=None, log=print, commits: dict | None = None) -> dict:
    """Fetch the named entries (all for none) under ``root``, each at ``commits[name]`` when
    given (a lock's), else at the manifest's revision, else the repo's default branch. Returns
    {name: {"repo_id", "commit", "folder"}}: what the lock records. An unknown name raises
    before anything is written."""
    entries: list[WeightEntry] = select(names)
    from huggingface_hub import snapshot_download

    root = Path(root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    fetched = {}
    for e in entries:
        wanted = (commits or {}).get(e.name) or (e.revision if e.pinned else None)
        if wanted is None:
            log(
                f"weights fetch: {e.name}: the manifest pins no revision of {e.repo_id} (none "
                "public seen): fetching its default branch; the lock records the commit fetched"
            )
        target = root / e.folder
        try:
            commit = resolve_commit(e.repo_id, wanted)
            snapshot_download(
                repo_id=e.repo_id,
                revision=commit,
                allow_patterns=list(e.allow_patterns),
                local_dir=target,
            )
        except _hub_errors() as err:
            why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise FetchError(f"{e.repo_id}@{wanted or 'default branch'}: {why}") from None
        log(f"weights fetch: {e.name}: {e.repo_id}@{commit} -> {target}")
        fetched[e.name] = {"repo_id": e.repo_id, "commit": commit, "folder": e.folder}
    return fetched
