"""One table of every production backend's published weights: Hugging Face repo, pinned
revision, the files used (allow patterns) and the folder under the config's ``weights_root``.

Each backend module declares its own entries (``PUBLISHED_WEIGHTS``, read from its text by
``bestofn.backends.registry`` without importing it), with the public sources they come from;
this module gathers them, in the registry's order (generators, restorers, scorers). The
folders are those of config/recipes/*.yaml and of ``bestofn fake-weights`` (the same layout,
random weights); more in docs/notes/*.md.

Revisions: the commit each entry is fetched at, where public material pins one (full shas,
each seen pinned the same way in several unrelated public files; docs/notes/weights-revisions.md
lists them): nvidia/parakeet-tdt-0.6b-v3, facebook/w2v-bert-2.0, microsoft/wavlm-base-plus-sv.
For the others no public source seen gives a full commit sha (the one short sha seen,
Empathic-Insight-Voice-Plus 441d220 in its README history, is not a revision the hub resolves):
their ``revision`` is ``UNKNOWN``, fetch takes the repo's default branch and says so, and the
lock records the commit it resolved (``bestofn weights fetch --lock`` fetches that commit on
another machine).
Sizes: None where no public source states them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from bestofn.backends.registry import published_weights

UNKNOWN = "unknown"  # no public commit sha seen: fetch uses the default branch and says so
GB = 10**9


@dataclass(frozen=True)
class WeightEntry:
    name: str  # what `bestofn weights fetch --only` takes
    repo_id: str  # Hugging Face model repo
    revision: str  # commit sha, or UNKNOWN
    allow_patterns: tuple[str, ...]  # the files the backend reads
    folder: str  # under weights_root; several entries may share one (VoiceCLAP's heads)
    size_bytes: int | None  # None: not stated by a public source
    backend: str  # the config backend that reads it
    note: str = ""

    @property
    def pinned(self) -> bool:
        return self.revision != UNKNOWN


MANIFEST: tuple[WeightEntry, ...] = tuple(
    WeightEntry(
        e["name"], e["repo_id"], e["revision"], tuple(e["allow_patterns"]), e["folder"],
        e.get("size_bytes"), backend, e.get("note", ""),
    )
    for backend, e in published_weights()
)  # fmt: skip

BY_NAME = {e.name: e for e in MANIFEST}


class UnknownWeights(ValueError):
    pass


def select(names) -> list[WeightEntry]:
    """The entries named (all for none); an unknown name raises, listing the known ones."""
    if not names:
        return list(MANIFEST)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise UnknownWeights(
            f"unknown weights {', '.join(map(repr, unknown))}; known: {', '.join(BY_NAME)}"
        )
    return [BY_NAME[n] for n in dict.fromkeys(names)]


def entries_in_folder(folder: str) -> list[WeightEntry]:
    return [e for e in MANIFEST if e.folder == folder]


def folder_of(relative: str) -> str | None:
    """The manifest folder a path relative to the weights root lies in (its first part)."""
    parts = PurePosixPath(relative).parts
    return parts[0] if parts and any(e.folder == parts[0] for e in MANIFEST) else None


def entries_for_config(config: dict) -> list[WeightEntry]:
    """The entries whose folder a config's model paths name (relative to ``weights_root``, or
    absolute paths under it), in manifest order."""
    from bestofn.weights.paths import relative_weight_paths

    folders = {folder_of(rel) for rel in relative_weight_paths(config)}
    return [e for e in MANIFEST if e.folder in folders]
