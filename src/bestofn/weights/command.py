"""The `bestofn weights list | fetch | lock` subcommands."""

from __future__ import annotations

import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser(
        "weights",
        help="the production weights: list them, fetch them from the hub, lock them",
        description="The manifest of every production backend's published weights "
        "(bestofn.weights.manifest): list what a config needs, fetch it under one weights "
        "root with huggingface_hub, and lock its files' sizes and sha256 (bestofn check "
        "verifies the lock).",
    )
    ws = p.add_subparsers(dest="weights_cmd", required=True)
    q = ws.add_parser("list", help="the weights, their repos, folders and sizes")
    q.add_argument("--config", help="only what this config's models use")
    q.set_defaults(func=_list)
    q = ws.add_parser(
        "fetch",
        help="download the weights (huggingface_hub), then lock them",
        description="Download what a config's models use into its weights_root (--config), or "
        "every manifest entry into --root; then write the lock, as `weights lock` does.",
    )
    where = q.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="what this config's models use, into its weights_root")
    where.add_argument("--root", help="every entry (or --only's) into this folder")
    q.add_argument("--only", nargs="+", metavar="NAME", help="only these (see `weights list`)")
    q.set_defaults(func=_fetch)
    q = ws.add_parser("lock", help="write ROOT/bestofn-weights.lock.json (size + sha256)")
    q.add_argument("--root", required=True, help="the weights root (config weights_root)")
    q.set_defaults(func=_lock)


def _size(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 1e9:.1f} GB"


def _list(args) -> int:
    from bestofn.weights.manifest import MANIFEST, entries_for_config

    entries = MANIFEST
    if args.config:
        import yaml

        entries = entries_for_config(yaml.safe_load(Path(args.config).read_text()))
    width = max((len(e.name) for e in entries), default=0)
    for e in entries:
        print(f"{e.name:{width}} {e.repo_id}@{e.revision} -> {e.folder}/ ({_size(e.size_bytes)}) "
              f"files {', '.join(e.allow_patterns)}")  # fmt: skip
    known = [e.size_bytes for e in entries if e.size_bytes is not None]
    print(f"{len(entries)} entries; known sizes add up to {_size(sum(known))} "
          f"({len(entries) - len(known)} unknown)")  # fmt: skip
    return 0


def _fetch_target(args) -> tuple[Path, list[str] | None]:
    """The folder to fill and the entries' names (None: all) from --root or --config."""
    if args.root:
        return Path(args.root), args.only
    import yaml

    from bestofn.weights.manifest import UnknownWeights, entries_for_config

    config = yaml.safe_load(Path(args.config).read_text()) or {}
    if not config.get("weights_root"):
        raise UnknownWeights(f"{args.config}: config field weights_root is not set")
    names = args.only or [e.name for e in entries_for_config(config)]
    if not names:
        raise UnknownWeights(f"{args.config}: no model path names a folder of the manifest")
    return Path(config["weights_root"]).expanduser(), names


def _fetch(args) -> int:
    from bestofn.weights.fetch import fetch
    from bestofn.weights.lock import LockError, read_lock, write_lock
    from bestofn.weights.manifest import UnknownWeights

    try:
        root, names = _fetch_target(args)
        fetch(root, names)
        path = write_lock(root)
    except (UnknownWeights, LockError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"weights fetch: done; locked {len(read_lock(path))} files in {path}")
    return 0


def _lock(args) -> int:
    from bestofn.weights.lock import LockError, read_lock, write_lock

    try:
        path = write_lock(args.root)
    except LockError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"weights lock: {len(read_lock(path))} files in {path}")
    return 0
