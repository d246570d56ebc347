"""`bestofn listen import` without a browser, on hand-made takes: what a file must match to be
imported, what a refusal says, duplicates, and what a database rebuild does to stored votes."""

import json
import shutil

import duckdb
import pyarrow.parquet as pq
import pytest
from helpers import HELD_OUT, trade_off_results

from bestofn.cli import main
from bestofn.report.votes import (
    FORMAT,
    Context,
    VotesError,
    import_files,
    left_first,
    order_seed,
    reapply,
    results_id,
    share_interval,
    wilson,
)
from bestofn.select.database import build_database


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    results = tmp_path_factory.mktemp("votes") / "results"
    files = trade_off_results(results)
    build_database(files, results / "bestofn.duckdb", "wer <= 0.1", "quality", HELD_OUT, seed=5)
    results_id(results, create=True)  # what writing the listening page does
    return results


@pytest.fixture
def results(tmp_path, built):
    """A private copy (the build, with its trust tables' bootstraps, runs once per module)."""
    shutil.copytree(built, tmp_path / "results")
    return tmp_path / "results"


def _ctx(results):
    con = duckdb.connect(str(results / "bestofn.duckdb"), read_only=True)
    try:
        return Context.of(con, results), dict(
            con.execute("SELECT group_id, selected_take FROM groups").fetchall()
        )
    finally:
        con.close()


def votes_doc(results, listener="ann", choose=lambda g, left, right, sel: "left", **over):
    """What the page exports: one vote per group, in this listener's seeded order."""
    ctx, selected = _ctx(results)
    seed = order_seed(ctx.seed, listener)
    votes = []
    for g, (_, _, order, pair) in ctx.pairs.items():
        left, right = left_first(seed, g, order)
        votes.append({
            "group_id": g, "left_take": left, "right_take": right,
            "choice": choose(g, left, right, selected.get(g)), "confidence": None,
            "listener": listener, "time": "2026-12-01T10:00:00.000Z", "page_seed": ctx.seed,
            "order_seed": seed, "build": ctx.build, "pair": pair,
        })  # fmt: skip
    doc = {"format": FORMAT, "results_id": ctx.results_id, "results": str(results),
           "build": ctx.build, "page_seed": ctx.seed, "listener": listener,
           "order_seed": seed, "exported_at": "2026-12-01T10:05:00Z", "votes": votes}  # fmt: skip
    doc.update(over)
    return doc


def write(path, doc):
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def table(results, sql):
    con = duckdb.connect(str(results / "bestofn.duckdb"), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_import_once_twice_and_a_later_export(tmp_path, results):
    good = write(tmp_path / "a.json", votes_doc(results))
    out = import_files(results / "bestofn.duckdb", results, [good])
    assert out["errors"] == [] and out["new_votes"] == 13 and out["counted"] == 13
    assert table(results, "SELECT count(*) FROM listener_votes") == [(13,)]
    # The same file again adds nothing.
    out = import_files(results / "bestofn.duckdb", results, [good])
    assert out["already_imported"] == [str(good)] and out["new_votes"] == 0
    # A later export of the same listener holds the old votes and one changed: nothing doubles,
    # the later vote counts.
    later = votes_doc(results, choose=lambda g, lt, rt, s: "same" if g == "calm/p0" else "left")
    later["votes"][0]["time"] = "2026-12-01T11:00:00Z"
    out = import_files(results / "bestofn.duckdb", results, [write(tmp_path / "b.json", later)])
    assert out["new_votes"] == 1 and out["files"] == 2
    assert table(results, "SELECT count(*), count(*) FILTER (WHERE choice = 'same') "
                          "FROM listener_votes") == [(13, 1)]  # fmt: skip
    # sad/p0 has no selected take: its vote counts for position, not for agreement.
    assert table(results, "SELECT n_votes, n_same FROM listener_agreement WHERE level = "
                          "'overall'") == [(12, 1)]  # fmt: skip
    assert table(results, "SELECT n_votes FROM listener_position") == [(13,)]
    assert table(results, "SELECT for_selected FROM listener_votes WHERE group_id = 'sad/p0'") == [
        (None,)
    ]


def _refused(tmp_path, results, doc, *needles, capsys):
    bad = write(tmp_path / "bad.json", doc)
    good = write(tmp_path / "good.json", votes_doc(results, listener="zoe"))
    rc = main(["listen", "import", str(bad), str(good), "--results", str(results)])
    err = capsys.readouterr().err
    assert rc == 1
    assert str(bad) in err and "nothing imported" in err, err
    for needle in needles:
        assert needle in err, err
    # nothing from the bad file, the good one imported
    assert table(results, "SELECT DISTINCT listener FROM listener_votes") == [("zoe",)]
    stored = list((results / "votes/imported").glob("*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["listener"] == "zoe"
    return err


def test_malformed_json_is_refused(tmp_path, results, capsys):
    _refused(tmp_path, results, '{"format": "bestofn-votes/1", "votes": [', "not valid JSON",
             capsys=capsys)  # fmt: skip


def test_a_vote_for_an_unknown_group_refuses_the_whole_file(tmp_path, results, capsys):
    doc = votes_doc(results)
    doc["votes"][3]["group_id"] = "calm/p99"
    _refused(tmp_path, results, doc, "vote 3 (group calm/p99)", "not in this database",
             "1 of 13 vote(s) refused", capsys=capsys)  # fmt: skip


def test_a_file_from_another_results_directory_is_refused(tmp_path, results, capsys):
    other = tmp_path / "other"
    shutil.copytree(results, other)
    shutil.rmtree(other / "votes")
    results_id(other, create=True)
    doc = votes_doc(other)
    _refused(tmp_path, results, doc, "another results directory", capsys=capsys)


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"page_seed": 6}, "seed 6"),
        ({"build": "0123456789abcdef"}, "build 0123456789abcdef"),
        ({"left_take": 98, "right_take": 99}, "not the pair the page shows"),
        ({"order_seed": 1}, "not the seed of listener"),
        ({"choice": "A"}, "choice must be one of"),
        ({"confidence": 5}, "confidence must be"),
        ({"time": "yesterday"}, "not an ISO 8601 time"),
    ],
)
def test_a_vote_that_does_not_match_the_page_is_refused(tmp_path, results, capsys, change,
                                                        needle):  # fmt: skip
    doc = votes_doc(results)
    doc["votes"][2].update(change)
    _refused(tmp_path, results, doc, f"vote 2 (group {doc['votes'][2]['group_id']})", needle,
             capsys=capsys)  # fmt: skip


def test_the_left_take_must_be_the_listeners_seeded_order(tmp_path, results, capsys):
    doc = votes_doc(results)
    v = doc["votes"][1]
    v["left_take"], v["right_take"] = v["right_take"], v["left_take"]
    _refused(tmp_path, results, doc, "not the seeded order of this listener", capsys=capsys)


def test_a_rebuild_keeps_votes_while_their_pair_is_unchanged(tmp_path, results):
    doc = votes_doc(results, choose=lambda g, left, right, sel: "left" if sel == left else "right")
    import_files(results / "bestofn.duckdb", results, [write(tmp_path / "a.json", doc)])
    parquets = sorted((results / "groups").glob("*/*/scores.parquet"))
    build_database(parquets, results / "bestofn.duckdb", "wer <= 0.1", "quality", HELD_OUT, 5)
    assert reapply(results / "bestofn.duckdb", results)["counted"] == 13
    # One group regenerated with other takes (other durations): its vote no longer counts.
    path = results / "groups/calm/p0/scores.parquet"
    t = pq.read_table(path)
    pq.write_table(t.set_column(t.schema.get_field_index("duration_s"), "duration_s",
                                [[0.5] * t.num_rows]), path)  # fmt: skip
    build_database(parquets, results / "bestofn.duckdb", "wer <= 0.1", "quality", HELD_OUT, 5)
    assert reapply(results / "bestofn.duckdb", results) == {
        "files": 1, "votes": 13, "counted": 12, "stale": 1
    }  # fmt: skip
    ((group, reason),) = table(results, "SELECT group_id, stale_reason FROM listener_votes "
                                        "WHERE NOT counted")  # fmt: skip
    assert group == "calm/p0" and "the takes of calm/p0 changed since the vote" in reason
    assert table(results, "SELECT agreement, n_decisive FROM listener_agreement "
                          "WHERE level = 'overall'") == [(1.0, 11)]  # fmt: skip


def test_intervals_of_a_unanimous_tally_are_not_a_point():
    import numpy as np

    lo, hi = wilson(8, 8)
    assert 0.6 < lo < 0.7 and hi == 1.0
    share, b_lo, b_hi = share_interval(np.ones(8), np.arange(8), np.random.default_rng(0))
    assert share == 1.0 and b_lo == pytest.approx(lo) and b_hi == 1.0
    # a split tally: the bootstrap over groups, at least as wide as Wilson
    share, b_lo, b_hi = share_interval(
        np.array([1, 0] * 10, float), np.arange(20) // 2, np.random.default_rng(0)
    )
    w_lo, w_hi = wilson(10, 20)
    assert share == 0.5 and b_lo <= w_lo and b_hi >= w_hi


def test_a_damaged_store_stops_the_rebuild_naming_the_file(tmp_path, results):
    import_files(
        results / "bestofn.duckdb", results, [write(tmp_path / "a.json", votes_doc(results))]
    )
    (stored,) = (results / "votes/imported").glob("*.json")
    doc = json.loads(stored.read_text())
    del doc["votes"][0]["left_take"]
    stored.write_text(json.dumps(doc))
    with pytest.raises(VotesError, match=f"{stored}: a stored votes file no longer reads"):
        reapply(results / "bestofn.duckdb", results)
