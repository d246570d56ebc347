"""The `bestofn weights list | fetch | lock` subcommands."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from bestofn.util.user_input import UserInputError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "weights",
        help="the production weights: list them, fetch them from the hub, lock them",
        description="The manifest of every production backend's published weights "
        "(bestofn.weights.manifest): list what a config needs, fetch it under one weights "
        "root with huggingface_hub, and lock its files' sizes and sha256 and the hub commit "
        "of each repo (bestofn check verifies the lock; fetch --lock fetches the same commits "
        "on another machine).",
    )
    ws = p.add_subparsers(dest="weights_cmd", required=True)
    q = ws.add_parser(
        "list", help="the weights, their repos, folders and sizes, and the commits a lock pins"
    )
    q.add_argument("--config", help="only what this config's models use (its weights_root's lock)")
    q.add_argument("--root", help="show the commits pinned by this weights root's lock")
    q.set_defaults(func=_list)
    q = ws.add_parser(
        "fetch",
        help="download the weights (huggingface_hub), then lock them with their hub commits",
        description="Download what a config's models use into its weights_root (--config), or "
        "every manifest entry into --root; then write the lock, as `weights lock` does, with "
        "the commit each repo resolved to. With --lock LOCK: fetch exactly the commits LOCK "
        "records (into --root, the config's weights_root, or LOCK's folder) and check every "
        "file against its sha256; the lock is copied in only when all match.",
    )
    q.add_argument("--config", help="what this config's models use, into its weights_root")
    q.add_argument("--root", help="every entry (or --only's) into this folder")
    q.add_argument("--lock", help="a weights lock from another machine: fetch its commits")
    q.add_argument("--only", nargs="+", metavar="NAME", help="only these (see `weights list`)")
    q.set_defaults(func=_fetch)
    q = ws.add_parser(
        "lock", help="write ROOT/bestofn-weights.lock.json (size + sha256, commits kept)"
    )
    q.add_argument("--root", required=True, help="the weights root (config weights_root)")
    q.set_defaults(func=_lock)


def _size(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 1e9:.1f} GB"


def _config_root(path: str) -> tuple[dict, Path]:
    """A config file's mapping and its weights_root (UserInputError when not set)."""
    from bestofn.core.config import load_config

    config = load_config(path)
    if not config.get("weights_root"):
        raise UserInputError(path, "config field weights_root is not set")
    return config, Path(config["weights_root"]).expanduser()


def _list(args) -> int:
    from bestofn.weights.lock import lock_path, read_repos
    from bestofn.weights.manifest import MANIFEST, entries_for_config

    entries, root = MANIFEST, Path(args.root) if args.root else None
    if args.config:
        from bestofn.core.config import load_config

        config = load_config(args.config)
        entries = entries_for_config(config)
        if root is None and config.get("weights_root"):
            root = Path(config["weights_root"]).expanduser()
    pins = read_repos(lock_path(root)) if root and lock_path(root).is_file() else {}
    width = max((len(e.name) for e in entries), default=0)
    for e in entries:
        pinned = pins.get(e.name, {}).get("commit", "none")
        print(f"{e.name:{width}} {e.repo_id}@{e.revision} -> {e.folder}/ ({_size(e.size_bytes)}) "
              f"files {', '.join(e.allow_patterns)}"
              + (f"; locked commit {pinned}" if root else ""))  # fmt: skip
    known = [e.size_bytes for e in entries if e.size_bytes is not None]
    print(f"{len(entries)} entries; known sizes add up to {_size(sum(known))} "
          f"({len(entries) - len(known)} unknown)")  # fmt: skip
    if root:
        where = lock_path(root)
        print(f"commits: {where}" if pins else f"commits: none recorded ({where})")
    return 0


def _fetch_target(args) -> tuple[Path, list[str] | None]:
    """The folder to fill and the entries' names (None: all) from --root or --config."""
    from bestofn.weights.manifest import entries_for_config

    if args.root:
        return Path(args.root), args.only
    if args.config:
        config, root = _config_root(args.config)
        names = args.only or [e.name for e in entries_for_config(config)]
        if not names:
            raise UserInputError(args.config, "no model path names a folder of the manifest")
        return root, names
    return Path(args.lock).parent, args.only


def _fetch(args) -> int:
    from bestofn.weights.fetch import FetchError, fetch
    from bestofn.weights.lock import read_lock, write_lock
    from bestofn.weights.manifest import UnknownWeights

    if not (args.root or args.config or args.lock):
        print("error: weights fetch: give --config, --root or --lock", file=sys.stderr)
        return 2
    if args.root and args.config:
        print("error: weights fetch: --config or --root, not both", file=sys.stderr)
        return 2
    try:
        root, names = _fetch_target(args)
        if args.lock:
            return _fetch_locked(Path(args.lock), root, names)
        fetched = fetch(root, names)
        path = write_lock(root, repos=fetched)
    except UnknownWeights as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except FetchError as e:  # the hub, not the input: nothing locked
        print(f"error: weights fetch: {e}", file=sys.stderr)
        return 1
    print(f"weights fetch: done; locked {len(read_lock(path))} files and {len(fetched)} "
          f"commit(s) in {path}")  # fmt: skip
    return 0


def _fetch_locked(lock: Path, root: Path, names: list[str] | None) -> int:
    """Fetch the commits ``lock`` records into ``root``, check every file of the lock, then
    copy the lock in (only when everything matches: a root whose files differ gets no lock that
    would call them verified)."""
    from bestofn.weights.fetch import fetch
    from bestofn.weights.lock import LOCK_NAME, read_lock, read_repos, verify
    from bestofn.weights.manifest import BY_NAME

    files, repos = read_lock(lock), read_repos(lock)
    if not repos:
        raise UserInputError(
            lock, "records no hub commit (written by `weights lock` over files that `weights "
            "fetch` did not download): fetch with `bestofn weights fetch` where it was made",
        )  # fmt: skip
    unknown = [n for n in repos if n not in BY_NAME]
    moved = [n for n in repos if n in BY_NAME and BY_NAME[n].repo_id != repos[n]["repo_id"]]
    if unknown or moved:
        raise UserInputError(
            lock, f"names weights this manifest does not have ({', '.join(unknown + moved)}): "
            "the lock comes from another version of bestofn",
        )  # fmt: skip
    chosen = [n for n in repos if names is None or n in names]
    if not chosen:
        raise UserInputError(lock, f"pins none of {names}; it pins {sorted(repos)}")
    fetch(root, chosen, commits={n: repos[n]["commit"] for n in chosen})
    folders = sorted({repos[n]["folder"] for n in chosen})
    uncovered = [rel for rel in files if not any(rel.startswith(f + "/") for f in folders)]
    problems = verify(root, folders, lock=lock)
    if names is None:
        problems += [
            f"{root / rel}: in the lock but in no fetched repo's folder" for rel in uncovered
        ]
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        print(f"error: {lock}: {len(problems)} file(s) differ from the lock after fetching its "
              "commits; no lock written", file=sys.stderr)  # fmt: skip
        return 2
    target = root / LOCK_NAME
    if lock.resolve() != target.resolve():
        tmp = target.with_name(f".{LOCK_NAME}.tmp{os.getpid()}")
        shutil.copyfile(lock, tmp)
        os.replace(tmp, target)
    print(f"weights fetch --lock: {len(chosen)} commit(s) fetched; every file of "
          f"{', '.join(folders)} matches {lock}")  # fmt: skip
    return 0


def _lock(args) -> int:
    from bestofn.weights.lock import read_lock, read_repos, write_lock

    path = write_lock(args.root)
    print(f"weights lock: {len(read_lock(path))} files, {len(read_repos(path))} hub commit(s) "
          f"in {path}")  # fmt: skip
    return 0
