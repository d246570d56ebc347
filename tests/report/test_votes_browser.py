"""Listener votes end to end in headless Chromium on results of the real workflow (piper takes,
run once per module through snakemake): blind mode, votes by keyboard, export through the page's
own button, `bestofn listen import`, the DuckDB tables, the report, and a database rebuild."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml
from cdp import Browser
from helpers import REPO, chromium, snakemake, tiny_config, write_tsv

from bestofn.report.votes import left_first, order_seed

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # headless Chromium on snakemake's results

BIN = Path(sys.executable).parent
ARTIFACTS = REPO / ".test-results"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A project run whole by the workflow: 2 emotions x 4 prompts x 3 piper takes."""
    root = tmp_path_factory.mktemp("votes_demo")
    (root / "config/voices").mkdir(parents=True)
    shutil.copy(REPO / "config/voices/joe_reference.flac", root / "config/voices/ref.flac")
    write_tsv(root / "config/emotions.tsv", ["emotion", "description", "reference_audio"],
              [["calm", "A calm voice.", "config/voices/ref.flac"],
               ["happy", "A happy voice.", ""]])  # fmt: skip
    texts = ["Good morning to you.", "It is nine o'clock.", "The train is late.", "Close it."]
    write_tsv(root / "config/prompts.tsv", ["prompt_id", "text"],
              [[f"p{i}", t] for i, t in enumerate(texts)])  # fmt: skip
    (root / "config/config.yaml").write_text(yaml.safe_dump(tiny_config(takes=3)))
    snakemake(root)
    return root


@pytest.fixture
def project(tmp_path, demo):
    """A private copy of the demo project (each test imports its own votes)."""
    dest = tmp_path / "project"
    shutil.copytree(demo, dest, ignore=shutil.ignore_patterns(".snakemake"))
    return dest


def _db(project: Path):
    return duckdb.connect(str(project / "results/bestofn.duckdb"), read_only=True)


def _vote_in_browser(tmp_path, project, listener, decide, shot=None):
    """Open the page, enter the name, tick blind, vote on every group by keyboard with the key
    ``decide(group, left, right)`` returns, export through the button. Returns (the exported
    file, the page's groups with their takes left first)."""
    binary = chromium()
    page = project / "results/report/index.html"
    browser = Browser(binary, tmp_path / "profile", tmp_path / "downloads")
    try:
        browser.open(page.as_uri())
        browser.click("#blind")  # the voting controls show in blind mode only
        assert browser.js("document.body.classList.contains('blind')")
        assert browser.js("document.activeElement.id") == "listener"  # asks for the name
        browser.type_text(listener)
        browser.click("h1")  # keys typed in the name field are not votes
        shown = browser.js(
            "[...document.querySelectorAll('article.group')].map(a => [a.dataset.group,"
            "[...a.querySelectorAll('.pair .take')].map(t => +t.dataset.take)])"
        )
        # Voting starts on the first group; each vote moves on to the next one.
        assert (
            browser.js("document.querySelector('article.group.current').dataset.group")
            == (shown[0][0])
        )
        for group, (left, right) in shown:
            assert browser.js("document.querySelector('.current').dataset.group") == group
            for key in decide(group, left, right):
                browser.press(key)
        tally = browser.js("document.getElementById('tally').textContent")
        assert tally.startswith(f"{len(shown)} of {len(shown)} shown groups voted"), tally
        if shot:
            browser.js("window.scrollTo(0, 0)")
            ARTIFACTS.mkdir(exist_ok=True)
            browser.screenshot(shot)
        browser.click("#export")
        exported = browser.wait_download()
    finally:
        log = browser.close()
    assert exported.stat().st_size > 0, log
    return exported, shown


def _import(project: Path, *files: Path, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(BIN / "bestofn"), "listen", "import", *map(str, files)],
        cwd=project, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_no_votes_yet_in_the_report(demo):
    assert "No votes yet" in (demo / "results/report/throughput.md").read_text()
    assert "No votes yet" in (demo / "results/report/selection.md").read_text()
    assert "No votes yet" in (demo / "results/report/listener_agreement.html").read_text()
    con = _db(demo)
    # The database rule wrote the listener tables, empty.
    assert con.execute("SELECT count(*) FROM listener_votes").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM listener_agreement").fetchone() == (0,)
    con.close()


def test_keyboard_votes_export_import_and_agreement(tmp_path, project):
    con = _db(project)
    selected = dict(con.execute("SELECT group_id, selected_take FROM groups").fetchall())
    seed = con.execute("SELECT seed FROM trust_settings").fetchone()[0]
    listening = {
        g: list(t)
        for g, t in con.execute(
            "SELECT group_id, list(take ORDER BY listen_order) FROM listening GROUP BY 1"
        ).fetchall()
    }
    con.close()
    given = {}  # group -> 'selected' | 'other' | 'same'

    def decide(group, left, right):
        i = len(given)
        given[group] = ("selected", "other", "same")[i % 3]
        if given[group] == "same":
            return ["s"]
        on_left = (selected[group] == left) == (given[group] == "selected")
        keys = ["a"] if on_left else ["b"]
        # the first group also gets a confidence, given before the vote; the second an arrow
        if i == 0:
            keys = ["3", *keys]
        if i == 1:
            keys = ["ArrowLeft" if on_left else "ArrowRight"]
        return keys

    shot = ARTIFACTS / "listen_votes.png"
    shot.unlink(missing_ok=True)
    exported, shown = _vote_in_browser(tmp_path, project, "ann", decide, shot)
    assert shot.stat().st_size > 20_000

    # The page's per-listener order is the one bestofn.report.votes computes (the import checks it).
    seed_ann = order_seed(seed, "ann")
    for group, pair in shown:
        assert pair == left_first(seed_ann, group, listening[group])
    assert len({tuple(p) == tuple(listening[g]) for g, p in shown}) == 2  # some swapped

    doc = json.loads(exported.read_text())
    assert doc["listener"] == "ann" and len(doc["votes"]) == len(shown) == 8
    for v in doc["votes"]:
        # never which take was selected
        assert set(v) == {"group_id", "left_take", "right_take", "choice", "confidence",
                          "listener", "time", "page_seed", "order_seed", "build",
                          "pair"}  # fmt: skip
    assert {v["group_id"]: v["confidence"] for v in doc["votes"]}[shown[0][0]] == 3

    out = _import(project, exported)
    assert "imported 1 file(s), 8 new or changed vote(s)" in out.stdout
    con = _db(project)
    rows = con.execute(
        "SELECT group_id, choice, for_selected, counted FROM listener_votes ORDER BY 1"
    ).fetchall()
    assert len(rows) == 8 and all(r[3] for r in rows)
    for group, choice, for_sel, _ in rows:
        want = given[group]
        assert (choice == "same") == (want == "same")
        assert for_sel == {"selected": True, "other": False, "same": None}[want]
    agreement = {
        e: r
        for e, *r in con.execute(
            "SELECT coalesce(emotion, 'all'), n_votes, n_decisive, n_same, n_for_selected, "
            "agreement, agreement_lo, agreement_hi FROM listener_agreement"
        ).fetchall()
    }
    for emotion in ("all", "calm", "happy"):
        mine = [w for g, w in given.items() if emotion in ("all", g.split("/")[0])]
        k, dec = mine.count("selected"), len(mine) - mine.count("same")
        n, n_dec, n_same, n_for, share, lo, hi = agreement[emotion]
        assert (n, n_dec, n_same, n_for) == (len(mine), dec, mine.count("same"), k)
        assert share == pytest.approx(k / dec) and lo <= share <= hi
    con.close()
    report = (project / "results/report/listener_agreement.html").read_text()
    assert "Listener agreement" in report and "No votes yet" not in report

    # The same file again adds nothing.
    again = _import(project, exported)
    assert "already imported, adds nothing" in again.stdout
    con = _db(project)
    assert con.execute("SELECT count(*) FROM listener_votes").fetchone() == (8,)
    con.close()

    # A rebuild of the database by the workflow keeps the votes, and the report then shows them.
    snakemake(project, "--forcerun", "database")
    con = _db(project)
    assert con.execute("SELECT count(*) FILTER (WHERE counted) FROM listener_votes").fetchone() == (
        8,
    )
    con.close()
    throughput = (project / "results/report/throughput.md").read_text()
    k, same = list(given.values()).count("selected"), list(given.values()).count("same")
    share = f"{k / (len(given) - same):.2f}"
    assert re.search(rf"agreement with the selection: {share} \[", throughput), throughput
    # snakemake --report embeds the listener table and plot.
    snakemake(project, "--report", "report.html")
    html = (project / "report.html").read_text()
    assert "listener_agreement.html" in html and "listener_agreement.png" in html


def test_always_left_raises_the_position_warning(tmp_path, project):
    exported, shown = _vote_in_browser(tmp_path, project, "bob", lambda g, lt, rt: ["a"])
    out = _import(project, exported)
    assert "WARNING: listener 'bob' chose the left take in 8 of 8" in out.stdout
    con = _db(project)
    row = con.execute(
        "SELECT n_decisive, n_left, left_share, left_lo, warning FROM listener_position "
        "WHERE listener = 'bob'"
    ).fetchone()
    con.close()
    assert row[:3] == (8, 8, 1.0) and row[3] > 0.5 and row[4] is True


def test_always_selected_gives_agreement_one_with_a_lower_bound_below_one(tmp_path, project):
    con = _db(project)
    selected = dict(con.execute("SELECT group_id, selected_take FROM groups").fetchall())
    con.close()
    exported, _ = _vote_in_browser(
        tmp_path, project, "cy", lambda g, left, right: ["a" if selected[g] == left else "b"]
    )
    _import(project, exported)
    con = _db(project)
    share, lo, hi, n = con.execute(
        "SELECT agreement, agreement_lo, agreement_hi, n_decisive FROM listener_agreement "
        "WHERE level = 'overall'"
    ).fetchone()
    warn = con.execute("SELECT warning FROM listener_position").fetchone()[0]
    con.close()
    assert (share, hi, n) == (1.0, 1.0, 8)
    assert 0.5 < lo < 1.0  # 8 of 8 is not certainty
    # Votes follow the selection, whose side is seeded: no position warning.
    assert warn is False
