"""Selection you can trust: held-out scorers, what best-of-N bought for every score, how the
scores correlate, and how many takes each filter clause removed.

Selecting by a scorer buys that scorer's taste. Held-out scorers (``selection.held_out``) are
computed for every take but may not appear in the filter or the score; this module checks that
(on DuckDB's parse tree, not by substring) and builds the tables that compare the selected take
with the group median and with one random take per group on them.

Tables and views written into the results database by :func:`build_trust_tables`:

``random_takes``     per group: ``random_take`` (uniform over all takes: the no-selection
                     baseline), ``shown_take`` (the selected take; where none passed, the
                     best-scoring one) and ``other_take`` (uniform over the other takes: what the
                     listening page plays beside it); all seeded by (seed, group id) only.
``group_gains``      per selected group and numeric take column (and ``score``): the selected
                     take's value, the group median, the random take's value, min, max and the
                     best possible value (max or min by the column's direction).
``score_gains``      view: ``group_gains`` averaged per emotion and overall.
``held_out``         per held-out column, per emotion and overall: selected vs median and vs the
                     random take, mean differences with seeded bootstrap 95 % intervals, and
                     ``worse`` when an interval lies entirely on the worse side of zero.
``score_correlation``  pooled within-group rank correlation of every pair of score columns.
``filter_funnel``    takes (and groups) left after each top-level AND clause of the filter.
``listening``        the takes the listening page presents, in a seeded random order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import duckdb
import numpy as np

from bestofn.selection import BASE_COLUMNS, SelectionError

# Which way is better for the columns the shipped scorers write. A held-out column outside this
# table must say it: ``{column: my_col, better: higher}``.
KNOWN_BETTER = {
    "wer": "lower",
    "cer": "lower",
    "dnsmos_sig": "higher",
    "dnsmos_bak": "higher",
    "dnsmos_ovrl": "higher",
    "dnsmos_p808": "higher",
    "speaker_sim": "higher",
    "vc_genuineness": "higher",
    "vc_prompt_sim": "higher",
    "score": "higher",
}
# Base columns that measure a take (the rest are bookkeeping: ids, seeds, timings, workers).
MEASURE_BASE_COLUMNS = ("duration_s", "n_frames")
NUMERIC_TYPES = (
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
    "UBIGINT", "FLOAT", "DOUBLE", "REAL",
)  # fmt: skip
BOOTSTRAP_RESAMPLES = 2000
# The tables a whole-row reference could reach (``takes`` as a struct holds every column).
_TABLE_NAMES = {"takes", "scored"}


@dataclass(frozen=True)
class HeldOut:
    column: str
    better: str  # 'higher' | 'lower'


def _is_numeric(sql_type: str) -> bool:
    t = sql_type.upper()
    return t.startswith(NUMERIC_TYPES) or t.startswith("DECIMAL")


def seeded_rng(seed: int, *key: object) -> np.random.Generator:
    """A generator seeded by (seed, key...) only, like the take seeds (bestofn.spec.take_seed)."""
    text = ":".join(str(k) for k in (seed, *key))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def presentation_order(seed: int, group_id: str, takes: Sequence[int]) -> list[int]:
    """The order in which a listening round presents ``takes`` of one group: a permutation
    seeded by (seed, group id) only. Any human or model listening round must use a seeded order
    like this one (never take order or score order: listeners favour positions) and record it."""
    takes = list(takes)
    return [takes[i] for i in seeded_rng(seed, group_id, "listen").permutation(len(takes))]


# ---------------------------------------------------------------------------------------------
# SQL expressions, as DuckDB parses them


def _parse_expression(sql: str, name: str) -> dict:
    """DuckDB's parse tree of ``SELECT (sql)`` (the whole statement)."""
    if not sql.strip() or ";" in sql:
        raise SelectionError(f"selection.{name} must be one SQL expression, got {sql!r}")
    con = duckdb.connect()
    try:
        tree = json.loads(
            con.execute("SELECT json_serialize_sql(?)", [f"SELECT ({sql})"]).fetchone()[0]
        )
    finally:
        con.close()
    if tree.get("error"):
        raise SelectionError(
            f"selection.{name} is invalid SQL: {tree.get('error_message')}\n{name}: {sql}"
        )
    return tree


def referenced_columns(sql: str, name: str = "expression") -> set[str]:
    """Every column name the expression ``sql`` mentions, lower-cased (DuckDB identifiers are
    case-insensitive), from DuckDB's parse tree: string literals and lambda parameters are not
    columns. Every part of a qualified name counts (``t.col`` and ``col.field`` both name
    ``col``). ``*`` stands for a star or ``COLUMNS(...)`` expression, which can reach any
    column."""
    tree = _parse_expression(sql, name)
    found: set[str] = set()

    def walk(node, bound: frozenset[str]) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, bound)
            return
        if not isinstance(node, dict):
            return
        cls = node.get("class")
        if cls == "COLUMN_REF":
            names = [n.lower() for n in node.get("column_names", [])]
            if not (len(names) == 1 and names[0] in bound):
                found.update(names)
            return
        if cls == "STAR":
            found.add("*")
        if cls == "LAMBDA":
            params = set()
            lhs = node.get("lhs") or {}
            for ref in lhs.get("children", [lhs]):
                params.update(n.lower() for n in ref.get("column_names", []))
            walk(node.get("expr"), bound | params)
            return
        for value in node.values():
            walk(value, bound)

    walk(tree["statements"][0]["node"]["select_list"], frozenset())
    return found


def _unwrap(text: str) -> str:
    """``(a OR b)`` -> ``a OR b``; ``(a) OR (b)`` stays as it is."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth, quote = 0, None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and i < len(text) - 1:
                return text
    return text[1:-1]


def filter_clauses(filter_sql: str) -> list[str]:
    """The top-level AND clauses of the filter, in order, as DuckDB writes them back
    (``a AND (b AND c)`` is three clauses; an OR is one)."""
    tree = _parse_expression(filter_sql, "filter")
    node = tree["statements"][0]["node"]["select_list"][0]
    children = node["children"] if node.get("type") == "CONJUNCTION_AND" else [node]
    con = duckdb.connect()
    out = []
    try:
        for child in children:
            tree["statements"][0]["node"]["select_list"] = [child]
            text = con.execute(
                "SELECT json_deserialize_sql(?::JSON)", [json.dumps(tree)]
            ).fetchone()[0]
            out.append(_unwrap(text.removeprefix("SELECT ").strip()))
    finally:
        con.close()
    return out


# ---------------------------------------------------------------------------------------------
# Held-out columns


def held_out_columns(items: Iterable[str | dict] | None) -> list[HeldOut]:
    """``selection.held_out`` entries (a column name, or ``{column, better}``) -> HeldOut.
    A bare name takes its direction from KNOWN_BETTER; an unknown one is refused."""
    out: list[HeldOut] = []
    seen: set[str] = set()
    for i, item in enumerate(items or []):
        where = f"selection.held_out[{i}]"
        if isinstance(item, str):
            column, better = item, KNOWN_BETTER.get(item.lower())
            if better is None:
                raise SelectionError(
                    f"{where}: bestofn does not know whether more or less {item!r} is better; "
                    f"write {{column: {item}, better: higher}} (or lower)"
                )
        else:
            column, better = (
                item["column"],
                item.get("better") or KNOWN_BETTER.get(item["column"].lower()),
            )
            if better not in ("higher", "lower"):
                raise SelectionError(f"{where}: better must be 'higher' or 'lower', got {better!r}")
        if column.lower() == "score":
            raise SelectionError(f"{where}: 'score' is the composite itself; it cannot be held out")
        if column.lower() in seen:
            raise SelectionError(f"{where}: {column!r} is held out twice")
        seen.add(column.lower())
        out.append(HeldOut(column, better))
    return out


def check_held_out(
    filter_sql: str,
    score_sql: str,
    held_out: Iterable[str | dict] | None,
    columns: dict[str, str] | None = None,
) -> list[HeldOut]:
    """Refuse a filter or score that mentions a held-out column, and (when the takes columns are
    known) a held-out name that is not a numeric takes column. Returns the parsed entries."""
    if columns is not None:  # a misspelt name first: it is the likelier mistake
        known = {c.lower(): t for c, t in columns.items()}
        for item in held_out or []:
            name = item if isinstance(item, str) else item.get("column", "")
            if name.lower() not in known:
                raise SelectionError(
                    f"selection.held_out: {name!r} is not a takes column; the configured "
                    f"scorers write: {', '.join(sorted(set(columns) - set(BASE_COLUMNS)))}"
                )
            if not _is_numeric(known[name.lower()]):
                raise SelectionError(
                    f"selection.held_out: {name!r} is {known[name.lower()]}, not a number: "
                    "only numeric columns can be compared"
                )
    entries = held_out_columns(held_out)
    if not entries:
        return entries
    names = {h.column.lower(): h.column for h in entries}
    for name, sql in (("filter", filter_sql), ("score", score_sql)):
        refs = referenced_columns(sql, name)
        used = sorted(names[r] for r in refs if r in names)
        if used:
            raise SelectionError(
                f"selection.{name} uses held-out column(s) {', '.join(used)}: a held-out scorer "
                f"must never be selected on (drop it from selection.held_out, or from the "
                f"{name})\n{name}: {sql}"
            )
        whole = sorted(refs & (_TABLE_NAMES | {"*"}))
        if whole:
            raise SelectionError(
                f"selection.{name} uses {whole[0]!r}, which reaches every column, the held-out "
                f"ones ({', '.join(names.values())}) too: name the columns it needs\n{name}: {sql}"
            )
    return entries


# ---------------------------------------------------------------------------------------------
# Tables


def measure_columns(con: duckdb.DuckDBPyConnection, table: str = "takes") -> list[str]:
    """The numeric take columns that measure a take (scorer columns, duration, frames), in the
    table's order: every numeric column except the bookkeeping base columns, and except
    columns with no value at all (``n_frames`` of a generator without frames)."""
    skip = set(BASE_COLUMNS) - set(MEASURE_BASE_COLUMNS)
    cols = [
        name
        for name, sql_type, *_ in con.execute(f"DESCRIBE {table}").fetchall()
        if name not in skip and name not in ("score", "passes") and _is_numeric(sql_type)
    ]
    if not cols:
        return cols
    counts = con.execute(f"SELECT {', '.join(f'count({_q(c)})' for c in cols)} FROM {table}")
    return [c for c, n in zip(cols, counts.fetchone(), strict=True) if n]


def _better(column: str, held: dict[str, str]) -> str | None:
    return held.get(column.lower()) or KNOWN_BETTER.get(column.lower())


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _random_takes(con, seed: int) -> None:
    rows = con.execute(
        """
        WITH best AS (
            SELECT group_id, take FROM scored
            QUALIFY row_number() OVER (PARTITION BY group_id ORDER BY score DESC NULLS LAST, take)
                    = 1)
        SELECT s.group_id, list(s.take ORDER BY s.take),
               any_value(coalesce(g.selected_take, b.take))
        FROM scored s JOIN groups g USING (group_id) JOIN best b USING (group_id)
        GROUP BY s.group_id ORDER BY 1
        """
    ).fetchall()
    out = []
    for group_id, takes, shown in rows:
        random_take = takes[int(seeded_rng(seed, group_id, "baseline").integers(len(takes)))]
        others = [t for t in takes if t != shown]
        other = (
            others[int(seeded_rng(seed, group_id, "other").integers(len(others)))]
            if others
            else None
        )
        out.append((group_id, random_take, shown, other))
    con.execute(
        "CREATE TABLE random_takes (group_id VARCHAR, random_take INTEGER, shown_take INTEGER, "
        "other_take INTEGER)"
    )
    if out:
        con.executemany("INSERT INTO random_takes VALUES (?, ?, ?, ?)", out)


def _group_gains(con, columns: list[str], held: dict[str, str]) -> None:
    con.execute(
        """
        CREATE TABLE group_gains (
            group_id VARCHAR, emotion VARCHAR, column_name VARCHAR, better VARCHAR,
            selected DOUBLE, median DOUBLE, random DOUBLE, min DOUBLE, max DOUBLE, best DOUBLE,
            n_takes BIGINT)
        """
    )
    for col in [*columns, "score"]:
        better = _better(col, held)
        best = {"higher": "max(v)", "lower": "min(v)"}.get(better, "NULL")
        con.execute(
            f"""
            INSERT INTO group_gains
            SELECT s.group_id, any_value(s.emotion), ?, ?,
                   any_value(v) FILTER (WHERE s.take = g.selected_take),
                   median(v), any_value(v) FILTER (WHERE s.take = r.random_take),
                   min(v), max(v), {best}, count(v)
            FROM (SELECT *, {_q(col)}::DOUBLE AS v FROM scored) s
            JOIN groups g USING (group_id) JOIN random_takes r USING (group_id)
            WHERE g.status = 'selected'
            GROUP BY s.group_id ORDER BY s.group_id
            """,
            [col, better],
        )
    con.execute(
        """
        CREATE VIEW score_gains AS
        SELECT CASE WHEN grouping(emotion) = 1 THEN 'overall' ELSE 'emotion' END AS level,
               emotion, column_name, any_value(better) AS better,
               count(selected) AS n_groups,
               avg(selected) AS selected_mean, avg(median) AS median_mean,
               avg(random) AS random_mean, avg(best) AS best_mean,
               avg(selected - median) AS selected_minus_median,
               avg(best - median) AS best_minus_median,
               -- the share of what the best take would have bought that selection bought
               avg(selected - median) / nullif(avg(best - median), 0) AS share_of_best
        FROM group_gains
        GROUP BY GROUPING SETS ((column_name, emotion), (column_name))
        ORDER BY column_name, level DESC, emotion
        """
    )


def _bootstrap_ci(d: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    """Percentile 95 % interval of the mean of ``d`` over BOOTSTRAP_RESAMPLES resamples."""
    n = len(d)
    means = np.empty(BOOTSTRAP_RESAMPLES)
    chunk = max(1, 4_000_000 // n)
    for start in range(0, BOOTSTRAP_RESAMPLES, chunk):
        stop = min(start + chunk, BOOTSTRAP_RESAMPLES)
        means[start:stop] = d[rng.integers(0, n, (stop - start, n))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def _held_out(con, entries: list[HeldOut], seed: int) -> None:
    con.execute(
        """
        CREATE TABLE held_out (
            level VARCHAR, emotion VARCHAR, column_name VARCHAR, better VARCHAR,
            n_groups BIGINT, selected_mean DOUBLE, median_mean DOUBLE, random_mean DOUBLE,
            vs_median DOUBLE, vs_median_lo DOUBLE, vs_median_hi DOUBLE,
            vs_random DOUBLE, vs_random_lo DOUBLE, vs_random_hi DOUBLE,
            worse_than_median BOOLEAN, worse_than_random BOOLEAN, worse BOOLEAN,
            resamples INTEGER)
        """
    )
    rows = []
    for h in entries:
        data = con.execute(
            "SELECT emotion, selected, median, random FROM group_gains "
            "WHERE column_name = ? AND selected IS NOT NULL ORDER BY group_id",
            [h.column],
        ).fetchall()
        levels = [("overall", None, data)]
        for emotion in sorted({r[0] for r in data}):
            levels.append(("emotion", emotion, [r for r in data if r[0] == emotion]))
        for level, emotion, part in levels:
            sel = np.array([r[1] for r in part], dtype=float)
            med = np.array([r[2] for r in part], dtype=float)
            rnd = np.array([np.nan if r[3] is None else r[3] for r in part], dtype=float)
            row = [level, emotion, h.column, h.better, len(part)]
            row += [float(np.nanmean(x)) if np.isfinite(x).any() else None for x in (sel, med, rnd)]
            worse = []
            for name, base in (("median", med), ("random", rnd)):
                d = sel - base
                d = d[~np.isnan(d)]
                mean = float(d.mean()) if len(d) else None
                lo = hi = None
                if len(d) >= 2:
                    lo, hi = _bootstrap_ci(
                        d, seeded_rng(seed, "bootstrap", h.column, emotion, name)
                    )
                bad = None
                if lo is not None:
                    bad = hi < 0 if h.better == "higher" else lo > 0
                worse.append(bad)
                row += [mean, lo, hi]
            flags = [w for w in worse if w is not None]
            row += [*worse, any(flags) if flags else None, BOOTSTRAP_RESAMPLES]
            rows.append(row)
    if rows:
        con.executemany(f"INSERT INTO held_out VALUES ({', '.join(['?'] * 18)})", rows)


def _correlation(con, columns: list[str]) -> None:
    """Pooled within-group rank correlation: each column becomes its within-group rank (ties
    averaged), centred on the group's mean rank and divided by the group's size; then Pearson
    over all takes. Selection acts within groups, so differences between groups (prompt length,
    emotion) do not enter."""
    cols = [*columns, "score"]
    ranked = ", ".join(
        f"CASE WHEN {_q(c)} IS NULL THEN NULL ELSE "
        f"(rank() OVER (PARTITION BY group_id ORDER BY {_q(c)}) "
        f"+ (count(*) OVER (PARTITION BY group_id, {_q(c)}) - 1) / 2.0 "
        f"- (count({_q(c)}) OVER (PARTITION BY group_id) + 1) / 2.0) "
        f"/ count({_q(c)}) OVER (PARTITION BY group_id) END AS {_q('r_' + c)}"
        for c in cols
    )
    con.execute(f"CREATE TEMP TABLE ranked AS SELECT {ranked} FROM scored")
    pairs = [(a, b) for i, a in enumerate(cols) for b in cols[i:]]
    exprs = ", ".join(
        f"corr({_q('r_' + a)}, {_q('r_' + b)}), "
        f"count(*) FILTER (WHERE {_q('r_' + a)} IS NOT NULL AND {_q('r_' + b)} IS NOT NULL)"
        for a, b in pairs
    )
    values = con.execute(f"SELECT {exprs} FROM ranked").fetchone()
    con.execute(
        "CREATE TABLE score_correlation "
        "(column_a VARCHAR, column_b VARCHAR, rho DOUBLE, n_takes BIGINT)"
    )
    rows = []
    for k, (a, b) in enumerate(pairs):
        rho, n = values[2 * k], values[2 * k + 1]
        rho = None if rho is None or not np.isfinite(rho) else float(rho)
        if a == b and n:
            rho = 1.0 if rho is not None else None
        rows.append((a, b, rho, n))
        if a != b:
            rows.append((b, a, rho, n))
    con.executemany("INSERT INTO score_correlation VALUES (?, ?, ?, ?)", rows)
    con.execute("DROP TABLE ranked")


def _funnel(con, filter_sql: str) -> None:
    clauses = filter_clauses(filter_sql)
    cums = []
    for i in range(len(clauses)):
        cums.append(" AND ".join(f"coalesce(({c})::BOOLEAN, false)" for c in clauses[: i + 1]))
    aggs = ", ".join(
        f"count(*) FILTER (WHERE {c}), count(DISTINCT group_id) FILTER (WHERE {c})" for c in cums
    )
    con.execute(
        "CREATE TABLE filter_funnel (level VARCHAR, emotion VARCHAR, step INTEGER, "
        "clause VARCHAR, takes_in BIGINT, removed BIGINT, takes_left BIGINT, groups_left BIGINT)"
    )
    rows = con.execute(
        f"SELECT CASE WHEN grouping(emotion) = 1 THEN 'overall' ELSE 'emotion' END, emotion, "
        f"count(*), count(DISTINCT group_id), {aggs} FROM scored "
        "GROUP BY GROUPING SETS ((), (emotion)) ORDER BY 1 DESC, 2"
    ).fetchall()
    out = []
    for level, emotion, n, n_groups, *steps in rows:
        out.append((level, emotion, 0, "(all takes)", n, 0, n, n_groups))
        before = n
        for i, clause in enumerate(clauses):
            left, groups_left = steps[2 * i], steps[2 * i + 1]
            out.append((level, emotion, i + 1, clause, before, before - left, left, groups_left))
            before = left
    con.executemany("INSERT INTO filter_funnel VALUES (?, ?, ?, ?, ?, ?, ?, ?)", out)


def _listening(con, seed: int) -> None:
    """The pair of takes the listening page presents per group, in a seeded order: the selected
    take (or, where no take passed, the best-scoring failing take) and one random other take."""
    rows = con.execute(
        "SELECT g.group_id, g.emotion, g.prompt_id, g.status, r.shown_take, r.other_take "
        "FROM groups g JOIN random_takes r USING (group_id) ORDER BY g.group_id"
    ).fetchall()
    out = []
    for group_id, emotion, prompt_id, status, first, other in rows:
        role = "selected" if status == "selected" else "best_failing"
        shown = [(first, role)] + ([(other, "random")] if other is not None else [])
        order = presentation_order(seed, group_id, [t for t, _ in shown])
        for position, take in enumerate(order, start=1):
            out.append((group_id, emotion, prompt_id, position, take, dict(shown)[take], seed))
    con.execute(
        "CREATE TABLE listening (group_id VARCHAR, emotion VARCHAR, prompt_id VARCHAR, "
        "listen_order INTEGER, take INTEGER, role VARCHAR, order_seed BIGINT)"
    )
    if out:
        con.executemany("INSERT INTO listening VALUES (?, ?, ?, ?, ?, ?, ?)", out)


def build_trust_tables(
    con: duckdb.DuckDBPyConnection,
    filter_sql: str,
    held_out: Iterable[str | dict] | None = None,
    seed: int = 0,
) -> None:
    """Write the tables of this module's docstring; needs ``takes``, ``scored``, ``groups``."""
    have = {r[0]: r[1] for r in con.execute("DESCRIBE takes").fetchall()}
    actual = {c.lower(): c for c in have}
    entries = []
    for h in held_out_columns(held_out):
        if h.column.lower() not in actual:
            raise SelectionError(
                f"selection.held_out: {h.column!r} is not a column of the takes; they have: "
                f"{', '.join(sorted(set(have) - set(BASE_COLUMNS)))}"
            )
        column = actual[h.column.lower()]
        if not _is_numeric(have[column]):
            raise SelectionError(f"selection.held_out: {column!r} is {have[column]}, not a number")
        entries.append(HeldOut(column, h.better))
    held = {h.column.lower(): h.better for h in entries}
    columns = measure_columns(con)
    _random_takes(con, seed)
    _group_gains(con, columns, held)
    _held_out(con, entries, seed)
    _correlation(con, columns)
    _funnel(con, filter_sql)
    _listening(con, seed)
    con.execute(
        "CREATE TABLE trust_settings AS SELECT ? AS seed, ?::JSON AS held_out, ? AS filter, "
        "? AS resamples",
        [seed, json.dumps([h.__dict__ for h in entries]), filter_sql, BOOTSTRAP_RESAMPLES],
    )
