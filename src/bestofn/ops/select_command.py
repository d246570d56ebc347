"""`bestofn select`: recompute selection from the saved takes and scores, without a GPU and
without rerunning a group.

Without ``--reward`` it rebuilds the results database from the groups' scores.parquet files
exactly as the workflow's ``database`` rule does (the same streaming build in bounded memory:
config ``database:``), so a changed filter, score or reward takes effect on the whole database
(selection, trust tables, per-reward tables); listener votes are added back. With ``--reward
NAME`` it recomputes that named reward's tables alone, in place, from the database's takes
(one transaction: a failure leaves the database as it was)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bestofn.util.parser import config_options


def add_parser(sub) -> None:
    p = sub.add_parser(
        "select",
        help="recompute selection (filter, score, named rewards) from the saved takes; no GPU",
        description="Rebuild the results database's selection from the groups' saved scores "
        "(as the workflow's database rule does), or, with --reward NAME, recompute one named "
        "reward's tables (reward_picks, reward_selection, best_of_k) in place. Exit 2 on bad "
        "input; the database is then unchanged.",
    )
    config_options(p, "directory the config's paths are relative to")
    p.add_argument("--results", help="results directory (default: the config's)")
    p.add_argument("--reward", help="recompute only this named reward (selection.rewards)")
    p.set_defaults(func=main)


class _Refused(Exception):
    pass


def main(args) -> int:
    try:
        print(run(args))
    except _Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def run(args) -> str:
    from bestofn.core.config import load_config
    from bestofn.core.plan import PlanError, build_plan
    from bestofn.select.base import SelectionError
    from bestofn.select.held_out import scorer_directions
    from bestofn.select.rewards import DEFAULT, context_of, reward_named, rewards_of
    from bestofn.workflow_glue import check_selection_for

    base = Path(args.base)
    try:
        plan = build_plan(load_config(args.config), base)
        config = plan.config
        check_selection_for(config, base)
        rewards = rewards_of(config["selection"])
        if args.reward is not None:
            reward_named(rewards, args.reward)
    except (PlanError, SelectionError, OSError) as e:
        raise _Refused(str(e)) from None
    results = Path(args.results or base / config["results"])
    db = results / "bestofn.duckdb"
    context = context_of(base / config["emotions"], config["models"])
    t0 = time.perf_counter()
    if args.reward is not None:
        if args.reward == DEFAULT:
            raise _Refused(
                "--reward default: the default reward fills the selection and trust tables; run "
                "`bestofn select` without --reward to rebuild them"
            )
        if not db.is_file():
            raise _Refused(f"{db} does not exist: run the workflow (snakemake) first")
        counts = _one_reward(db, rewards, args.reward, context, config["database"])
        return (
            f"select: reward {args.reward}: {counts[args.reward]} take(s) picked in {db} "
            f"({time.perf_counter() - t0:.1f} s)"
        )
    from bestofn.core.groupio import SCORES
    from bestofn.report.votes import reapply
    from bestofn.select.database import build_database

    files = [results / "groups" / e / p / SCORES for e, p in sorted(plan.groups)]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise _Refused(
            f"{len(missing)} of {len(files)} groups have no {SCORES} (first: {missing[0]}): "
            "finish the run (snakemake) first; `bestofn select` never generates"
        )
    sel = config["selection"]
    try:
        counts = build_database(
            files, db, sel["filter"], sel["score"], held_out=sel["held_out"],
            seed=config["seed"], directions=scorer_directions(config["models"]),
            memory_limit=config["database"]["memory_limit"],
            threads=config["database"]["threads"], named_rewards=sel["rewards"],
            context=context,
        )  # fmt: skip
    except SelectionError as e:
        raise _Refused(str(e)) from None
    votes = reapply(db, results)
    return (
        f"select: {counts['takes']} takes, {counts['groups']} groups, {counts['selected']} "
        f"selected, rewards {', '.join(r.name for r in rewards)} in {db} "
        f"({time.perf_counter() - t0:.1f} s); votes: {votes}. The report is rebuilt by the "
        "next snakemake run"
    )


def _one_reward(db: Path, rewards, name: str, context, database: dict) -> dict:
    import duckdb

    from bestofn.select.base import SelectionError
    from bestofn.select.rewards import resolve_over, write_reward_tables

    config = {"memory_limit": database["memory_limit"]}
    if database.get("threads"):
        config["threads"] = int(database["threads"])
    con = duckdb.connect(str(db), config=config)
    try:
        con.execute(f"SET temp_directory = '{db.parent / '.duckdb-tmp'}'")
        con.execute("BEGIN")
        resolved = resolve_over(con, "takes", rewards, context)
        counts = write_reward_tables(con, rewards, resolved, only=name)
        con.execute("COMMIT")
    except (SelectionError, duckdb.Error) as e:
        con.execute("ROLLBACK")
        raise _Refused(f"{db}: {e}") from None
    finally:
        con.close()
    return counts
