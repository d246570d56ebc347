"""The `bestofn prompts import` subcommand."""

from __future__ import annotations

import sys
from pathlib import Path

SETS = ("voice-acting-prompts", "dramabox", "voice-acting-instructions")
_HUB_SETS = {"laion/voice-acting-prompts": SETS[0], "laion/voice-acting-instructions": SETS[2]}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "prompts",
        help="import the emotions and prompts sheets from LAION's public prompt sets",
        description="Sheets from LAION's three public prompt sets (config/README.md, "
        "'Prompts: importing the public sets').",
    )
    ps = p.add_subparsers(dest="prompts_cmd", required=True)
    q = ps.add_parser(
        "import",
        help="write OUT/emotions.tsv, OUT/prompts.tsv and OUT/import.json from a prompt set",
        description="SOURCE is a hub dataset (laion/voice-acting-prompts, "
        "laion/voice-acting-instructions; fetched with huggingface_hub at --revision) or a "
        "local folder: a clone of LAION-AI/Voice-Acting-Pipeline (its data/dramabox_*.json) "
        "or a downloaded copy of either hub dataset. Prompts with fewer than 4 dialogue words "
        "are skipped and counted. The same source, --seed and --per-emotion write the same "
        "sheets; import.json records the source, the resolved commit and the counts.",
    )
    q.add_argument("source", metavar="SOURCE", help="hub dataset id or local folder")
    q.add_argument("--out", required=True, help="folder for the sheets (written atomically)")
    q.add_argument("--per-emotion", type=int, default=None, metavar="N",
                   help="draw N prompts per emotion (default: all)")  # fmt: skip
    q.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    q.add_argument("--revision", default="main",
                   help="hub revision (branch, tag or commit) of a hub SOURCE")  # fmt: skip
    q.add_argument(
        "--include", action="append", metavar="GLOB",
        help="fetch only the hub files matching GLOB (repeatable), e.g. "
        "geminittsprompts-output-en.tar; default: every file of the set's kind",
    )  # fmt: skip
    q.add_argument(
        "--max-words", type=int, metavar="N",
        help="leave out (and count) prompts of more than N words; default: keep them and say "
        "how many exceed the config's default max_words, which the plan refuses",
    )  # fmt: skip
    q.add_argument("--set", choices=SETS, dest="set_name",
                   help="which set a local folder holds (default: told by its files)")  # fmt: skip
    q.set_defaults(func=_import)


def _which(source: str, folder: Path | None, set_name: str | None) -> str:
    from bestofn.prompts import dramabox
    from bestofn.prompts.sheets import SourceError

    if set_name:
        return set_name
    if folder is None:
        if source in _HUB_SETS:
            return _HUB_SETS[source]
        raise SourceError(
            f"{source}: not a local folder, and not a hub set this command reads "
            f"({', '.join(_HUB_SETS)}); DramaBox comes from a local clone of "
            "LAION-AI/Voice-Acting-Pipeline"
        )
    if dramabox.files(folder):
        return "dramabox"
    if any(folder.rglob("*.tar")) or any(folder.glob("*/*/*.json")):
        return "voice-acting-prompts"
    if any(folder.rglob("*.csv")) or any(folder.rglob("*.parquet")):
        return "voice-acting-instructions"
    raise SourceError(
        f"{folder}: holds none of the sets' files (data/dramabox_*.json, *.tar or "
        "speaker/emotion/*.json, *.csv or *.parquet); name the set with --set"
    )


def run_import(source: str, out: Path, per_emotion: int | None, seed: int, revision: str,
               set_name: str | None = None, include: list[str] | None = None,
               max_words: int | None = None) -> dict:  # fmt: skip
    """Parse, draw and write; the sidecar's contents. SourceError: nothing written."""
    from bestofn.prompts import casting, dramabox, emotion_prompts
    from bestofn.prompts.sheets import (
        MIN_DIALOGUE_WORDS,
        SourceError,
        draw,
        unique_ids,
        write_outputs,
    )
    from bestofn.schemas import schema

    for flag, n in (("--per-emotion", per_emotion), ("--max-words", max_words)):
        if n is not None and n < 1:
            raise SourceError(f"{flag}: {n} is not a positive count")
    path = Path(source).expanduser()
    folder = path if path.exists() else None
    if folder is not None and not folder.is_dir():
        raise SourceError(f"{folder}: not a folder")
    if folder is None and (source.startswith((".", "/", "~")) or source.count("/") != 1):
        raise SourceError(f"{source}: no such file or folder")
    kind = _which(source, folder, set_name)
    module = {SETS[0]: emotion_prompts, SETS[1]: dramabox, SETS[2]: casting}[kind]
    commit = None
    if folder is None:
        if kind == "dramabox":
            raise SourceError(f"{source}: DramaBox is read from a local clone, not the hub")
        from bestofn.prompts.hub import fetch_dataset

        folder, commit = fetch_dataset(source, revision, include or module.PATTERNS)
    parsed = module.parse(folder)
    # the plan refuses a prompt of more than the config's max_words (schema default unless set)
    limit = max_words or schema("config")["properties"]["max_words"]["default"]
    kept = [p for p in parsed.prompts if not max_words or len(p.text.split()) <= limit]
    skipped_long = len(parsed.prompts) - len(kept)
    chosen = unique_ids(draw(kept, per_emotion, seed))
    if not chosen:
        raise SourceError(
            f"{folder}: no prompt left ({parsed.skipped_short} of fewer than "
            f"{MIN_DIALOGUE_WORDS} dialogue words, {skipped_long} of more than --max-words)"
        )
    _check_rows(chosen, source)
    sidecar = {
        "set": kind,
        "source": source,
        "revision": revision if commit else None,
        "commit": commit,
        "files": parsed.files,
        "include": include,
        "seed": seed,
        "per_emotion": per_emotion,
        "prompts_read": len(parsed.prompts) + parsed.skipped_short,
        "skipped_short": parsed.skipped_short,
        "max_words": limit,
        "skipped_long": skipped_long,
        "over_max_words": 0 if max_words else sum(len(p.text.split()) > limit for p in chosen),
        "prompts_written": len(chosen),
    }
    if out.exists() and not out.is_dir():
        raise SourceError(f"{out}: --out is a file, not a folder")
    try:
        write_outputs(out, chosen, sidecar)
    except OSError as e:
        raise SourceError(f"{out}: cannot write the sheets ({e.strerror or e})") from None
    return sidecar


def _check_rows(prompts, source: str) -> None:
    """Each row as the prompts sheet's schema wants it, before anything is written."""
    import jsonschema

    from bestofn.prompts.sheets import PROMPT_COLUMNS, SourceError, sheet_rows
    from bestofn.schemas import schema

    validator = jsonschema.Draft202012Validator(schema("prompts"))
    for row in sheet_rows(prompts)[1]:
        cells = dict(zip(PROMPT_COLUMNS, row, strict=True))
        for err in validator.iter_errors(cells):
            field = ".".join(map(str, err.absolute_path)) or "row"
            raise SourceError(
                f"{source}: prompt {cells['prompt_id']}: field {field!r} "
                f"({cells.get(field, '')!r}) {err.message}"
            )


def _import(args) -> int:
    from bestofn.prompts.sheets import SourceError

    try:
        info = run_import(args.source, Path(args.out), args.per_emotion, args.seed,
                          args.revision, args.set_name, args.include, args.max_words)  # fmt: skip
    except SourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    at = f" at {info['commit']}" if info["commit"] else ""
    if info["skipped_long"]:
        print(f"{info['skipped_long']} prompts left out: more than --max-words {args.max_words}")
    if info["over_max_words"]:
        print(
            f"note: {info['over_max_words']} written prompts have more than {info['max_words']} "
            "words, the config's default max_words: raise max_words in the config, or import "
            f"with --max-words {info['max_words']} to leave them out",
            file=sys.stderr,
        )
    print(
        f"{info['set']}{at}: {info['prompts_read']} prompts read, {info['skipped_short']} "
        f"skipped (fewer than 4 dialogue words), {info['prompts_written']} written to "
        f"{args.out}/prompts.tsv and emotions.tsv (import.json records the source)"
    )
    print(
        "note: every emotion's class is speech: mark the non-verbal ones (laughing, sobbing, "
        "sighing...) nonverbal in emotions.tsv, so that the recipes' word checks skip them",
        file=sys.stderr,
    )
    return 0
