"""The commands around a run: `bestofn verify`, `check`, `plan`, `doctor`, `status` and `ab`
(each registered by add_parser; bestofn.cli routes to them)."""

from __future__ import annotations

import os
import sys

from bestofn.util.parser import config_options


def _verify(args) -> int:
    from bestofn.ops.verify import quarantine_group, verify_groups
    from bestofn.util.user_input import UserInputError

    if not os.path.isdir(args.results):
        raise UserInputError(args.results, "no such results directory")
    per_group, warnings = verify_groups(args.results)
    problems = [p for group_problems in per_group.values() for p in group_problems]
    for w in warnings:
        print(f"warning: {w}")
    for p in problems:
        print(f"error: {p}")
    print(f"verify: {len(per_group)} groups checked, {len(problems)} problem(s)")
    if args.quarantine:
        broken = {g: ps for g, ps in per_group.items() if ps}
        for group_dir, group_problems in broken.items():
            dest = quarantine_group(args.results, group_dir, group_problems)
            print(f"quarantined: {group_dir} -> {dest} (reasons in {dest}/REASON.txt)")
        if broken:
            print(
                f"verify: moved {len(broken)} broken group(s) out of {args.results}/groups; "
                "the next snakemake run regenerates exactly those"
            )
    return 1 if problems or not per_group else 0


def _load_plan(args, *more_errors):
    """The plan of ``args.config`` (groups, checked config), or None after printing the error:
    every command that reads a config fails the same way, exit status 2. A missing or malformed
    config file raises UserInputError (main prints it)."""
    from bestofn.core.config import load_config
    from bestofn.core.plan import PlanError, build_plan

    config = load_config(args.config)
    try:
        return build_plan(config, args.base)
    except (PlanError, *more_errors) as e:
        # the config's own fields are named by the file; a sheet's or weight's problem names
        # its own file already
        where = f"{args.config}: " if str(e).startswith("config ") else ""
        print(f"error: {where}{e}", file=sys.stderr)
        return None


def _results(args, plan) -> str:
    return getattr(args, "results", None) or os.path.join(args.base, plan.config["results"])


def _results(args, plan) -> str:
    return getattr(args, "results", None) or os.path.join(args.base, plan.config["results"])


def _check(args) -> int:
    from bestofn.select.base import SelectionError
    from bestofn.weights.lock import lock_state
    from bestofn.workflow_glue import check_selection_for

    plan = _load_plan(args)
    try:
        if plan is not None:
            check_selection_for(plan.config, args.base)
    except SelectionError as e:
        print(f"error: {e}", file=sys.stderr)
        plan = None
    if plan is None:
        return 2
    for warning in plan.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"weights: {lock_state(plan.config, args.base)}")  # verified by build_plan when one
    print(f"ok: {len(plan.groups)} groups x {plan.config['takes']} takes")
    return 0


def _plan(args) -> int:
    from bestofn.ops.cost import format_report, remaining

    if (plan := _load_plan(args)) is None:
        return 2
    print(format_report(remaining(plan, _results(args, plan)), per_emotion_limit=args.limit))
    return 0


def _doctor(args) -> int:
    from bestofn.ops.doctor import report

    if (plan := _load_plan(args)) is None:
        return 2
    return report(plan, args.base, pilot=not args.no_pilot)


def _status(args) -> int:
    from bestofn.ops.status import watch

    if (plan := _load_plan(args)) is None:
        return 2
    return watch(plan, _results(args, plan), every_s=args.watch)


def _ab(args) -> int:
    from bestofn.ops.ab import ab_main

    return ab_main(args)


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="check every parquet row against its FLAC and back")
    p.add_argument("results", nargs="?", default="results")
    p.add_argument(
        "--quarantine",
        action="store_true",
        help="move each broken group to RESULTS/quarantine/<emotion>/<prompt_id>[-N]/ with a "
        "REASON.txt, so the next run regenerates exactly those groups (not while a run writes)",
    )
    p.set_defaults(func=_verify)

    p = sub.add_parser("check", help="validate config, sheets and selection SQL (no models load)")
    config_options(p, "directory that sheet paths are relative to")
    p.set_defaults(func=_check)

    p = sub.add_parser(
        "plan", help="groups remaining per emotion and the GPU-hours left at the measured rate"
    )
    config_options(p, "directory that sheet paths are relative to")
    p.add_argument("--results", help="results directory (default: the config's, under --base)")
    p.add_argument("--limit", type=int, default=50, help="emotions listed one by one")
    p.set_defaults(func=_plan)

    p = sub.add_parser(
        "doctor",
        help="before a long run: CUDA build vs driver, GPU memory, disk, weights lock, then "
        "one real group per slot, timed (for bestofn plan)",
    )
    config_options(p, "the workflow directory (sheets, results)")
    p.add_argument("--no-pilot", action="store_true", help="the checks only, no group")
    p.set_defaults(func=_doctor)

    p = sub.add_parser(
        "status", help="a run's progress: groups done and left, takes/s, ETA, failures"
    )
    config_options(p, "the workflow directory (sheets, results)")
    p.add_argument("--results", help="results directory (default: the config's, under --base)")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="again every SECONDS")
    p.set_defaults(func=_status)

    p = sub.add_parser(
        "ab",
        help="same groups and seeds under configs A and B: speed, memory, quality deltas, "
        "PASS/FAIL against a thresholds file",
        description="Runs the first --groups groups of A's plan (B must plan them the same) "
        "under A, then under B, each side in a spawned process of its own, and prints a "
        "PASS/FAIL table: generate/restore/score/wall s per clip, peak memory, and the mean "
        "quality delta (B - A) over matched takes for every column of the thresholds file. "
        "Exit 0 PASS, 1 FAIL, 2 bad input, 3 a side failed as it ran.",
    )
    p.add_argument("--a", required=True, help="config of side A (the baseline)")
    p.add_argument("--b", required=True, help="config of side B (the dial)")
    p.add_argument(
        "--thresholds", required=True, help="YAML file: column: {max_increase|max_decrease: x}"
    )
    p.add_argument("--groups", type=int, default=1, help="first N groups of the plan (default 1)")
    p.add_argument("--takes", type=int, help="takes per group for both sides (default: A's config)")
    p.add_argument("--out", help="write the table as parquet here")
    p.add_argument("--base", default=".", help="directory that config paths are relative to")
    p.add_argument("--device", help="run both sides here (default: the configs' device)")
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed runs of the first group per side before timing (compile, CUDA graphs)",
    )
    p.set_defaults(func=_ab)
