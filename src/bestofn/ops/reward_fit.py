"""`bestofn reward fit`: a reward learned from the listeners' votes, as a named reward.

Reads the votes exported by the listening page (``bestofn-votes/1`` files, or a folder of them
such as ``RESULTS/votes/imported``), checks them against the results database as ``bestofn listen
import`` does, and fits a Bradley–Terry model over the takes' score columns standardised over
the run (bestofn.ops.bradley_terry). It prints, on votes held out by group (k-fold), how often
the hand-written ``selection.score`` and the fitted reward agree with the listeners, with 95 %
intervals, the difference between the two, and the listeners' lean to the left take. It writes
the fit on every vote as a YAML snippet ``selection: rewards: NAME: {filter, score, top}``: the
config's filter and the weights written into the score as SQL literals. When the held-out
difference's interval does not lie above zero, or the votes are fewer than
``reward_fit.min_votes``, it says plainly that the votes do not show the fit to be better.

Bad input (a missing or malformed votes file, a vote of another results directory, an unknown
column, a config that does not validate) exits 2 with ``error: <file>: <what>`` and writes
nothing; the snippet is written beside its destination, then renamed.
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bestofn.ops import bradley_terry as bt
from bestofn.util.parser import config_options

CHOSEN = {"left": 1.0, "right": 0.0}


class FitError(ValueError):
    """Bad input: the message starts with the file (or config field) it is about."""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "reward",
        help="rewards learned from the listeners' votes (reward fit)",
    )
    rs = p.add_subparsers(dest="reward_cmd", required=True)
    q = rs.add_parser(
        "fit",
        help="fit a Bradley–Terry reward over the score columns on listener votes",
        description="Fits a Bradley–Terry model over the takes' score columns (standardised "
        "over the run) on the listeners' decisive votes, reports held-out agreement (k-fold "
        "by group) of the hand-written selection.score and of the fitted reward with 95 % "
        "intervals and the position bias, and writes the fitted reward as a named reward "
        "(selection.rewards.NAME). Settings: the config's reward_fit: section. Exit 2 on bad "
        "input (nothing written).",
    )
    q.add_argument(
        "--votes", nargs="+", metavar="VOTES",
        help="exported votes files (bestofn-votes/1) or folders of them (default: the "
        "results' votes store, RESULTS/votes/imported)",
    )  # fmt: skip
    config_options(q, "directory that config paths are relative to")
    q.add_argument("--results", help="results directory (default: the config's, under --base)")
    q.add_argument("--name", help="the reward's name (default: reward_fit.name)")
    q.add_argument("--out", help="the YAML snippet to write (default: RESULTS/rewards/NAME.yaml)")
    q.set_defaults(func=main)


@dataclass
class Settings:
    name: str
    columns: list[str] | None
    l2: float
    folds: int
    min_votes: int
    seed: int

    @classmethod
    def of(cls, config: dict, name: str | None) -> Settings:
        from bestofn.schemas import schema

        props = schema("config")["properties"]["reward_fit"]["properties"]
        given = config.get("reward_fit") or {}
        got = {k: given.get(k, sub.get("default")) for k, sub in props.items()}
        if name is not None:
            if not re.fullmatch(props["name"]["pattern"], name):
                raise FitError(f"--name {name!r}: letters, digits and _, not first a digit")
            got["name"] = name
        return cls(**got)


def _vote_files(paths: list[str]) -> list[Path]:
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.json"))
            if not found:
                raise FitError(f"{p}: a folder without votes files (*.json)")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise FitError(f"{p}: no such votes file or folder")
    return files


def read_votes(files: list[Path], ctx) -> tuple[list[dict], int]:
    """The latest vote per (listener, group, pair) of ``files``, checked as the store's are
    (bestofn.report.votes.check_vote); (votes that count, votes left out as stale: their group
    no longer shows the pair they heard)."""
    from bestofn.report.votes import VotesError, _parse_time, check_vote, read_votes_doc

    latest: dict[tuple, dict] = {}
    for path in files:
        try:
            doc = read_votes_doc(path, ctx)
        except VotesError as e:
            raise FitError(str(e)) from None
        for i, vote in enumerate(doc["votes"]):
            why = check_vote(vote, ctx, strict_build=False, shape_only=True)
            if why:
                raise FitError(f"{path}: vote {i}: {why}")
            key = (vote["listener"], vote["group_id"],
                   tuple(sorted((vote["left_take"], vote["right_take"]))))  # fmt: skip
            t = _parse_time(vote["time"])
            if key not in latest or t >= latest[key][0]:
                latest[key] = (t, vote)
    counted, stale = [], 0
    for _, vote in latest.values():
        if check_vote(vote, ctx, strict_build=False):
            stale += 1
        else:
            counted.append(vote)
    return sorted(counted, key=lambda v: (v["group_id"], v["listener"])), stale


def _columns(con, settings: Settings, config_path: str) -> list[str]:
    from bestofn.select.held_out import is_numeric
    from bestofn.select.trust import measure_columns

    have = {name: t for name, t, *_ in con.execute("DESCRIBE takes").fetchall()}
    if settings.columns is None:
        return measure_columns(con)
    lower = {c.lower(): c for c in have}
    out = []
    for col in settings.columns:
        if col.lower() not in lower:
            raise FitError(
                f"{config_path}: reward_fit.columns: unknown column {col!r}; the takes have: "
                f"{', '.join(measure_columns(con))}"
            )
        actual = lower[col.lower()]
        if not is_numeric(have[actual]):
            raise FitError(
                f"{config_path}: reward_fit.columns: {actual!r} is {have[actual]}, not a number"
            )
        out.append(actual)
    return out


def _standardise(con, columns: list[str]) -> tuple[list[str], list[float], list[float]]:
    """Each column's mean and standard deviation over the finite values of every take; a
    column with one value over the run (no spread) is left out."""
    from bestofn.select.trust import quote_ident

    parts = []
    for col in columns:
        x = f"{quote_ident(col)}::DOUBLE"
        parts.append(
            f"avg({x}) FILTER (WHERE isfinite({x})), stddev_pop({x}) FILTER (WHERE isfinite({x}))"
        )
    row = con.execute(f"SELECT {', '.join(parts)} FROM takes").fetchone() if parts else ()
    kept, means, stds = [], [], []
    for i, col in enumerate(columns):
        mean, std = row[2 * i], row[2 * i + 1]
        if mean is not None and std is not None and std > 0:
            kept += [col]
            means += [float(mean)]
            stds += [float(std)]
    return kept, means, stds


def _z_sql(col: str, mean: float, std: float) -> str:
    """The column standardised over the run, in SQL; a missing value (NULL, NaN) counts as the
    run's mean (0), as in the fit."""
    from bestofn.select.trust import quote_ident

    x = f"{quote_ident(col)}::DOUBLE"
    return (
        f"coalesce(CASE WHEN isfinite({x}) THEN ({x} - {_double(mean)}) / {_double(std)} END, 0.0)"
    )


def _double(x: float, digits: int = 17) -> str:
    """A DOUBLE literal (an exponent makes DuckDB read it as DOUBLE, not DECIMAL); 17
    significant digits give the float back exactly."""
    text = f"{float(x):.{digits}g}"
    return text if "e" in text or "n" in text else f"{text}e0"


def reward_sql(columns, means, stds, weights) -> str:
    """The fitted reward as one DuckDB expression: the weights as literals over the
    standardised columns, largest weight first."""
    order = np.argsort(-np.abs(weights), kind="stable")
    terms = [f"{_double(weights[i], 6)} * {_z_sql(columns[i], means[i], stds[i])}" for i in order]
    return " + ".join(terms) if terms else "0.0"


def _take_table(con, columns, means, stds, filter_sql, score_sql, groups) -> dict:
    """(group, take) -> (standardised features, hand-written score) of the voted groups; the
    hand-written score evaluated as the selection does (``norm()`` over the run's takes)."""
    from bestofn.select.database import resolve_norm

    _, score = resolve_norm(con, "takes", filter_sql, score_sql)
    zs = ", ".join(_z_sql(c, m, s) for c, m, s in zip(columns, means, stds, strict=True))
    rows = con.execute(
        f"SELECT group_id, take, ({score})::DOUBLE{', ' + zs if zs else ''} FROM takes "
        "WHERE group_id IN (SELECT unnest(?))",
        [sorted(groups)],
    ).fetchall()
    return {
        (r[0], r[1]): (np.array(r[3:], dtype=float), np.nan if r[2] is None else float(r[2]))
        for r in rows
    }


@dataclass
class Report:
    n_votes: int
    n_decisive: int
    n_same: int
    n_stale: int
    n_groups: int
    n_listeners: int
    folds: int
    columns: list[str]
    means: list[float]
    stds: list[float]
    weights: np.ndarray
    left_bias: float
    hand: bt.Share
    fitted: bt.Share
    difference: bt.Share
    left_share: bt.Share
    verdict: str
    better: bool


def fit_votes(con, ctx, votes, stale, config, settings: Settings, config_path) -> Report:
    import duckdb

    from bestofn.select.base import SelectionError

    columns = _columns(con, settings, config_path)
    columns, means, stds = _standardise(con, columns)
    if not columns:
        raise FitError(f"{config_path}: reward_fit.columns: no score column varies over the run")
    decisive = [v for v in votes if v["choice"] in CHOSEN]
    groups_voted = {v["group_id"] for v in decisive}
    sel = config["selection"]
    try:
        takes = _take_table(con, columns, means, stds, sel["filter"], sel["score"], groups_voted)
    except (SelectionError, duckdb.Error) as e:
        raise FitError(f"{config_path}: selection.score cannot be evaluated: {e}") from None
    n = len(decisive)
    diffs = np.zeros((n, len(columns)))
    hand_margin = np.zeros(n)
    chose_left = np.zeros(n)
    groups = np.array([v["group_id"] for v in decisive], dtype=object)
    for i, v in enumerate(decisive):
        (xl, sl), (xr, sr) = takes[(v["group_id"], v["left_take"])], takes[
            (v["group_id"], v["right_take"])]  # fmt: skip
        diffs[i] = xl - xr
        hand_margin[i] = sl - sr
        chose_left[i] = CHOSEN[v["choice"]]
    seed = settings.seed
    n_groups = len(groups_voted)
    folds = min(settings.folds, n_groups)
    if folds >= 2:
        held_out = bt.cross_validate(diffs, chose_left, groups, folds, settings.l2, seed)
    else:
        held_out = np.full(n, np.nan)  # one group: nothing to hold out
    fitted_hits = bt.agreement_hits(held_out, chose_left)
    hand_hits = bt.agreement_hits(hand_margin, chose_left)
    hand = bt.share(hand_hits, groups, seed, "hand")
    fitted = bt.share(fitted_hits, groups, seed, "fitted")
    difference = bt.paired_difference(fitted_hits, hand_hits, groups, seed)
    left = bt.share(chose_left, groups, seed, "left")
    final = bt.fit(diffs, chose_left, settings.l2) if n else bt.Fit(np.zeros(len(columns)), 0.0)
    better = n >= settings.min_votes and folds >= 2 and difference.lo > 0
    if n < settings.min_votes:
        verdict = (
            f"TOO FEW VOTES to beat the hand-written score: {n} decisive vote(s), fewer than "
            f"reward_fit.min_votes = {settings.min_votes}. Keep selecting with the "
            "hand-written score; collect more votes."
        )
    elif not better:
        verdict = (
            "NOT SHOWN BETTER: the held-out difference (fitted − hand-written) has an "
            f"interval [{_f(difference.lo)}, {_f(difference.hi)}] that does not lie above 0: "
            "these votes are too few to show the fitted reward beats the hand-written score. "
            "Keep selecting with the hand-written score; collect more votes."
        )
    else:
        verdict = (
            "BETTER: the fitted reward agrees with held-out votes more than the hand-written "
            f"score (difference {_f(difference.share)}, 95 % [{_f(difference.lo)}, "
            f"{_f(difference.hi)}])."
        )
    return Report(
        n_votes=len(votes), n_decisive=n, n_same=len(votes) - n, n_stale=stale,
        n_groups=n_groups, n_listeners=len({v["listener"] for v in votes}), folds=folds,
        columns=columns, means=means, stds=stds, weights=final.weights,
        left_bias=final.left_bias, hand=hand, fitted=fitted, difference=difference,
        left_share=left, verdict=verdict, better=better,
    )  # fmt: skip


def _f(x, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _share_text(s: bt.Share) -> str:
    return f"{_f(s.share)} [95 % {_f(s.lo)}, {_f(s.hi)}]"


def report_lines(r: Report, settings: Settings) -> list[str]:
    lines = [
        f"votes: {r.n_votes} counted ({r.n_decisive} decisive, {r.n_same} 'same'), {r.n_stale} "
        f"stale left out; {r.n_groups} group(s), {r.n_listeners} listener(s)",
        f"held-out agreement ({r.folds}-fold by group, decisive votes; 0.5 is a coin):",
        f"  hand-written selection.score: {_share_text(r.hand)}",
        f"  fitted reward:                {_share_text(r.fitted)}",
        f"  fitted − hand-written:        {_f(r.difference.share)} [95 % {_f(r.difference.lo)}, "
        f"{_f(r.difference.hi)}]",
        f"position bias: left take chosen in {_share_text(r.left_share)} of decisive votes "
        f"(fitted left lean {_f(r.left_bias)} log-odds; 0.5 / 0: none)",
        f"weights (per standard deviation of the column over the run; L2 {settings.l2}):",
    ]
    order = np.argsort(-np.abs(r.weights), kind="stable")
    lines += [f"  {r.columns[i]:24} {r.weights[i]:+.4f}" for i in order]
    return [*lines, r.verdict]


def snippet(r: Report, settings: Settings, filter_sql: str, sources: list[str]) -> str:
    import yaml

    text = (
        f"bestofn reward fit: a Bradley–Terry reward over {len(r.columns)} score column(s), "
        f"fitted on {r.n_decisive} decisive listener vote(s) of {r.n_groups} group(s) from "
        f"{', '.join(sources)}. Held-out agreement ({r.folds}-fold by group): hand-written "
        f"{_share_text(r.hand)}, fitted {_share_text(r.fitted)}. {r.verdict} Columns "
        "standardised over this run's takes: (value - mean) / std, a missing value as the mean."
    )
    head = [f"# {line}" for line in _wrap(text, 94)]
    body = {
        "selection": {
            "rewards": {
                settings.name: {
                    "filter": filter_sql,
                    "score": reward_sql(r.columns, r.means, r.stds, r.weights),
                    "top": 1,
                }
            }
        }
    }
    return "\n".join(head) + "\n" + yaml.safe_dump(body, sort_keys=False, width=10**6)


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run(args) -> tuple[list[str], Path, str]:
    """Everything but the printing: (report lines, output path, snippet)."""
    import duckdb

    from bestofn.core.config import load_config
    from bestofn.report.votes import IMPORTED, Context, VotesError, store_dir
    from bestofn.select.database import open_read_only

    config = load_config(args.config)  # UserInputError: bestofn.cli prints it
    settings = Settings.of(config, args.name)
    results = Path(args.results or Path(args.base) / config.get("results", "results"))
    db = results / "bestofn.duckdb"
    if not db.is_file():
        raise FitError(f"{db}: no results database (run the workflow first)")
    files = _vote_files(args.votes or [str(store_dir(results) / IMPORTED)])
    out = Path(args.out) if args.out else results / "rewards" / f"{settings.name}.yaml"
    try:
        con = open_read_only(db, config.get("database"))
    except duckdb.Error as e:
        raise FitError(f"{db}: cannot open: {e}") from None
    try:
        try:
            ctx = Context.of(con, results)
        except VotesError as e:
            raise FitError(f"{db}: {e}") from None
        votes, stale = read_votes(files, ctx)
        report = fit_votes(con, ctx, votes, stale, config, settings, args.config)
    finally:
        con.close()
    text = snippet(report, settings, config["selection"]["filter"], [str(f) for f in files])
    return report_lines(report, settings), out, text


def main(args) -> int:
    try:
        lines, out, text = run(args)
    except FitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        _write_atomic(out, text)
    except OSError as e:
        print(f"error: {out}: cannot write: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    print(f"wrote {out}: merge its selection.rewards entry into the config to select with it")
    return 0
