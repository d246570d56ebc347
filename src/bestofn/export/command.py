"""`bestofn export`: its options (each defaults to the config's ``export:`` field) and run."""

from __future__ import annotations

import sys
from pathlib import Path

from bestofn.export.settings import WHICH, ExportError, ExportSettings
from bestofn.util.parser import config_options


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="the selection as training data: hf, webdataset, lhotse or nemo",
        description="Writes the selected (or passing, or all) takes of RESULTS as a Hugging "
        "Face dataset, WebDataset shards, or Lhotse or NeMo manifests, with a dataset card. "
        "Every option defaults to the config's export: section. Exit 2 on bad input (nothing "
        "written).",
    )
    add_arguments(p)
    p.set_defaults(func=main)


def add_arguments(p) -> None:
    p.add_argument("results", nargs="?", help="results directory (default: the config's)")
    p.add_argument(
        "--format", help="an export format, as export.format names them (default: export.format)"
    )
    p.add_argument("--out", help="export directory (default: export.out)")
    config_options(p, "directory the config's results is relative to")
    p.add_argument("--which", help=f"{', '.join(WHICH)} (default: export.which)")
    p.add_argument("--where", help="extra DuckDB filter over the takes columns, score, rank")
    p.add_argument(
        "--reward",
        help="rank by this named reward (selection.rewards; default: the default reward; "
        "export.reward)",
    )
    p.add_argument("--top", type=_whole, help="--which selected: the best K per group (export.top)")
    p.add_argument(
        "--margin",
        help="pairs: the chosen take's score minus the rejected's, at least (export.pairs.margin)",
    )
    p.add_argument(
        "--pairs-per-group", help="pairs: at most P pairs per group (export.pairs.per_group)"
    )
    p.add_argument(
        "--split",
        help="NAME=SHARE,... summing to 1: e.g. train=0.9,validation=0.05,test=0.05 "
        "(default: export.split.fractions); one name: no split",
    )
    p.add_argument("--split-by", choices=["prompt", "group"], help="hash key (export.split.by)")
    p.add_argument("--split-seed", type=int, help="seed of the split hash (export.split.seed)")
    p.add_argument("--shard-size", type=int, help="takes per shard (export.shard_size)")
    p.add_argument("--resample", type=int, help="rate in Hz, with soxr (export.sample_rate)")
    p.add_argument("--channels", type=int, help="1 or 2 (export.channels)")
    p.add_argument("--paths", choices=["relative", "absolute"], help="audio paths in manifests")
    p.add_argument(
        "--skip-broken",
        action="store_true",
        default=None,
        help="leave out (and list) takes whose FLAC is missing or broken",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing export (shards whose rows and audio are unchanged are reused)",
    )


def emotion_texts(config: dict, base: Path) -> dict:
    """(emotion, prompt_id) -> (the Instruction text the group's takes were generated with, None
    where the generator takes none; the emotion's direction text), from the emotions and
    prompts sheets as the plan reads them."""
    from bestofn.core.plan import PlanError, read_sheet
    from bestofn.core.voice_acting import generator_instruction, group_extra

    try:
        emotions = read_sheet(base / config["emotions"], "emotions")
        prompts = read_sheet(base / config["prompts"], "prompts")
        takes_instruction, option = generator_instruction(config["models"])
    except (PlanError, ValueError) as e:
        raise ExportError(str(e)) from None
    out = {}
    for emotion in emotions:
        for prompt in prompts:
            extra = group_extra(emotion, prompt, takes_instruction, option)
            key = (emotion["emotion"], prompt["prompt_id"])
            out[key] = (extra.get("instruction"), emotion["description"])
    return out


def _whole(text: str):
    """--top: a whole number, checked (with a named error) by ExportSettings.check."""
    try:
        return int(text)
    except ValueError:
        return text


def _fractions(spec: str | None) -> dict | None:
    if spec is None:
        return None
    out = {}
    for part in spec.split(","):
        name, _, share = part.partition("=")
        try:
            out[name.strip()] = float(share) if share else 1.0
        except ValueError:
            raise ExportError(f"--split {spec!r}: NAME=SHARE,... with numbers") from None
    return out


def main(args) -> int:
    from bestofn.core.config import load_config
    from bestofn.export.core import export_results

    try:
        config = load_config(args.config)  # UserInputError: bestofn.cli prints it
        results = Path(args.results or Path(args.base) / config["results"])
        settings = ExportSettings.from_config(
            config["export"],
            format=args.format,
            out=args.out,
            which=args.which,
            where=args.where,
            fractions=_fractions(args.split),
            split_by=args.split_by,
            split_seed=args.split_seed,
            shard_size=args.shard_size,
            sample_rate=args.resample,
            channels=args.channels,
            paths=args.paths,
            skip_broken=args.skip_broken,
            overwrite=args.overwrite,
            reward=args.reward,
            top=args.top,
            margin=args.margin,
            pairs_per_group=args.pairs_per_group,
        )
        texts = emotion_texts(config, Path(args.base)) if settings.format == "pairs" else None
        export_results(results, settings, config["selection"], texts=texts)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
