"""Selection you can trust: held-out scorers, what best-of-N bought for every score, how the
scores correlate, and how many takes each filter clause removed.

Selecting by a scorer buys that scorer's taste. Held-out scorers (``selection.held_out``) are
computed for every take but may not appear in the filter or the score; this module checks that
(on DuckDB's parse tree, not by substring) and builds the tables that compare the selected take
with the group median and with one random take per group on them.

Tables and views written into the results database by :class:`TrustTables` (the held-out
checks and the SQL parsing are bestofn.select.held_out):

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

import duckdb
import numpy as np

from bestofn.select.arrow_io import arrow_array, filled, insert_arrow
from bestofn.select.base import BASE_COLUMNS, SelectionError
from bestofn.select.held_out import (
    HeldOut,
    declared_better,
    filter_clauses,
    held_out_columns,
    is_numeric,
)
from bestofn.select.rewards import rank_window

__all__ = [
    "TrustTables", "measure_columns", "presentation_order", "quote_ident", "resolve_held_out",
    "seeded_rng",
]  # fmt: skip

# Base columns that measure a take (the rest are bookkeeping: ids, seeds, timings, workers).
MEASURE_BASE_COLUMNS = ("duration_s", "n_frames")
BOOTSTRAP_RESAMPLES = 2000


def seeded_rng(seed: int, *key: object) -> np.random.Generator:
    """A generator seeded by (seed, key...) only, like the take seeds
    (bestofn.util.spec.take_seed)."""
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
# Tables, built chunk by chunk (bestofn.select.database.build_database feeds the chunks)
#
# Every statistic is a per-group aggregate or a sum over takes, so the takes of a chunk of
# whole groups are read once, reduced to per-group rows (or to sums), and dropped: memory
# follows the chunk, time follows the takes. Only per-group rows outlive a chunk.


def quote_ident(name: str) -> str:
    """``name`` as a DuckDB identifier in double quotes (a quote inside doubled)."""
    return '"' + name.replace('"', '""') + '"'


def measure_candidates(con: duckdb.DuckDBPyConnection, table: str = "takes") -> list[str]:
    """The numeric take columns that may measure a take (scorer columns, duration, frames), in
    the table's order: every numeric column except the bookkeeping base columns."""
    skip = set(BASE_COLUMNS) - set(MEASURE_BASE_COLUMNS)
    return [
        name
        for name, sql_type, *_ in con.execute(f"DESCRIBE {table}").fetchall()
        if name not in skip and name not in ("score", "passes") and is_numeric(sql_type)
    ]


def measure_columns(con: duckdb.DuckDBPyConnection, table: str = "takes") -> list[str]:
    """measure_candidates less the columns with no value at all (``n_frames`` of a generator
    without frames)."""
    cols = measure_candidates(con, table)
    if not cols:
        return cols
    selects = ", ".join(f"count({quote_ident(c)})" for c in cols)
    counts = con.execute(f"SELECT {selects} FROM {table}")
    return [c for c, n in zip(cols, counts.fetchone(), strict=True) if n]


def resolve_held_out(
    con: duckdb.DuckDBPyConnection,
    held_out: Iterable[str | dict] | None,
    directions: dict[str, str] | None = None,
) -> list[HeldOut]:
    """The held-out entries with the takes table's own spelling; refuses a name that is not a
    numeric takes column (``takes`` may be empty: only its columns are read)."""
    have = {r[0]: r[1] for r in con.execute("DESCRIBE takes").fetchall()}
    actual = {c.lower(): c for c in have}
    entries = []
    for h in held_out_columns(held_out, directions):
        if h.column.lower() not in actual:
            raise SelectionError(
                f"selection.held_out: {h.column!r} is not a column of the takes; they have: "
                f"{', '.join(sorted(set(have) - set(BASE_COLUMNS)))}"
            )
        column = actual[h.column.lower()]
        if not is_numeric(have[column]):
            raise SelectionError(f"selection.held_out: {column!r} is {have[column]}, not a number")
        entries.append(HeldOut(column, h.better))
    return entries


# The rank sums' products (takes x columns, transposed, times takes x columns) run in blocks
# of rows small enough that OpenBLAS computes each on one thread (it splits a product of more
# than 2^18 multiply-adds): its threads wait for each other spinning, so with the other core
# busy a whole-chunk product (32,768 x 53) took 0.7-1.6 s against 0.02 s on one thread (a
# 2-core VM, numpy 2.4's OpenBLAS), up to a third of the database rule at 256k.
_SINGLE_THREAD_MADDS = 2**18


def _add_rank_sums(sums: dict, valid: np.ndarray, r0: np.ndarray) -> None:
    """``sums`` += the pooled products of ``valid`` (1 where a take has a rank) and ``r0``
    (the ranks, 0 where none): [a, b] sums over the takes where a and b are both set."""
    k = r0.shape[1]
    step = max(16, _SINGLE_THREAD_MADDS // max(1, k * k))
    for i in range(0, len(r0), step):
        v, r = valid[i : i + step], r0[i : i + step]
        sums["n"] += v.T @ v
        sums["a"] += r.T @ v  # [a, b]: sum of a over takes where a and b are set
        sums["aa"] += (r * r).T @ v
        sums["ab"] += r.T @ r


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


class TrustTables:
    """The trust tables of this module's docstring, fed chunk by chunk.

    ``add_chunk`` reads ``chunk_scored`` (a chunk's takes with ``score`` and ``passes``) and
    ``chunk_groups`` (those groups' rows of the ``groups`` table) on ``work`` (the build's
    connection where None; bestofn.select.database passes an in-memory database of its own, so the
    per-chunk tables are not versioned by the build's one transaction) and appends what it
    keeps of them to the ``part_*`` tables on ``con``; ``finish`` writes the tables from those."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        filter_sql: str,
        entries: list[HeldOut],
        seed: int,
        directions: dict[str, str] | None = None,
        work: duckdb.DuckDBPyConnection | None = None,
    ):
        self.con, self.filter_sql, self.entries, self.seed = con, filter_sql, entries, seed
        self.work = con if work is None else work
        self.held = {h.column.lower(): h.better for h in entries}
        self.directions = directions or {}
        self.candidates = measure_candidates(con)
        self.cols = [*self.candidates, "score"]  # gains and correlations cover the composite
        self.non_null = np.zeros(len(self.candidates), dtype=np.int64)
        k = len(self.cols)
        # pooled sufficient statistics of every pair of within-group ranks (see _correlation)
        self.sums = {name: np.zeros((k, k)) for name in ("n", "a", "aa", "ab")}
        self.clauses = filter_clauses(filter_sql)
        con.execute(
            "CREATE TEMP TABLE part_random (group_id VARCHAR, random_take INTEGER, "
            "shown_take INTEGER, other_take INTEGER)"
        )
        con.execute(
            """
            CREATE TEMP TABLE part_gains (
                group_id VARCHAR, emotion VARCHAR, column_name VARCHAR, better VARCHAR,
                selected DOUBLE, median DOUBLE, random DOUBLE, min DOUBLE, max DOUBLE,
                best DOUBLE, n_takes BIGINT, position INTEGER)
            """
        )
        steps = "".join(f", c{i} BIGINT" for i in range(len(self.clauses)))
        con.execute(
            f"CREATE TEMP TABLE part_funnel (emotion VARCHAR, group_id VARCHAR, n BIGINT{steps})"
        )

    def better(self, column: str) -> str | None:
        return self.held.get(column.lower()) or declared_better(column, self.directions)

    # -- per chunk ---------------------------------------------------------------------------

    def add_chunk(self) -> None:
        self._random_takes()
        self._numeric_stats()
        self._funnel_counts()

    def _random_takes(self) -> None:
        import pyarrow as pa

        rows = self.work.execute(
            f"""
            WITH best AS (
                SELECT group_id, take FROM chunk_scored
                QUALIFY {rank_window()} = 1)
            SELECT s.group_id, list(s.take ORDER BY s.take),
                   any_value(coalesce(g.selected_take, b.take))
            FROM chunk_scored s JOIN chunk_groups g USING (group_id) JOIN best b USING (group_id)
            GROUP BY s.group_id ORDER BY 1
            """
        ).fetchall()
        out = {"group_id": [], "random_take": [], "shown_take": [], "other_take": []}
        for group_id, takes, shown in rows:
            random_take = takes[
                int(seeded_rng(self.seed, group_id, "baseline").integers(len(takes)))
            ]
            others = [t for t in takes if t != shown]
            other = (
                others[int(seeded_rng(self.seed, group_id, "other").integers(len(others)))]
                if others
                else None
            )
            for key, value in zip(out, (group_id, random_take, shown, other), strict=True):
                out[key].append(value)
        data = pa.table(
            {
                "group_id": arrow_array(out["group_id"], pa.string()),
                **{k: arrow_array(out[k], pa.int32()) for k in list(out)[1:]},
            }
        )
        self.work.execute(
            "CREATE OR REPLACE TEMP TABLE chunk_random (group_id VARCHAR, random_take INTEGER, "
            "shown_take INTEGER, other_take INTEGER)"
        )
        insert_arrow(self.work, "chunk_random", data)
        insert_arrow(self.con, "part_random", data)

    def _numeric_stats(self) -> None:
        """One pull of the chunk's numeric columns; per selected group and column the gains
        row (bestofn.select.group_stats: selected, median, random, min, max, best, count), and the
        pairwise sums of the centred within-group ranks over the chunk's takes (a Pearson
        correlation needs no more), in a few vectorised passes."""
        import pyarrow as pa

        from bestofn.select.group_stats import group_stats

        con, work, cols = self.con, self.work, self.cols
        values = ", ".join(f"{quote_ident(c)}::DOUBLE AS v{i}" for i, c in enumerate(cols))
        table = work.sql(f"SELECT group_id, take, {values} FROM chunk_scored").fetchnumpy()
        gid = filled(table["group_id"], None).astype(object)
        if not len(gid):
            return
        # the chunk's groups in the order of their first take, each take's group among them
        uniq, first, inverse = np.unique(gid, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        group_codes, names = rank[inverse.ravel()], uniq[order]
        groups = work.sql(
            "SELECT g.group_id, g.emotion, g.status = 'selected' AS selected, g.selected_take, "
            "r.random_take FROM chunk_groups g JOIN chunk_random r USING (group_id)"
        ).fetchnumpy()
        position = {name: i for i, name in enumerate(names.tolist())}
        at = np.array([position[g] for g in groups["group_id"].tolist()], dtype=np.int64)
        n_groups = len(names)

        def per_group(column, fill):
            out = np.full(n_groups, fill, dtype=np.int64)
            out[at] = filled(groups[column], fill)
            return out

        cells = [table[f"v{i}"] for i in range(len(cols))]
        nulls = np.column_stack([np.ma.getmaskarray(c) for c in cells])
        x = np.column_stack([filled(c, 0.0).astype(float) for c in cells])
        takes = filled(table["take"], -1).astype(np.int64)
        stats, ranks = group_stats(
            group_codes, takes, x, nulls,
            [per_group("selected_take", -1), per_group("random_take", -1)], n_groups,
        )  # fmt: skip
        self.non_null += (~nulls[:, : len(self.candidates)]).sum(axis=0)

        valid = (~np.isnan(ranks)).astype(float)
        r0 = np.where(valid > 0, ranks, 0.0)
        _add_rank_sums(self.sums, valid, r0)

        selected = np.zeros(n_groups, dtype=bool)
        selected[at] = filled(groups["selected"], False)
        emotion = np.empty(n_groups, dtype=object)
        emotion[at] = filled(groups["emotion"], None)
        g = np.flatnonzero(selected)
        if not len(g):
            return
        k = len(cols)
        better = [self.better(c) for c in cols]
        sel, rnd = stats.picked
        sel_null, rnd_null = stats.picked_null
        empty = stats.count == 0
        best = np.full_like(stats.max, np.nan)
        for i, b in enumerate(better):
            if b == "higher":
                best[:, i] = stats.max[:, i]
            elif b == "lower":
                best[:, i] = stats.min[:, i]
        best_null = empty | np.array([b not in ("higher", "lower") for b in better])[None, :]

        def flat(a, null=None):  # (groups, columns) -> column-major over the selected groups
            v = a[g].T.ravel()
            return arrow_array(v, mask=None if null is None else null[g].T.ravel())

        rows = pa.table(
            {
                "group_id": arrow_array(np.tile(names[g], k), pa.string()),
                "emotion": arrow_array(np.tile(emotion[g], k), pa.string()),
                "column_name": arrow_array(np.repeat(np.array(cols, dtype=object), len(g)),
                                        pa.string()),
                "better": arrow_array(np.repeat(np.array(better, dtype=object), len(g)),
                                   pa.string()),
                "selected": flat(sel, sel_null),
                "median": flat(stats.median, empty),
                "random": flat(rnd, rnd_null),
                "min": flat(stats.min, empty),
                "max": flat(stats.max, empty),
                "best": flat(best, best_null),
                "n_takes": flat(stats.count),
                "position": arrow_array(np.repeat(np.arange(k, dtype=np.int32), len(g))),
            }
        )  # fmt: skip
        insert_arrow(con, "part_gains", rows)

    def _funnel_counts(self) -> None:
        cums = [
            " AND ".join(f"coalesce(({c})::BOOLEAN, false)" for c in self.clauses[: i + 1])
            for i in range(len(self.clauses))
        ]
        counts = "".join(f", count(*) FILTER (WHERE {c})" for c in cums)
        rows = self.work.sql(
            f"SELECT emotion, group_id, count(*){counts} FROM chunk_scored "
            "GROUP BY emotion, group_id"
        )
        insert_arrow(self.con, "part_funnel", rows.to_arrow_table())

    # -- at the end --------------------------------------------------------------------------

    def finish(self) -> None:
        con = self.con
        con.execute("CREATE TABLE random_takes AS SELECT * FROM part_random ORDER BY group_id")
        measures = [c for c, n in zip(self.candidates, self.non_null, strict=True) if n]
        keep = [i for i, c in enumerate(self.cols) if c in measures or c == "score"]
        con.execute(
            "CREATE TABLE group_gains AS SELECT * EXCLUDE (position) FROM part_gains "
            f"WHERE position IN ({', '.join(map(str, keep))}) ORDER BY position, group_id"
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
        self._held_out()
        self._correlation(keep)
        self._funnel()
        self._listening()
        con.execute(
            "CREATE TABLE trust_settings AS SELECT ? AS seed, ?::JSON AS held_out, ? AS filter, "
            "? AS resamples",
            [self.seed, json.dumps([h.__dict__ for h in self.entries]), self.filter_sql,
             BOOTSTRAP_RESAMPLES],
        )  # fmt: skip
        for part in ("random", "gains", "funnel"):
            con.execute(f"DROP TABLE part_{part}")

    def _held_out(self) -> None:
        con = self.con
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
        for h in self.entries:
            data = con.sql(
                "SELECT emotion, selected, median, random FROM group_gains "
                f"WHERE column_name = {_lit(h.column)} AND selected IS NOT NULL ORDER BY group_id"
            ).fetchnumpy()
            emotion = np.array(filled(data["emotion"], None).tolist(), dtype=object)
            sel, med, rnd = (
                filled(data[c].astype(float), np.nan) for c in ("selected", "median", "random")
            )
            levels = [("overall", None, np.ones(len(sel), dtype=bool))]
            for e in sorted(set(emotion.tolist())):
                levels.append(("emotion", e, emotion == e))
            for level, e, mask in levels:
                row = [level, e, h.column, h.better, int(mask.sum())]
                row += [
                    float(np.nanmean(x[mask])) if np.isfinite(x[mask]).any() else None
                    for x in (sel, med, rnd)
                ]
                worse = []
                for name, base in (("median", med), ("random", rnd)):
                    d = sel[mask] - base[mask]
                    d = d[~np.isnan(d)]
                    mean = float(d.mean()) if len(d) else None
                    lo = hi = None
                    if len(d) >= 2:
                        lo, hi = _bootstrap_ci(
                            d, seeded_rng(self.seed, "bootstrap", h.column, e, name)
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

    def _correlation(self, keep: list[int]) -> None:
        """Pooled within-group rank correlation: Pearson over all takes of the centred, scaled
        within-group ranks (selection acts within groups, so differences between groups,
        prompt length or emotion, do not enter), from the pairwise sums of the chunks."""
        s = self.sums
        n, a, aa, ab = s["n"], s["a"], s["aa"], s["ab"]
        b, bb = a.T, aa.T
        with np.errstate(divide="ignore", invalid="ignore"):
            cov = n * ab - a * b
            var = (n * aa - a * a) * (n * bb - b * b)
            rho = cov / np.sqrt(var)
        rows = []
        for ii, i in enumerate(keep):
            for j in keep[ii:]:
                ca, cb = self.cols[i], self.cols[j]
                count = int(round(n[i, j]))
                r = float(rho[i, j]) if count and np.isfinite(rho[i, j]) and var[i, j] > 0 else None
                if i == j and count:
                    r = 1.0 if r is not None else None
                rows.append((ca, cb, r, count))
                if i != j:
                    rows.append((cb, ca, r, count))
        self.con.execute(
            "CREATE TABLE score_correlation "
            "(column_a VARCHAR, column_b VARCHAR, rho DOUBLE, n_takes BIGINT)"
        )
        if rows:
            import pyarrow as pa

            names = ["column_a", "column_b", "rho", "n_takes"]
            types = [pa.string(), pa.string(), pa.float64(), pa.int64()]
            data = pa.table(
                {
                    k: arrow_array([r[i] for r in rows], t)
                    for i, (k, t) in enumerate(zip(names, types, strict=True))
                }
            )
            insert_arrow(self.con, "score_correlation", data)

    def _funnel(self) -> None:
        con, clauses = self.con, self.clauses
        steps = "".join(
            f", sum(c{i}), count(DISTINCT group_id) FILTER (WHERE c{i} > 0)"
            for i in range(len(clauses))
        )
        con.execute(
            "CREATE TABLE filter_funnel (level VARCHAR, emotion VARCHAR, step INTEGER, "
            "clause VARCHAR, takes_in BIGINT, removed BIGINT, takes_left BIGINT, "
            "groups_left BIGINT)"
        )
        rows = con.execute(
            "SELECT CASE WHEN grouping(emotion) = 1 THEN 'overall' ELSE 'emotion' END, emotion, "
            f"sum(n), count(DISTINCT group_id){steps} FROM part_funnel "
            "GROUP BY GROUPING SETS ((), (emotion)) ORDER BY 1 DESC, 2"
        ).fetchall()
        out = []
        for level, emotion, n, n_groups, *counts in rows:
            n = int(n or 0)
            out.append((level, emotion, 0, "(all takes)", n, 0, n, n_groups))
            before = n
            for i, clause in enumerate(clauses):
                left, groups_left = int(counts[2 * i] or 0), counts[2 * i + 1]
                out.append(
                    (level, emotion, i + 1, clause, before, before - left, left, groups_left)
                )
                before = left
        con.executemany("INSERT INTO filter_funnel VALUES (?, ?, ?, ?, ?, ?, ?, ?)", out)

    def _listening(self) -> None:
        """The pair of takes the listening page presents per group, in a seeded order: the
        selected take (or, where no take passed, the best-scoring failing take) and one random
        other take."""
        import pyarrow as pa

        con, seed = self.con, self.seed
        con.execute(
            "CREATE TABLE listening (group_id VARCHAR, emotion VARCHAR, prompt_id VARCHAR, "
            "listen_order INTEGER, take INTEGER, role VARCHAR, order_seed BIGINT)"
        )
        groups = con.sql(  # one row per group (never per take)
            "SELECT g.group_id, g.emotion, g.prompt_id, g.status, r.shown_take, r.other_take "
            "FROM groups g JOIN random_takes r USING (group_id) ORDER BY g.group_id"
        ).to_arrow_table()
        names = ["group_id", "emotion", "prompt_id", "listen_order", "take", "role", "order_seed"]
        for batch in groups.to_batches(50_000):
            out = {k: [] for k in names}
            for group_id, emotion, prompt_id, status, first, other in zip(
                *(batch.column(i).to_pylist() for i in range(6)), strict=True
            ):
                role = "selected" if status == "selected" else "best_failing"
                shown = [(first, role)] + ([(other, "random")] if other is not None else [])
                order = presentation_order(seed, group_id, [t for t, _ in shown])
                for position, take in enumerate(order, start=1):
                    row = (group_id, emotion, prompt_id, position, take, dict(shown)[take], seed)
                    for k, v in zip(names, row, strict=True):
                        out[k].append(v)
            types = [pa.string()] * 3 + [pa.int32(), pa.int32(), pa.string(), pa.int64()]
            data = pa.table({k: arrow_array(out[k], t) for k, t in zip(names, types, strict=True)})
            insert_arrow(con, "listening", data)


def _lit(value) -> str:
    return "NULL" if value is None else "'" + str(value).replace("'", "''") + "'"
