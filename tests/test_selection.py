"""Selection SQL on a hand-made table: best passing take per group, ties by take, no group lost."""

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bestofn.selection import SelectionError, build_database


def group_parquet(tmp_path, group_id, wers, quality):
    n = len(wers)
    table = pa.table(
        {
            "group_id": [group_id] * n,
            "emotion": [group_id.split("/")[0]] * n,
            "prompt_id": [group_id.split("/")[1]] * n,
            "take": pa.array(range(n), pa.int32()),
            "flac_path": [f"results/groups/{group_id}/takes/{i:03d}.flac" for i in range(n)],
            "duration_s": [2.0] * n,
            "wer": wers,
            "quality": quality,
            "device": ["cpu"] * n,
            **{
                f"group_{s}_s": [1.0] * n
                for s in ("generate", "restore", "score", "load", "write", "wall")
            },
            "worker_idle_s": [0.0] * n,
            "started_at": pa.array([0] * n, pa.timestamp("s", tz="UTC")),
            "finished_at": pa.array([10] * n, pa.timestamp("s", tz="UTC")),
        }
    )
    path = tmp_path / f"{group_id.replace('/', '_')}.parquet"
    pq.write_table(table, path)
    return path


@pytest.fixture
def db(tmp_path):
    files = [
        # take 1 has the best quality but fails the filter; takes 2 and 3 tie -> take 2
        group_parquet(tmp_path, "calm/p1", [0.0, 0.5, 0.0, 0.05], [3.0, 4.9, 4.0, 4.0]),
        # nothing passes
        group_parquet(tmp_path, "calm/p2", [0.3, 0.4], [4.0, 4.5]),
        group_parquet(tmp_path, "happy/p1", [0.0, 0.1, None], [1.0, 2.0, 5.0]),
    ]
    out = tmp_path / "bestofn.duckdb"
    counts = build_database(files, out, "wer <= 0.1", "quality")
    assert counts == {"takes": 9, "groups": 3, "selected": 2}
    return duckdb.connect(str(out), read_only=True)


def test_selection_picks_best_passing_take_ties_by_take(db):
    rows = db.execute("SELECT group_id, take, score FROM selection ORDER BY group_id").fetchall()
    # happy/p1 take 2 has a NULL wer: the filter is not true, so it does not pass
    assert rows == [("calm/p1", 2, 4.0), ("happy/p1", 1, 2.0)]


def test_groups_without_passing_take_are_listed(db):
    rows = db.execute(
        "SELECT group_id, n_takes, n_pass, status, selected_take FROM groups ORDER BY group_id"
    ).fetchall()
    assert rows == [
        ("calm/p1", 4, 3, "selected", 2),
        ("calm/p2", 2, 0, "no_take_passed", None),
        ("happy/p1", 3, 2, "selected", 1),
    ]
    assert db.execute("SELECT group_id FROM unselected").fetchall() == [("calm/p2",)]


def test_throughput_has_groups_and_overall(db):
    overall = db.execute(
        "SELECT clips, audio_s, generate_s, generate_s_per_clip "
        "FROM throughput WHERE level = 'overall'"
    ).fetchone()
    assert overall == (9, 18.0, 3.0, pytest.approx(3.0 / 9))
    assert db.execute("SELECT count(*) FROM throughput WHERE level = 'group'").fetchone()[0] == 3


def test_sql_that_fails_on_data_is_reported(tmp_path):
    files = [group_parquet(tmp_path, "calm/p1", [0.0], [1.0])]
    with pytest.raises(SelectionError, match="selection SQL failed"):
        build_database(files, tmp_path / "x.duckdb", "wer <= 0.1", "missing_col")
    assert not (tmp_path / "x.duckdb").exists()
