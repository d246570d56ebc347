"""A hub dataset's files at one commit, through huggingface_hub (``HF_ENDPOINT`` and the
usual cache apply): the revision asked for is resolved to its commit first, and the files
are fetched at that commit, so the sidecar names exactly what was read."""

from __future__ import annotations

from pathlib import Path

from bestofn.prompts.sheets import SourceError


def fetch_dataset(repo_id: str, revision: str, patterns: list[str]) -> tuple[Path, str]:
    """(local folder holding the files that match ``patterns``, the resolved commit)."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    unreachable: tuple = (OSError,)  # requests' connection errors (huggingface_hub < 1.0)
    try:
        import httpx  # huggingface_hub >= 1.0 talks through httpx; its errors are not OSErrors

        unreachable += (httpx.HTTPError,)
    except ImportError:
        pass
    try:
        commit = HfApi().dataset_info(repo_id, revision=revision).sha
        folder = snapshot_download(
            repo_id, repo_type="dataset", revision=commit, allow_patterns=patterns
        )
    except (HfHubHTTPError, LocalEntryNotFoundError, *unreachable) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SourceError(f"{repo_id}@{revision}: cannot fetch the dataset: {first}") from None
    if not commit:
        raise SourceError(f"{repo_id}@{revision}: the hub gave no commit for this revision")
    return Path(folder), commit
