"""Selection SQL on a hand-made table: best passing take per group, ties by take, no group lost."""

import duckdb
import pyarrow.parquet as pq
import pytest
from helpers import group_parquet

from bestofn.select import database
from bestofn.select.base import SelectionError
from bestofn.select.database import build_database


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


def test_memory_share_of_a_duckdb_limit():
    from bestofn.select.database import memory_share

    assert memory_share("1GB", 0.25) == "250000000 bytes"  # DuckDB: GB = 10^9 bytes
    assert memory_share("1.5 GiB", 0.5) == f"{int(1.5 * 2**30 * 0.5)} bytes"
    assert memory_share("500mb", 0.5) == "250000000 bytes"
    assert memory_share("80%", 0.5) == "80%"  # another form: as it is
    con = duckdb.connect()
    con.execute("SET memory_limit = ?", [memory_share("1GB", 0.25)])
    assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == "238.4 MiB"


def test_an_error_in_a_chunk_stops_the_next_read_and_leaves_no_database(tmp_path, monkeypatch):
    """The next chunk is read on a second connection while one is worked on: an error stops
    it before the work database closes, and the half-built file is removed."""
    import threading

    from bestofn.select import trust

    files = [group_parquet(tmp_path, f"calm/p{i}", [0.0, 0.1], [1.0, 2.0]) for i in range(8)]
    monkeypatch.setattr(database, "CHUNK_TAKES", 4)
    monkeypatch.setattr(database, "FIRST_CHUNK_FILES", 2)
    calls = []
    add_chunk = trust.TrustTables.add_chunk

    def failing(self):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("chunk 2")
        add_chunk(self)

    monkeypatch.setattr(trust.TrustTables, "add_chunk", failing)
    with pytest.raises(RuntimeError, match="chunk 2"):
        build_database(files, tmp_path / "x.duckdb", "wer <= 0.1", "quality")
    assert not (tmp_path / "x.duckdb").exists()
    assert not list(tmp_path.glob("x.tmp.duckdb*"))
    assert not [t for t in threading.enumerate() if t.name.startswith("bestofn-read")]
    monkeypatch.setattr(trust.TrustTables, "add_chunk", add_chunk)
    counts = build_database(files, tmp_path / "x.duckdb", "wer <= 0.1", "quality")
    assert counts == {"takes": 16, "groups": 8, "selected": 8}


def test_a_chunk_with_an_older_file_is_read_by_name(tmp_path, monkeypatch):
    """A chunk whose files differ in schema is read again by name (missing columns NULL),
    chunk by chunk; the others keep the plain read."""

    files = [group_parquet(tmp_path, f"calm/p{i}", [0.0, 0.1], [1.0, 2.0]) for i in range(6)]
    older = pq.read_table(files[3]).drop_columns(["quality"])
    pq.write_table(older, files[3])
    monkeypatch.setattr(database, "CHUNK_TAKES", 4)
    monkeypatch.setattr(database, "FIRST_CHUNK_FILES", 2)
    reads = []
    read = database._read_chunk

    def spy(reader, chunk, union):
        reads.append(len(chunk))
        return read(reader, chunk, union)

    monkeypatch.setattr(database, "_read_chunk", spy)
    counts = build_database(files, tmp_path / "x.duckdb", "wer <= 0.1", "coalesce(quality, 0)")
    assert counts == {"takes": 12, "groups": 6, "selected": 6}
    assert reads == [2, 2, 2]  # no restart of the build
    con = duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True)
    nulls = con.execute(
        "SELECT group_id, count(*) FROM takes WHERE quality IS NULL GROUP BY 1"
    ).fetchall()
    assert nulls == [("calm/p3", 2)]
