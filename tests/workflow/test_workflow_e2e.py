"""The workflow through the snakemake CLI on a tiny config: run, resume, crash, verify."""

import os
import signal
import subprocess
import time

import duckdb
import pytest
from helpers import BIN, REPO, planned_jobs, snakemake, verify

pytestmark = pytest.mark.slow  # snakemake end to end: run, resume, crash


def test_run_resume_and_query(ran_project):
    project = ran_project  # the tiny project after `snakemake --profile profiles/local` (conftest)
    groups = sorted(
        p.relative_to(project / "results/groups") for p in (project / "results/groups").glob("*/*")
    )
    assert [str(g) for g in groups] == ["calm/p1", "calm/p2", "happy/p1", "happy/p2"]
    assert len(list((project / "results/groups/calm/p1/takes").glob("*.flac"))) == 2
    assert (project / "results/report/throughput.md").read_text().startswith("# bestofn throughput")
    assert (project / "results/report/stage_seconds.png").stat().st_size > 1000
    assert (project / "results/report/gain_by_score.png").stat().st_size > 1000
    throughput = (project / "results/report/throughput.md").read_text()
    assert "### Gain of every score, per emotion\n" in throughput
    assert "| column | better | calm | happy | all |" in throughput
    for name in ("selection.md", "index.html", "held_out.html", "score_gains.html",
                 "score_correlation.png", "filter_funnel.png"):  # fmt: skip
        assert (project / "results/report" / name).stat().st_size > 500, name
    # snakemake --report embeds the selection tables and plots with their captions.
    snakemake(project, "--report", "report.html")
    html = (project / "report.html").read_text()
    assert all(n in html for n in ("held_out.html", "score_correlation.png", "filter_funnel.png"))
    assert "gain_by_score.png" in html
    assert "4 groups checked, 0 problem(s)" in verify(project)

    con = duckdb.connect(str(project / "results/bestofn.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT group_id, flac_path, words_per_s FROM selection ORDER BY 1"
    ).fetchall()
    con.close()
    assert [r[0] for r in rows] == ["calm/p1", "calm/p2", "happy/p1", "happy/p2"]
    assert all((project / r[1]).is_file() and r[2] > 0 for r in rows)

    # Nothing left to do after a full run.
    assert planned_jobs(project) == {}
    # Deleting one group plans exactly that group plus the aggregation.
    import shutil

    shutil.rmtree(project / "results/groups/happy/p2")
    assert planned_jobs(project) == {"group": 1, "database": 1, "report": 1, "all": 1}
    snakemake(project)
    assert (project / "results/groups/happy/p2/scores.parquet").is_file()
    assert planned_jobs(project) == {}


def test_bad_sheet_fails_before_any_job(project):
    (project / "config/prompts.tsv").write_text("prompt_id\ttext\np1\tHello.\np1\tAgain.\n")
    proc = snakemake(project, check=False)
    assert proc.returncode == 2  # as `bestofn` on bad input
    assert "error: config/prompts.tsv" in proc.stderr and "duplicate prompt_id 'p1'" in proc.stderr
    assert not (project / "results").exists()


def test_sigkill_mid_run_then_restart_completes(project):
    cmd = [
        str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(project), "--profile", str(REPO / "profiles/local"),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    groups = project / "results/groups"
    deadline = time.time() + 300
    try:
        # Kill snakemake and all of its children at once, mid-run: as soon as one group is
        # published while another is being written (a hidden partial dir exists), or, since the
        # write window of a tiny group is milliseconds long and a loaded machine may poll past
        # it, once 2 of the 4 groups are published (a third is then in the worker).
        done: list = []
        while time.time() < deadline:
            done = [p for p in groups.glob("*/*") if not p.name.startswith(".")]
            partial = list(groups.glob("*/.*partial*"))
            if (done and partial) or 2 <= len(done) < 4:
                break
            if proc.poll() is not None:
                pytest.fail(f"snakemake exited ({proc.returncode}) before the kill; {done}")
            time.sleep(0.02)
        else:
            pytest.fail(f"no group published mid-run within 300 s; published: {done}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # Nothing that looks like a finished group is incomplete.
    for group in (p for p in groups.glob("*/*") if not p.name.startswith(".")):
        assert (group / "scores.parquet").is_file(), group
    # A killed snakemake leaves its directory lock behind; unlocking is the documented restart.
    snakemake(project, "--unlock")
    snakemake(project)
    assert "4 groups checked, 0 problem(s)" in verify(project)


def test_unknown_backend_option_fails_at_dag_time(project):
    import yaml

    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config["models"]["generator"]["options"] = {"noise_scal": 0.5}
    (project / "config/config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(project, "-n", check=False)
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert "generator backend 'piper' has no option 'noise_scal'" in out
    assert "did you mean 'noise_scale'?" in out


def test_quarantine_then_rerun_regenerates_exactly_the_broken_groups(ran_project):
    project = ran_project  # the tiny project after `snakemake --profile profiles/local` (conftest)
    groups = project / "results/groups"
    (groups / "calm/p2/takes/001.flac").unlink()  # a lost FLAC
    (groups / "happy/p1/scores.parquet").unlink()  # a lost parquet
    intact = {
        g: (groups / g / "scores.parquet").stat().st_mtime_ns for g in ("calm/p1", "happy/p2")
    }
    # Snakemake sees both directories and plans nothing: the reason --quarantine exists.
    assert planned_jobs(project) == {}

    bestofn = [str(BIN / "bestofn"), "verify", "results"]
    proc = subprocess.run(bestofn, cwd=project, capture_output=True, text=True)
    assert proc.returncode == 1 and "4 groups checked, 2 problem(s)" in proc.stdout
    assert (groups / "calm/p2").is_dir()  # plain verify moves nothing

    proc = subprocess.run([*bestofn, "--quarantine"], cwd=project, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "moved 2 broken group(s)" in proc.stdout
    quarantine = project / "results/quarantine"
    assert sorted(str(p.relative_to(quarantine)) for p in quarantine.glob("*/*")) == [
        "calm/p2",
        "happy/p1",
    ]
    reason = (quarantine / "calm/p2/REASON.txt").read_text()
    assert "takes/001.flac does not exist" in reason and "from: results/groups/calm/p2" in reason
    assert "no scores.parquet" in (quarantine / "happy/p1/REASON.txt").read_text()
    assert sorted(str(p.relative_to(groups)) for p in groups.glob("*/*")) == ["calm/p1", "happy/p2"]

    # The next run regenerates exactly the two quarantined groups.
    assert planned_jobs(project) == {"group": 2, "database": 1, "report": 1, "all": 1}
    snakemake(project)
    assert "4 groups checked, 0 problem(s)" in verify(project)
    assert planned_jobs(project) == {}
    for g, mtime in intact.items():
        assert (groups / g / "scores.parquet").stat().st_mtime_ns == mtime, g

    # Quarantining the same group again keeps the first copy: calm/p2-1.
    (groups / "calm/p2/scores.parquet").unlink()
    subprocess.run([*bestofn, "--quarantine"], cwd=project, capture_output=True, text=True)
    assert (quarantine / "calm/p2-1/REASON.txt").is_file()
    assert (quarantine / "calm/p2/REASON.txt").is_file()
