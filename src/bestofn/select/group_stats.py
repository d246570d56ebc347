"""Per-group statistics of every measure column at once, in numpy: what the trust tables
(bestofn.select.trust) need from a chunk of whole groups, from one pull of its numeric columns.

For every group and column: the count of values, min, max and median, the values of two chosen
takes (the selected and the random one), and per take the centred within-group rank the pooled
rank correlation sums. DuckDB's semantics are kept: NULL is no value; NaN is a value, greater
than every number (so ``max`` is NaN where a group has one, ``min`` only where it has nothing
else, and a median can be NaN); ``median`` interpolates between the two middle values.

Groups of one size are stacked as a (groups, takes, columns) array and sorted along the takes
axis in one call: the cost is a few vectorised passes over the chunk, whatever the columns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BATCH_TAKES = 16_384  # takes stacked per vectorised pass (each temporary: 8 bytes x columns)


@dataclass
class GroupStats:
    """Per group (rows, in the order of ``group_index``) and column: float arrays with NaN where
    DuckDB would give NaN, and ``*_null`` masks where it would give NULL."""

    count: np.ndarray  # int64 (groups, columns): values that are not NULL
    min: np.ndarray
    max: np.ndarray
    median: np.ndarray
    picked: list[np.ndarray]  # one (groups, columns) array per picked take
    picked_null: list[np.ndarray]
    min_null: np.ndarray
    median_null: np.ndarray


def _bucket_stats(vals, null, takes, picks):
    """Stats of G groups of m takes each: ``vals`` (G, m, C) with NaN for NULL and NaN,
    ``null`` (G, m, C), ``takes`` (G, m), ``picks``: (G,) take numbers (-1: none)."""
    G, m, C = vals.shape
    real_nan = np.isnan(vals) & ~null
    n_nan = real_nan.sum(axis=1)
    count = (~null).sum(axis=1)
    n_num = count - n_nan
    order = np.argsort(vals, axis=1, kind="stable")  # numbers ascending, then NaN/NULL
    s = np.take_along_axis(vals, order, axis=1)
    g_idx = np.arange(G)[:, None]
    c_idx = np.arange(C)[None, :]

    def at(pos):  # s[g, pos[g, c], c]
        return s[g_idx, np.clip(pos, 0, m - 1), c_idx]

    lo_num = at(np.zeros((G, C), dtype=np.int64))
    hi_num = at(n_num - 1)
    has_num, has_nan = n_num > 0, n_nan > 0
    mn = np.where(has_num, lo_num, np.nan)
    mx = np.where(has_nan, np.nan, np.where(has_num, hi_num, np.nan))
    pos = (count - 1) / 2.0
    lo, hi = np.floor(pos).astype(np.int64), np.ceil(pos).astype(np.int64)
    lo_v, hi_v = at(lo), at(hi)
    with np.errstate(invalid="ignore"):
        med = np.where(lo == hi, lo_v, lo_v + (hi_v - lo_v) * (pos - lo))

    # centred within-group ranks, ties averaged (the tree before's SQL arithmetic)
    number = ~np.isnan(s)  # sorted: numbers first
    new_tie = np.ones((G, m, C), dtype=bool)
    new_tie[:, 1:] = s[:, 1:] != s[:, :-1]
    ar = np.broadcast_to(np.arange(m)[None, :, None], (G, m, C))
    tie_start = np.maximum.accumulate(np.where(new_tie, ar, 0), axis=1)
    last = np.ones((G, m, C), dtype=bool)
    last[:, :-1] = new_tie[:, 1:]
    tie_end = np.flip(np.minimum.accumulate(np.flip(np.where(last, ar, m), axis=1), axis=1), axis=1)
    rank = (tie_start + 1).astype(float)
    ties = (tie_end - tie_start + 1).astype(float)
    nan_rank = n_num[:, None, :] + 1.0  # every NaN ties after the numbers
    nan_ties = n_nan[:, None, :].astype(float)
    rank = np.where(number, rank, nan_rank)
    ties = np.where(number, ties, nan_ties)
    cnt = count[:, None, :].astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ranked_sorted = (rank + (ties - 1) / 2.0 - (cnt + 1) / 2.0) / cnt
    ranked = np.empty_like(ranked_sorted)
    np.put_along_axis(ranked, order, ranked_sorted, axis=1)
    ranked[null] = np.nan

    picked, picked_null = [], []
    for want in picks:
        hit = takes == want[:, None]
        found = hit.any(axis=1)
        j = hit.argmax(axis=1)
        v = vals[np.arange(G), j]  # (G, C)
        nul = null[np.arange(G), j] | ~found[:, None]
        picked.append(np.where(nul, np.nan, v))
        picked_null.append(nul)
    return count, mn, mx, med, picked, picked_null, ranked


def group_stats(group_codes, takes, values, nulls, picks, n_groups):
    """Stats per group of one chunk.

    ``group_codes`` (n,) ints in [0, n_groups), ``takes`` (n,) take numbers, ``values``
    (n, C) floats (anything where ``nulls``), ``nulls`` (n, C), ``picks``: a list of (n_groups,)
    take numbers to read each column at (-1: none). Returns (GroupStats, ranks (n, C) of the
    takes in their input order: NaN where NULL)."""
    n, C = values.shape
    vals = np.where(nulls, np.nan, values)
    sizes = np.bincount(group_codes, minlength=n_groups)
    rows = np.argsort(group_codes, kind="stable")  # each group's takes together, in take order
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    out = dict(
        count=np.zeros((n_groups, C), dtype=np.int64),
        min=np.full((n_groups, C), np.nan),
        max=np.full((n_groups, C), np.nan),
        median=np.full((n_groups, C), np.nan),
    )
    picked = [np.full((n_groups, C), np.nan) for _ in picks]
    picked_null = [np.ones((n_groups, C), dtype=bool) for _ in picks]
    ranks = np.full((n, C), np.nan)
    batches = []
    for m in np.unique(sizes[sizes > 0]):
        same = np.flatnonzero(sizes == m)
        step = max(1, BATCH_TAKES // int(m))  # bounds the (groups, takes, columns) temporaries
        batches += [(int(m), same[i : i + step]) for i in range(0, len(same), step)]
    for m, gs in batches:
        idx = rows[starts[gs][:, None] + np.arange(m)[None, :]]  # (G, m) row numbers
        count, mn, mx, med, pk, pkn, ranked = _bucket_stats(
            vals[idx], nulls[idx], takes[idx], [p[gs] for p in picks]
        )
        out["count"][gs], out["min"][gs], out["max"][gs], out["median"][gs] = count, mn, mx, med
        for k in range(len(picks)):
            picked[k][gs], picked_null[k][gs] = pk[k], pkn[k]
        ranks[idx.ravel()] = ranked.reshape(-1, C)
    count = out["count"]
    stats = GroupStats(
        count=count, min=out["min"], max=out["max"], median=out["median"],
        picked=picked, picked_null=picked_null,
        min_null=count == 0, median_null=count == 0,
    )  # fmt: skip
    return stats, ranks
