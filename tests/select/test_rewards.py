"""Named rewards (top k, dedup), the one pick rule, per-emotion scales, ei_spec, the emotions
sheet's class column, and best_of_k against brute-force enumeration."""

import itertools
import math
import re
from pathlib import Path

import duckdb
import numpy as np
import pytest
from helpers import REPO, trade_off_results, write_group, write_tsv

from bestofn.backends.empathic import column_name
from bestofn.select import scales
from bestofn.select.base import SelectionError
from bestofn.select.database import build_database, check_rewards, resolve_norm
from bestofn.select.rewards import (
    Context,
    Reward,
    best_of_k_sql,
    context_of,
    knee,
    rewards_of,
)

NAMED = {
    "nat": {"score": "z(naturalness, emotion) + norm(clarity, emotion)", "top": 3},
    "loose": {"filter": "wer <= 0.01", "score": "quality", "top": 2},
}


def rows(db: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_the_pick_order_is_written_once_in_the_source():
    src = REPO / "src" / "bestofn"
    hits = [
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if re.search(r"score\s+DESC\s+NULLS\s+LAST", p.read_text(), re.IGNORECASE)
    ]
    assert hits == ["select/rewards.py"]


def test_named_rewards_keep_their_top_k_and_dedup_records_every_winner(tmp_path):
    files = trade_off_results(tmp_path / "results")
    db = tmp_path / "results/bestofn.duckdb"
    build_database(files, db, "wer <= 0.1", "quality", named_rewards=NAMED)
    picks = rows(db, "SELECT reward, group_id, take, rank, score FROM reward_picks")
    per = {}
    for reward, gid, take, rank, _ in picks:
        per.setdefault((reward, gid), []).append((rank, take))
    tops = {"default": 1, "nat": 3, "loose": 2}
    for (reward, _), got in per.items():
        assert sorted(r for r, _ in got) == list(range(1, len(got) + 1))
        assert len(got) <= tops[reward]
    assert max(len(v) for (r, _), v in per.items() if r == "nat") == 3
    # nat's top 3 of calm/p0, recomputed in numpy from its definition
    con = duckdb.connect(str(db), read_only=True)
    takes = con.execute(
        "SELECT group_id, take, emotion, wer, naturalness, clarity FROM takes"
    ).fetchall()
    con.close()
    z, lo, hi = {}, {}, {}
    for e in ("calm", "happy"):
        nat = np.array([t[4] for t in takes if t[2] == e])
        cl = np.array([t[5] for t in takes if t[2] == e])
        z[e], lo[e], hi[e] = (nat.mean(), nat.std()), cl.min(), cl.max()
    want = sorted(
        (
            -((t[4] - z[t[2]][0]) / z[t[2]][1] + (t[5] - lo[t[2]]) / (hi[t[2]] - lo[t[2]])),
            t[1],
        )
        for t in takes
        if t[0] == "calm/p0" and t[3] <= 0.1
    )[:3]
    assert [take for _, take in want] == [take for rank, take in sorted(per[("nat", "calm/p0")])]
    # dedup: every picked take once, with every reward it won, in the config's order
    sel = rows(db, "SELECT group_id, take, rewards, ranks FROM reward_selection")
    assert len(sel) == len({(g, t) for _, g, t, _, _ in picks})
    won = {}
    for reward, gid, take, rank, _ in picks:
        order = ["default", "nat", "loose"].index(reward)
        won.setdefault((gid, take), []).append((order, reward, rank))
    for gid, take, rewards, ranks in sel:
        assert rewards == [r for _, r, _ in sorted(won[(gid, take)])]
        assert ranks == [k for _, _, k in sorted(won[(gid, take)])]
    assert any(len(r) > 1 for _, _, r, _ in sel)  # some take won two rewards: kept once


def test_a_config_without_rewards_keeps_its_selection_table(tmp_path):
    files = trade_off_results(tmp_path / "results")
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    build_database(files, a, "wer <= 0.1", "quality")
    build_database(files, b, "wer <= 0.1", "quality", named_rewards=NAMED)
    assert rows(a, "FROM selection") == rows(b, "FROM selection")
    assert rows(a, "SELECT name, top FROM rewards") == [("default", 1)]
    assert rows(a, "SELECT group_id, take FROM reward_picks ORDER BY 1") == rows(
        a, "SELECT group_id, take FROM selection ORDER BY 1"
    )


def test_a_named_reward_named_default_is_refused():
    with pytest.raises(SelectionError, match="'default' is selection.filter/score"):
        rewards_of({"filter": "true", "score": "1", "rewards": {"default": {"score": "1"}}})


def test_check_names_the_reward_whose_sql_is_bad():
    columns = {"group_id": "VARCHAR", "emotion": "VARCHAR", "take": "INTEGER", "wer": "DOUBLE"}
    selection = {
        "filter": "wer < 1",
        "score": "-wer",
        "rewards": {"r2": {"score": "nope + 1", "top": 2}},
    }
    with pytest.raises(SelectionError, match="selection.rewards.r2 SQL does not fit.*nope"):
        check_rewards(selection, columns)
    selection["rewards"]["r2"]["score"] = "z(wer, prompt_id)"
    with pytest.raises(SelectionError, match="optionally the word emotion"):
        check_rewards(selection, columns)
    selection["rewards"]["r2"]["score"] = "z(wer, emotion)"
    check_rewards(selection, columns)


# -- scales -----------------------------------------------------------------------------------


def _two_emotions():
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE takes AS SELECT * FROM (VALUES ('a', 1.0), ('a', 3.0), ('b', 10.0), "
        "('b', 30.0), ('b', 'nan'::DOUBLE)) t(emotion, x)"
    )
    return con


def test_norm_and_z_within_each_emotion():
    con = _two_emotions()
    got = {}
    for score in ("norm(x)", "norm(x, emotion)", "z(x, emotion)", "z(x)"):
        _, sql = resolve_norm(con, "takes", "true", score)
        got[score] = con.execute(f"SELECT {sql} FROM takes ORDER BY emotion, x").fetchall()
    assert got["norm(x)"] == [(0.0,), (2 / 29,), (9 / 29,), (1.0,), (None,)]
    assert got["norm(x, emotion)"] == [(0.0,), (1.0,), (0.0,), (1.0,), (None,)]
    assert [v for (v,) in got["z(x, emotion)"]] == [-1.0, 1.0, -1.0, 1.0, None]
    values = np.array([1.0, 3.0, 10.0, 30.0])
    want = (values - values.mean()) / values.std()
    assert np.allclose([v for (v,) in got["z(x)"][:4]], want)


def test_chunked_statistics_merge_to_the_whole_runs():
    rng = np.random.default_rng(1)
    x = rng.normal(3, 2, 1000)
    whole, parts = scales.Stats(), scales.Stats()
    whole.merge(scales.Stats(len(x), x.mean(), x.var() * len(x), x.min(), x.max()))
    for chunk in np.array_split(x, 7):
        parts.merge(
            scales.Stats(
                len(chunk), chunk.mean(), chunk.var() * len(chunk), chunk.min(), chunk.max()
            )
        )
    assert parts.n == whole.n and math.isclose(parts.mean, whole.mean)
    assert math.isclose(parts.sd, whole.sd) and parts.low == whole.low and parts.high == whole.high


def test_ei_spec_is_the_target_head_minus_the_mean_of_the_others(tmp_path):
    sheet = write_tsv(
        tmp_path / "emotions.tsv",
        ["emotion", "description", "ei_head"],
        [["Anger", "a", ""], ["Jealousy_Envy", "j", "Jealousy_&_Envy"], ["Awe", "w", ""]],
    )
    ctx = context_of(sheet)
    assert list(ctx.heads) == [column_name(n, "ei_") for n in ("Anger", "Jealousy_&_Envy", "Awe")]
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE takes AS SELECT 'Anger' AS emotion, 0.9 AS ei_target, 0.9 AS ei_anger, "
        "0.2 AS ei_jealousy_envy, 0.4 AS ei_awe"
    )
    _, sql = resolve_norm(con, "takes", "true", "ei_spec", ctx)
    (got,) = con.execute(f"SELECT {sql} FROM takes").fetchone()
    assert math.isclose(got, 0.9 - (0.2 + 0.4) / 2)
    with pytest.raises(SelectionError, match="ei_spec needs"):
        resolve_norm(con, "takes", "true", "ei_spec", Context())


# -- the emotions sheet's class ---------------------------------------------------------------


def test_class_column_lets_a_filter_exempt_nonverbal_groups(tmp_path):
    results = tmp_path / "results"
    files = [
        write_group(results, f"{e}/p1", {"wer": [0.5, 0.6, 0.05], "quality": [3.0, 2.0, 1.0]})
        for e in ("Amusement", "Anger")
    ]
    db = results / "bestofn.duckdb"
    ctx = Context(classes={"Amusement": "nonverbal", "Anger": "speech"})
    build_database(files, db, "class = 'nonverbal' OR wer <= 0.1", "quality", context=ctx)
    assert dict(rows(db, "SELECT group_id, take FROM selection")) == {
        "Amusement/p1": 0,
        "Anger/p1": 2,
    }
    # a sheet without the column: the takes get none (the tables stay as they were)
    build_database(files, db, "wer <= 0.1", "quality")
    assert "class" not in [r[0] for r in rows(db, "DESCRIBE takes")]


def test_the_voice_acting_sheet_marks_its_nonverbal_emotions():
    ctx = context_of(REPO / "config/voice_acting/emotions.tsv")
    nonverbal = sorted(e for e, c in ctx.classes.items() if c == "nonverbal")
    assert len(ctx.classes) == 40
    assert set(ctx.classes.values()) == {"speech", "nonverbal"}
    assert "Amusement" in nonverbal and "Anger" not in nonverbal


# -- best of k --------------------------------------------------------------------------------


def brute_force(scores: list, passes: list[bool], k: int):
    """(E[best | a winner drawn], P(a winner drawn)) over every k-subset of the group."""
    bests = []
    for combo in itertools.combinations(range(len(scores)), k):
        won = [scores[i] for i in combo if passes[i] and scores[i] is not None]
        bests.append(max(won) if won else None)
    got = [b for b in bests if b is not None]
    return (sum(got) / len(got) if got else None), len(got) / len(bests)


def test_best_of_k_equals_brute_force_enumeration():
    rng = np.random.default_rng(3)
    groups = []
    for g in range(9):
        n = 4 if g == 0 else int(rng.integers(1, 8))
        scores = [None if rng.random() < 0.15 else float(rng.normal()) for _ in range(n)]
        if g == 0:
            scores = [1.0, 1.0, 1.0, 0.5]  # ties
        passes = [bool(rng.random() < 0.7) for _ in range(n)]
        if g == 1:
            passes = [False] * n  # no winner at any k
        groups.append((f"e{g % 2}", f"g{g}", scores, passes))
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE takes (group_id VARCHAR, emotion VARCHAR, take INTEGER, s DOUBLE, ok BOOLEAN)"
    )
    for emotion, gid, scores, passes in groups:
        for t, (s, p) in enumerate(zip(scores, passes, strict=True)):
            con.execute("INSERT INTO takes VALUES (?, ?, ?, ?, ?)", [gid, emotion, t, s, p])
    got = {
        (e, k): (best, p, n)
        for _, e, k, n, best, p in con.execute(best_of_k_sql(Reward("r", "ok", "s"))).fetchall()
    }
    for emotion in ("e0", "e1"):
        mine = [g for g in groups if g[0] == emotion]
        for k in range(1, max(len(g[2]) for g in mine) + 1):
            per = [brute_force(s, p, k) for _, _, s, p in mine if len(s) >= k]
            best, p_pass, n = got[(emotion, k)]
            assert n == len(per)
            assert math.isclose(p_pass, sum(p for _, p in per) / len(per), abs_tol=1e-9)
            with_winner = [b for b, _ in per if b is not None]
            if with_winner:
                assert math.isclose(best, sum(with_winner) / len(with_winner), abs_tol=1e-9)
            else:
                assert best is None


def test_best_of_k_table_is_in_the_database_per_reward(tmp_path):
    files = trade_off_results(tmp_path / "results")
    db = tmp_path / "results/bestofn.duckdb"
    build_database(files, db, "wer <= 0.1", "quality", named_rewards=NAMED)
    got = rows(db, "SELECT reward, emotion, max(k), min(groups) FROM best_of_k GROUP BY ALL")
    assert {(r, e) for r, e, _, _ in got} == {
        (r, e) for r in ("default", "nat", "loose") for e in ("calm", "happy", "sad")
    }
    assert all(k == 6 or e == "sad" for _, e, k, _ in got)
    curve = rows(
        db, "SELECT k, expected_best FROM best_of_k WHERE reward = 'default' AND emotion = 'calm'"
    )
    values = [v for _, v in sorted(curve) if v is not None]
    assert values == sorted(values)  # more takes never lower the expected best here


def test_knee_is_where_most_of_the_rise_is_reached():
    assert knee([(1, 0.0), (2, 0.5), (4, 0.92), (8, 0.97), (16, 1.0)]) == 4
    assert knee([(1, 1.0), (2, 1.0)]) == 1
    assert knee([]) is None
