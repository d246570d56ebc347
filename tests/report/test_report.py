"""Throughput report on a hand-made database: the per-score gain table and plots."""

from __future__ import annotations

import threading

import pytest
from helpers import group_parquet, held_elsewhere

from bestofn.report import throughput
from bestofn.report.throughput import gain_histogram, score_gain_table, write_report
from bestofn.report.trust import write_selection_report
from bestofn.select.database import build_database
from bestofn.select.held_out import scorer_directions

ASR = scorer_directions({"scorers": [{"backend": "whisper-asr"}]})


@pytest.fixture
def report(tmp_path):
    files = [
        # calm/p1 selects take 1 (quality 3; median 2.5, median wer 0.025)
        group_parquet(tmp_path, "calm/p1", [0.0, 0.0, 0.3, 0.05], [1.0, 3.0, 9.0, 2.0]),
        # calm/p2 selects take 2 (quality 4; median 4, median wer 0)
        group_parquet(tmp_path, "calm/p2", [0.2, 0.0, 0.0], [5.0, 1.0, 4.0]),
        # happy/p1 selects take 0 (quality 6; median 4, median wer 0.1)
        group_parquet(tmp_path, "happy/p1", [0.0, 0.1, 0.2], [6.0, 4.0, 1.0]),
    ]
    # wer's direction, as the ASR scorers declare it (Scorer.better)
    build_database(files, tmp_path / "db.duckdb", "wer <= 0.1", "quality", directions=ASR)
    return write_report(tmp_path / "db.duckdb", tmp_path / "report")


def _table(md: str, heading: str) -> dict[str, list[str]]:
    after = md.split(heading, 1)[1]
    lines = [x for x in after.splitlines() if x.startswith("|")]
    rows = [[c.strip() for c in x.strip("|").split("|")] for x in lines]
    assert rows[1][0].startswith("---")
    return {r[0]: r[1:] for r in [rows[0], *rows[2:]]}


def test_report_has_the_gain_of_every_score_per_emotion(report):
    md = report.read_text()
    table = _table(md, "### Gain of every score, per emotion")
    assert table["column"] == ["better", "calm", "happy", "all"]
    # selected − median, averaged over each emotion's groups: quality (the score) and wer
    assert table["score"] == ["higher", "+0.250", "+2.000", "+0.833"]
    assert table["quality"] == ["–", "+0.250", "+2.000", "+0.833"]
    assert table["wer"] == ["lower", "-0.013", "-0.100", "-0.042"]
    assert "duration_s" in table and "take" not in table
    assert (report.parent / "gain_by_score.png").stat().st_size > 0
    assert "![gain of every score](gain_by_score.png)" in md


def test_gain_histogram_counts_groups_in_integers():
    import matplotlib

    matplotlib.use("Agg")
    fig = gain_histogram([0.1, 0.12, 0.5])  # a few groups: matplotlib's default gives 0.5 steps
    fig.canvas.draw()
    ticks = fig.axes[0].get_yticks()
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)


def test_gain_table_never_shows_minus_zero():
    rows = [("speaker_sim", "calm", "higher", -0.0001, 0.01)]
    rows.append(("speaker_sim", None, "higher", 0.0, 0.01))
    assert score_gain_table(rows)[2] == "| speaker_sim | higher | +0.000 | +0.000 |"


def test_report_connections_carry_the_database_settings(tmp_path):
    """The report opens the database with the config's database: settings (DuckDB caches what
    it reads up to its memory limit: 80 % of RAM unset), and its connections agree."""
    import duckdb

    from bestofn.select.database import database_defaults, open_read_only

    db = tmp_path / "x.duckdb"
    duckdb.connect(str(db)).execute("CREATE TABLE t AS SELECT 1 AS a").close()
    settings = {"memory_limit": "300MB", "threads": 1}
    con = open_read_only(db, settings)
    again = open_read_only(db, settings)  # the report's second connection, same process
    limit, threads = con.execute(
        "SELECT current_setting('memory_limit'), current_setting('threads')"
    ).fetchone()
    assert (limit, threads) == ("286.1 MiB", 1)
    assert again.execute("SELECT a FROM t").fetchone() == (1,)
    con.close()
    again.close()
    assert database_defaults()["memory_limit"] == "1GB"
    for unset in (None, {"memory_limit": None, "threads": None}):  # None: the schema's default
        default = open_read_only(db, unset)
        limit = default.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        assert limit == "953.6 MiB"
        default.close()


def _failing_selection_report(db_path, out_dir, database=None):
    raise RuntimeError("selection half failed")


def test_the_selection_half_writes_its_files_and_raises_its_errors(report, tmp_path, monkeypatch):
    """The selection report is written by another process (bestofn.report.fresh_process): its
    files are there, its lines are in throughput.md, and its error is the report's."""
    from bestofn.report import trust as trust_report

    out = report.parent
    for name in trust_report.FILES.values():
        assert (out / name).stat().st_size > 0, name
    assert "[selection.md](selection.md)" in report.read_text()
    monkeypatch.setattr(trust_report, "write_selection_report", _failing_selection_report)
    with pytest.raises(RuntimeError, match="selection half failed"):
        write_report(tmp_path / "db.duckdb", tmp_path / "again")


LOCK = threading.Lock()


def _selection_report_under_lock(db_path, out_dir, database=None):
    with LOCK:
        return write_selection_report(db_path, out_dir, database)


def test_the_report_is_written_while_another_thread_holds_a_lock(report, tmp_path, monkeypatch):
    """A caller with threads (DuckDB's, OpenBLAS's, a test runner's) may hold a lock when the
    report starts its selection half: a forked child inherited it held and hung; the child
    now starts fresh, and the report is the same."""
    from bestofn.report import trust as trust_report

    monkeypatch.setattr(trust_report, "write_selection_report", _selection_report_under_lock)
    monkeypatch.setattr(throughput, "SELECTION_TIMEOUT_S", 60)  # a regression fails, not hangs
    with held_elsewhere(LOCK):
        again = write_report(tmp_path / "db.duckdb", tmp_path / "again")
    files = sorted(f.name for f in report.parent.iterdir())
    assert sorted(f.name for f in again.parent.iterdir()) == files
    for name in files:  # the plots too: byte for byte
        assert (again.parent / name).read_bytes() == (report.parent / name).read_bytes(), name


def test_report_plots_the_best_of_k_curve_with_its_knees(report):
    md = report.read_text()
    after = md.split("## Best of k: how many takes to buy", 1)[1]
    rows = [[c.strip() for c in x.strip("|").split("|")] for x in after.splitlines()]
    table = {r[1]: r for r in rows if r[0] == "default"}
    # calm: p1 passes takes scored 1, 3, 2 of 4 takes; p2 scored 1, 4 of 3 takes. k = 1: the
    # mean of each group's passing scores (2, 2.5); k = 3: 2.75 and 4 (enumerated by hand);
    # k = 4: p1 alone (3). The knee: the first k at 90 % of the rise from 2.25 to 3.
    assert table["calm"] == ["default", "calm", "4", "2.25", "3", "3.375", "3", "71 %"]
    assert (report.parent / "best_of_k.png").stat().st_size > 0
    assert "![best of k](best_of_k.png)" in md
