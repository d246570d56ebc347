"""A run's wall on G GPUs projected from the ledger's one-GPU figures: the fixed costs paid once
(each GPU's worker starts at the same time as the others) plus the steady per-clip time of one
GPU times the takes each GPU makes.

    python docs/bench/project_256k.py [--ledger docs/bench/ledger.jsonl] [--gpus 8]
        [--takes 256000] [--steady workflow.s_per_clip_per_gpu]
        [--fixed worker_start.first_takes_cold --fixed final_rules.s_256k]
        [--extra snakemake_start=22] [--end high|low] [--json OUT]

A figure's value is its latest ledger line; a range ("0.0286–0.0303") counts by ``--end``
(high: the slower end, the default). Assumptions, printed with the result: every GPU keeps the
one-GPU steady state (no shared host, disk or database bottleneck; the workflow's groups split
evenly, each GPU a whole number of groups of ``--group-takes``); the fixed costs are those of
one GPU's run and overlap across GPUs; nothing else is paid (no retries, no cold download).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

DEFAULT_FIXED = ("worker_start.first_takes_cold", "final_rules.s_256k")


class LedgerError(ValueError):
    pass


def latest(ledger: list[dict], figure: str) -> dict:
    rows = [r for r in ledger if r.get("figure") == figure]
    if not rows:
        raise LedgerError(f"figure {figure!r} is not in the ledger")
    return rows[-1]


def number(value, end: str = "high") -> float:
    """A ledger value as seconds: a number, or a range's slower (``high``) or faster end."""
    if isinstance(value, (int, float)):
        return float(value)
    found = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", str(value))]
    if not found:
        raise LedgerError(f"value {value!r} has no number")
    return max(found) if end == "high" else min(found)


def project(
    ledger: list[dict],
    gpus: int,
    takes: int,
    steady: str = "workflow.s_per_clip_per_gpu",
    fixed: tuple[str, ...] = DEFAULT_FIXED,
    extra: dict[str, float] | None = None,
    end: str = "high",
    group_takes: int = 64,
) -> dict:
    """The projection and its parts (seconds)."""
    if gpus < 1 or takes < 1 or group_takes < 1:
        raise LedgerError("--gpus, --takes and --group-takes must be at least 1")
    s_per_clip = number(latest(ledger, steady)["value"], end)
    groups = math.ceil(takes / group_takes)
    per_gpu_takes = math.ceil(groups / gpus) * group_takes  # the busiest GPU's share
    steady_s = per_gpu_takes * s_per_clip
    parts = {f: number(latest(ledger, f)["value"], end) for f in fixed}
    parts.update(extra or {})
    total = steady_s + sum(parts.values())
    return {
        "gpus": gpus,
        "takes": takes,
        "groups": groups,
        "takes_on_busiest_gpu": per_gpu_takes,
        "s_per_clip_per_gpu": s_per_clip,
        "steady_s": steady_s,
        "fixed_s": parts,
        "total_s": total,
        "total_min": total / 60,
        "end": end,
    }


def read_ledger(path: Path) -> list[dict]:
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise LedgerError(f"line {i}: not JSON ({e.msg})") from None
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ledger", type=Path, default=Path(__file__).with_name("ledger.jsonl"))
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--takes", type=int, default=256000)
    p.add_argument("--group-takes", type=int, default=64)
    p.add_argument("--steady", default="workflow.s_per_clip_per_gpu")
    p.add_argument("--fixed", action="append", help="a fixed cost's figure id (repeatable)")
    p.add_argument("--extra", action="append", default=[], help="NAME=SECONDS, a fixed cost "
                   "the ledger has no figure for (repeatable)")  # fmt: skip
    p.add_argument("--end", choices=("high", "low"), default="high")
    p.add_argument("--json", type=Path, help="write the projection here too")
    args = p.parse_args(argv)
    try:
        extra = {}
        for item in args.extra:
            name, sep, value = item.partition("=")
            if not sep:
                raise LedgerError(f"--extra {item!r}: expected NAME=SECONDS")
            extra[name] = float(value)
        result = project(
            read_ledger(args.ledger), args.gpus, args.takes, args.steady,
            tuple(args.fixed or DEFAULT_FIXED), extra, args.end, args.group_takes,
        )  # fmt: skip
    except (LedgerError, OSError, ValueError) as e:
        print(f"error: {args.ledger}: {e}", file=sys.stderr)
        return 2
    fixed = ", ".join(f"{k} {v:.1f} s" for k, v in result["fixed_s"].items())
    print(
        f"{result['takes']} takes on {result['gpus']} GPUs: {result['total_min']:.1f} min = "
        f"{result['takes_on_busiest_gpu']} takes x {result['s_per_clip_per_gpu']} s/clip "
        f"({result['steady_s']:.0f} s, {args.steady}, {args.end} end) + fixed: {fixed}\n"
        "assumes: each GPU at the one-GPU steady state, the groups split evenly, the fixed "
        "costs once (overlapping across GPUs)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
