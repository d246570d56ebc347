"""Selection you can trust, on hand-made takes: held-out columns (checked, compared, flagged),
per-score gains, correlations, the filter funnel, the seeded listening order and the listening
page in a real browser (headless Chromium)."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from helpers import DATA, HELD_OUT, REPO, chromium, tiny_config, trade_off_results, write_group

from bestofn.report.throughput import write_report
from bestofn.select.base import SelectionError
from bestofn.select.database import build_database
from bestofn.select.held_out import (
    check_held_out,
    filter_clauses,
    held_out_columns,
    referenced_columns,
    scorer_directions,
)
from bestofn.select.trust import presentation_order
from bestofn.workflow_glue import check_selection_for

# What the shipped ASR and DNSMOS scorers declare (Scorer.better): wer/cer lower, DNSMOS higher
DIRECTIONS = scorer_directions({"scorers": [{"backend": "whisper-asr"}, {"backend": "dnsmos"}]})
ARTIFACTS = REPO / ".test-results"


@pytest.fixture
def trade_off(tmp_path):
    results = tmp_path / "results"
    files = trade_off_results(results, flac=True)
    build_database(files, results / "bestofn.duckdb", "wer <= 0.1", "quality", HELD_OUT, seed=5)
    write_report(results / "bestofn.duckdb", results / "report")
    return results


def test_selection_that_worsens_a_held_out_column_is_flagged(trade_off):
    con = duckdb.connect(str(trade_off / "bestofn.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT column_name, coalesce(emotion, 'all'), n_groups, vs_median, vs_median_hi, "
        "vs_random_hi, worse FROM held_out ORDER BY 1, 2"
    ).fetchall()
    by = {(r[0], r[1]): r for r in rows}
    # Only the 12 groups with a selected take count; sad/p0 has none.
    assert by[("naturalness", "all")][2] == 12
    assert by[("naturalness", "all")][5] < 0  # worse than a random take too, over all groups
    for emotion in ("all", "calm", "happy"):
        nat = by[("naturalness", emotion)]
        assert nat[3] < 0 and nat[4] < 0 and nat[6] is True
        clar = by[("clarity", emotion)]
        assert clar[3] > 0 and clar[6] is False
    # The selected take's values in the table are the selected take's own.
    sel = con.execute("SELECT avg(naturalness) FROM selection").fetchone()[0]
    assert by[("naturalness", "all")] and sel == pytest.approx(
        con.execute(
            "SELECT selected_mean FROM held_out WHERE column_name = 'naturalness' "
            "AND level = 'overall'"
        ).fetchone()[0]
    )
    con.close()
    throughput = (trade_off / "report/throughput.md").read_text()
    assert "WARNING: selection made held-out `naturalness` worse" in throughput
    assert "`clarity` worse" not in throughput
    selection_md = (trade_off / "report/selection.md").read_text()
    assert re.search(r"\| naturalness \| higher \| all \| 12 \|.*\| \*\*WORSE\*\* \|", selection_md)
    assert re.search(r"\| clarity \| higher \| all \| 12 \|.*\| not worse \|", selection_md)
    assert "class=worse" in (trade_off / "report/held_out.html").read_text()
    for name in ("score_correlation.png", "filter_funnel.png"):
        assert (trade_off / "report" / name).stat().st_size > 5000


def test_held_out_tables_are_reproducible(tmp_path, trade_off):
    files = sorted((trade_off / "groups").glob("*/*/scores.parquet"))
    queries = ["SELECT * FROM held_out ORDER BY ALL", "SELECT * FROM listening ORDER BY ALL"]
    con = duckdb.connect(str(trade_off / "bestofn.duckdb"), read_only=True)
    first = [con.execute(q).fetchall() for q in queries]
    con.close()
    build_database(files, tmp_path / "again.duckdb", "wer <= 0.1", "quality", HELD_OUT, seed=5)
    con = duckdb.connect(str(tmp_path / "again.duckdb"), read_only=True)
    assert [con.execute(q).fetchall() for q in queries] == first
    con.close()
    build_database(files, tmp_path / "other.duckdb", "wer <= 0.1", "quality", HELD_OUT, seed=6)
    con = duckdb.connect(str(tmp_path / "other.duckdb"), read_only=True)
    assert con.execute(queries[1]).fetchall() != first[1]
    con.close()


def test_what_best_of_n_bought_for_every_score(tmp_path):
    files = [
        write_group(tmp_path, "calm/p1", {"wer": [0.0, 0.0, 0.3, 0.05], "q": [1.0, 3.0, 9.0, 2.0]}),
        write_group(tmp_path, "calm/p2", {"wer": [0.2, 0.0, 0.0], "q": [5.0, 1.0, 4.0]}),
    ]
    build_database(files, tmp_path / "db.duckdb", "wer <= 0.1", "q", directions=DIRECTIONS)
    con = duckdb.connect(str(tmp_path / "db.duckdb"), read_only=True)
    rows = {
        r[0]: r[1:]
        for r in con.execute(
            "SELECT column_name, better, n_groups, selected_mean, median_mean, best_mean "
            "FROM score_gains WHERE level = 'overall'"
        ).fetchall()
    }
    # calm/p1 selects take 1 (q 3, wer 0); calm/p2 selects take 2 (q 4, wer 0).
    assert rows["score"] == ("higher", 2, 3.5, pytest.approx((2.5 + 4.0) / 2), 7.0)
    assert rows["wer"] == ("lower", 2, 0.0, pytest.approx((0.025 + 0.0) / 2), 0.0)
    assert rows["q"][0] is None and rows["q"][4] is None  # direction unknown: no "best"
    assert "duration_s" in rows and "take" not in rows and "group_wall_s" not in rows
    # Correlation: within each group, wer and q rank alike in calm/p1, opposite in calm/p2.
    rho = dict(
        ((a, b), r) for a, b, r in con.execute("SELECT * EXCLUDE n_takes FROM score_correlation")
        .fetchall()
    )  # fmt: skip
    assert rho[("q", "score")] == pytest.approx(1.0)
    assert rho[("wer", "q")] == rho[("q", "wer")]
    assert -1.0 <= rho[("wer", "q")] <= 1.0
    con.close()


def test_filter_funnel_counts_each_clause_in_order(tmp_path):
    files = [
        write_group(
            tmp_path,
            "calm/p1",
            {
                "wer": [0.0, 0.5, 0.0, None, 0.0],
                "q": [1.0, 1.0, -1.0, 1.0, 2.0],
                "label": ["a", "a", "a", "a", "b"],
            },
        ),
        write_group(tmp_path, "happy/p1", {"wer": [0.9, 0.8], "q": [1.0, 2.0], "label": ["a"] * 2}),
    ]
    flt = "wer <= 0.1 AND (q > 0 AND label = 'a')"
    build_database(files, tmp_path / "db.duckdb", flt, "q")
    con = duckdb.connect(str(tmp_path / "db.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT step, clause, takes_in, removed, takes_left, groups_left FROM filter_funnel "
        "WHERE level = 'overall' ORDER BY step"
    ).fetchall()
    assert rows == [
        (0, "(all takes)", 7, 0, 7, 2),
        (1, "wer <= 0.1", 7, 4, 3, 1),  # 0.5, NULL (fails), 0.9, 0.8
        (2, "q > 0", 3, 1, 2, 1),
        (3, "\"label\" = 'a'", 2, 1, 1, 1),  # as DuckDB writes it back (label is a keyword)
    ]
    # What is left after the last clause is exactly what passes the filter.
    assert con.execute("SELECT count(*) FROM scored WHERE passes").fetchone()[0] == 1
    happy = con.execute(
        "SELECT removed, groups_left FROM filter_funnel WHERE emotion = 'happy' AND step = 1"
    ).fetchone()
    assert happy == (2, 0)
    con.close()
    assert filter_clauses("a > 1 OR b > 1") == ["(a > 1) OR (b > 1)"]  # one clause
    assert filter_clauses("(x = ')(') AND y") == ["x = ')('", "y"]


def test_check_refuses_held_out_columns_in_filter_or_score():
    held = ["dnsmos_p808"]
    check_held_out("wer <= 0.1", "dnsmos_ovrl - cer", held, directions=DIRECTIONS)  # fine
    # a string literal is not a column
    check_held_out("stop_reason <> 'dnsmos_p808'", "dnsmos_ovrl", held, directions=DIRECTIONS)
    for flt, score, what in [
        ("wer <= 0.1 AND dnsmos_p808 > 3", "cer", "selection.filter uses held-out"),
        ("wer <= 0.1", "dnsmos_ovrl + 0.1 * DNSMOS_P808", "selection.score uses held-out"),
        ("wer <= 0.1", 'dnsmos_ovrl + "dnsmos_p808"', "selection.score uses held-out"),
        ("wer <= 0.1", "(SELECT max(dnsmos_p808) FROM takes)", "selection.score uses held-out"),
        ("wer <= 0.1", "list_sum(list_transform([1], x -> x * dnsmos_p808))", "score uses held"),
        ("wer <= 0.1", "list_sum(COLUMNS('dnsmos_.*'))", "reaches every column"),
    ]:
        with pytest.raises(SelectionError, match=what):
            check_held_out(flt, score, held, directions=DIRECTIONS)
    # lambda parameters are not columns
    assert referenced_columns("list_transform(l, wer -> wer + 1) > cer") == {"l", "cer"}
    columns = {"wer": "DOUBLE", "dnsmos_p808": "DOUBLE", "transcript": "VARCHAR"}
    with pytest.raises(SelectionError, match="'dnsmos_p8o8' is not a takes column"):
        check_held_out("wer < 1", "wer", ["dnsmos_p8o8"], columns, DIRECTIONS)
    with pytest.raises(SelectionError, match="'transcript' is VARCHAR, not a number"):
        check_held_out("wer < 1", "wer", [{"column": "transcript", "better": "higher"}], columns)
    with pytest.raises(SelectionError, match="does not know whether more or less 'my_mos'"):
        check_held_out("wer < 1", "wer", ["my_mos"], directions=DIRECTIONS)
    # a direction comes from the scorer that declares it: DNSMOS's p808 is unknown without it
    with pytest.raises(SelectionError, match="does not know whether more or less 'dnsmos_p808'"):
        check_held_out("wer < 1", "wer", held)
    # a glob declaration (Empathic-Insight's quality heads) covers the dynamic columns
    ei = scorer_directions({"scorers": [{"backend": "empathic-insight"}]})
    assert held_out_columns(["ei_score_overall_quality"], ei)[0].better == "higher"
    with pytest.raises(SelectionError, match="'ei_anger'"):
        held_out_columns(["ei_anger"], ei)


def test_bestofn_check_refuses_a_config_selecting_on_a_held_out_column(project):
    config = tiny_config()
    config["models"]["scorers"] = [{"backend": "duration"}, {"backend": "dnsmos"}]
    config["selection"] = {"filter": "words_per_s > 0.5", "score": "dnsmos_ovrl",
                           "held_out": ["dnsmos_p808"]}  # fmt: skip
    check_selection_for(config)
    config["selection"]["score"] = "dnsmos_ovrl + dnsmos_p808"
    with pytest.raises(SelectionError, match="score uses held-out column"):
        check_selection_for(config)
    (project / "config/config.yaml").write_text(json.dumps(config))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "bestofn"), "check"],
        cwd=project,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "selection.score uses held-out column(s) dnsmos_p808" in proc.stderr
    config["selection"]["score"] = "dnsmos_ovrl"
    config["selection"]["held_out"] = ["n_words_typo"]
    with pytest.raises(SelectionError, match="'n_words_typo' is not a takes column"):
        check_selection_for(config)


def test_held_out_entries_are_validated_by_field(project):
    from bestofn.core.plan import PlanError, build_plan

    config = tiny_config()
    config["selection"]["held_out"] = [{"column": "n_words", "better": "up"}]
    with pytest.raises(PlanError, match=r"selection.held_out.0.better: 'up' is not one of"):
        build_plan(config, project)
    config["selection"]["held_out"] = [{"column": "n_words", "better": "higher"}]
    assert build_plan(config, project).config["selection"]["held_out"] == [
        {"column": "n_words", "better": "higher"}
    ]
    assert build_plan(tiny_config(), project).config["selection"]["held_out"] == []


def test_embedded_default_holds_out_a_scorer_it_does_not_select_on():
    import yaml

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    held = config["selection"]["held_out"]
    assert held
    check_selection_for(config)
    for name in ("filter", "score"):
        assert not referenced_columns(config["selection"][name]) & {h.lower() for h in held}


def test_presentation_order_is_a_seeded_permutation():
    takes = list(range(8))
    order = presentation_order(1234, "calm/p1", takes)
    assert sorted(order) == takes and order != takes
    assert presentation_order(1234, "calm/p1", takes) == order
    assert presentation_order(1235, "calm/p1", takes) != order
    # Over many groups the selected take is not always shown first.
    firsts = {presentation_order(1, f"e/p{i}", [0, 1])[0] for i in range(20)}
    assert firsts == {0, 1}


def test_listening_page_records_a_seeded_order_and_samples_big_runs(trade_off, monkeypatch):
    import bestofn.report.listen

    con = duckdb.connect(str(trade_off / "bestofn.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT group_id, list(take ORDER BY listen_order), list(role ORDER BY listen_order) "
        "FROM listening GROUP BY group_id ORDER BY group_id"
    ).fetchall()
    for group_id, takes, roles in rows:
        # the order is presentation_order of (shown take, random other take)
        shown = [t for t, r in zip(takes, roles, strict=True) if r != "random"]
        other = [t for t, r in zip(takes, roles, strict=True) if r == "random"]
        assert takes == presentation_order(5, group_id, shown + other)
    firsts = {roles[0] for _, _, roles in rows if "selected" in roles}
    assert firsts == {"selected", "random"}  # the selected take is not always shown first
    assert dict((g, r) for g, _, r in rows)["sad/p0"] in (
        ["best_failing", "random"], ["random", "best_failing"]
    )  # fmt: skip
    page = (trade_off / "report/index.html").read_text()
    # the page shows each pair in the recorded order
    for group_id, takes, _ in rows:
        block = page.split(f">{group_id}</h3>")[1].split("</article>")[0]
        assert [int(t) for t in re.findall(r"data-take='(\d+)'", block)] == takes

    monkeypatch.setattr(bestofn.report.listen, "MAX_GROUPS", 11)
    bestofn.report.listen.write_listening_page(con, trade_off, trade_off / "report/small.html")
    con.close()
    small = (trade_off / "report/small.html").read_text()
    assert small.count("<article") == 11 and "Showing 11 of them" in small
    ids = set(re.findall(r"\bid='([^']+)'", small))
    assert set(re.findall(r"href='#([^']+)'", small)) <= ids


def _run_chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    profile.mkdir(parents=True, exist_ok=True)
    cmd = [
        binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", *args,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


@pytest.mark.browser
@pytest.mark.slow
def test_listening_page_in_headless_chromium(tmp_path, trade_off):
    binary = chromium()
    # The results folder is copyable: open the page from a copy, with the original gone.
    copy = tmp_path / "elsewhere" / "my results"
    shutil.copytree(trade_off, copy)
    shutil.rmtree(trade_off)
    page = copy / "report/index.html"

    dom = _run_chromium(binary, tmp_path / "p1", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    srcs = re.findall(r"<audio[^>]*\bsrc=\"([^\"]+)\"", dom.stdout)
    assert len(srcs) == 13 * 2  # every group: two takes (sad/p0: best failing + random)
    for src in srcs:
        assert not src.startswith(("/", "file:", "http")), src
        flac = (page.parent / src.replace("%20", " ")).resolve()
        assert flac.is_file() and flac.suffix == ".flac", src
    # The page's script ran (the emotion filter counted the groups it shows).
    assert re.search(r'<span id="shown">13</span>', dom.stdout)
    assert "No passing take (1)" in dom.stdout and "sad/p0" in dom.stdout
    # Every link of the worst lists lands on a group on the page.
    ids = set(re.findall(r'\bid="([^"]+)"', dom.stdout))
    anchors = re.findall(r'href="#([^"]+)"', dom.stdout)
    assert len(anchors) == 10 + 1 and set(anchors) <= ids

    # Every player can load its FLAC: a probe page beside index.html loads each source.
    probe = page.parent / "probe.html"
    probe.write_text(
        "<!doctype html><body><pre id='out'>pending</pre><script>"
        f"const srcs = {json.dumps(srcs)}; const res = {{}};"
        "srcs.forEach(s => { const a = new Audio(); a.preload = 'metadata';"
        "a.onloadedmetadata = () => { res[s] = a.duration; done(); };"
        "a.onerror = () => { res[s] = 'error ' + (a.error && a.error.code); done(); };"
        "a.src = s; });"
        "function done() { if (Object.keys(res).length === srcs.length)"
        " document.getElementById('out').textContent = JSON.stringify(res); }"
        "</script></body>"
    )
    probed = _run_chromium(
        binary, tmp_path / "p2", "--virtual-time-budget=20000", "--autoplay-policy="
        "no-user-gesture-required", "--dump-dom", probe.as_uri()
    )  # fmt: skip
    found = re.search(r"<pre id=\"out\">(.*?)</pre>", probed.stdout, re.S)
    assert found and found.group(1) != "pending", probed.stdout[-2000:] + probed.stderr[-2000:]
    durations = json.loads(found.group(1).replace("&quot;", '"'))
    assert set(durations) == set(srcs)
    assert all(isinstance(d, float | int) and d == pytest.approx(0.3, abs=0.01)
               for d in durations.values()), durations  # fmt: skip
    probe.unlink()

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "listen_index.png"
    shot.unlink(missing_ok=True)
    done = _run_chromium(
        binary, tmp_path / "p3", f"--screenshot={shot}", "--window-size=1280,1600",
        "--hide-scrollbars", page.as_uri(),
    )  # fmt: skip
    assert done.returncode == 0 and shot.stat().st_size > 20_000, done.stderr[-2000:]


def test_arrow_array_equals_pa_array():
    """trust.arrow_array (Arrow from buffers, so no pandas import) builds what pa.array does:
    NULL where None or masked, NaN kept, strings of any width."""
    from bestofn.select.arrow_io import arrow_array

    cases = [
        (["calm/p1", None, "ünï/códé", ""], pa.string(), None),
        (np.array(["a", None, "bb"], dtype=object), pa.string(), None),
        ([3, None, -1], pa.int32(), None),
        ([2**40, None], pa.int64(), None),
        ([0.5, None, float("nan")], pa.float64(), None),
        (np.array([1.0, np.nan, 3.0]), None, np.array([False, False, True])),
        (np.arange(5, dtype=np.int32), None, None),
        (np.array([1.5, 2.5]), None, np.array([True, True])),
        ([], pa.string(), None),
    ]
    for values, type_, mask in cases:
        got = arrow_array(values, type_, mask)
        want = pa.array(values, type_, mask=mask)
        got.validate(full=True)
        assert got.type == want.type
        assert got.to_pylist() == want.to_pylist() or (
            str(got.to_pylist()) == str(want.to_pylist())  # NaN != NaN
        ), values
        assert got.null_count == want.null_count


def test_the_database_rule_does_not_import_pandas(tmp_path):
    """pandas' import is 0.44 s of a 1.3-s database rule at 12 groups: neither the build nor
    the trust tables need it (pyarrow imports it for pa.array and to_numpy)."""
    demo = DATA / "demo_groups"
    files = sorted(str(p) for p in demo.rglob("scores.parquet"))
    code = (
        "import json, sys; from bestofn.select.database import build_database; "
        f"build_database(json.loads(sys.argv[1]), {str(tmp_path / 'db.duckdb')!r}, "
        "'wer <= 0.1', 'dnsmos_ovrl - cer', "
        "held_out=[{'column': 'dnsmos_p808', 'better': 'higher'}]); "
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(files)], capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == "False"
