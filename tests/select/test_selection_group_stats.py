"""bestofn.select.group_stats gives, per group and column, what DuckDB's aggregates give (the trust
tables were DuckDB SQL before): NULLs, NaNs, ties, infinities and groups of several sizes."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pyarrow as pa

from bestofn.select.group_stats import group_stats


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)


def test_group_stats_match_duckdb():
    rng = np.random.default_rng(5)
    rows = []
    for g in range(30):
        for t in range(int(rng.integers(1, 9))):
            v = [float(rng.integers(0, 4)) for _ in range(3)]  # many ties
            v[0] = None if rng.random() < 0.2 else v[0]
            v[1] = math.nan if rng.random() < 0.15 else v[1]
            v[2] = math.inf if rng.random() < 0.1 else v[2]
            rows.append((f"g{g:02d}", t, *v))
    rows.append(("g99", 0, None, None, None))  # a group with no value at all
    table = pa.table(
        {
            "i": list(range(len(rows))),
            "group_id": [r[0] for r in rows],
            "take": pa.array([r[1] for r in rows], pa.int32()),
            **{f"c{i}": pa.array([r[2 + i] for r in rows], pa.float64()) for i in range(3)},
        }
    )
    codes = table.column("group_id").combine_chunks().dictionary_encode()
    names = codes.dictionary.to_pylist()
    pick = np.array([int(rng.integers(-1, 8)) for _ in names])
    cells = [table.column(f"c{i}").combine_chunks() for i in range(3)]
    nulls = np.column_stack([c.is_null().to_numpy(zero_copy_only=False) for c in cells])
    x = np.column_stack([c.fill_null(0.0).to_numpy(zero_copy_only=False) for c in cells])
    takes = table.column("take").to_numpy().astype(np.int64)
    stats, ranks = group_stats(codes.indices.to_numpy(), takes, x, nulls, [pick], len(names))

    con = duckdb.connect()
    con.register("t", table)
    con.register("p", pa.table({"group_id": names, "pick": pick.tolist()}))
    for i in range(3):
        c = f"c{i}"
        want = con.execute(
            f"SELECT group_id, count({c}), min({c}), max({c}), median({c}), "
            f"any_value({c}) FILTER (WHERE take = pick) FROM t JOIN p USING (group_id) "
            "GROUP BY group_id"
        ).fetchall()
        for gid, n, mn, mx, med, picked in want:
            k = names.index(gid)
            assert stats.count[k, i] == n, (gid, c)
            empty = stats.count[k, i] == 0
            for got, exp in ((stats.min, mn), (stats.max, mx), (stats.median, med)):
                assert _same(None if empty else float(got[k, i]), exp), (gid, c, got[k, i], exp)
            got_pick = None if stats.picked_null[0][k, i] else float(stats.picked[0][k, i])
            assert _same(got_pick, picked), (gid, c)
        # ranks: (average rank within the group - (count + 1) / 2) / count, NULLs excluded
        want = con.execute(
            f"SELECT (rank() OVER w + (count(*) OVER (PARTITION BY group_id, {c}) - 1) / 2 "
            f"- (count({c}) OVER (PARTITION BY group_id) + 1) / 2) "
            f"/ count({c}) OVER (PARTITION BY group_id), {c} IS NULL FROM t "
            f"WINDOW w AS (PARTITION BY group_id ORDER BY {c}) ORDER BY i"
        ).fetchall()
        for j, (r, is_null) in enumerate(want):
            assert _same(None if is_null else r, None if np.isnan(ranks[j, i]) else ranks[j, i])
