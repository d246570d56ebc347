"""Planning at scale keeps the invariants: one group is one target and depends only on its own
params (its text, emotion, N, seed, reference voice and the models); `bestofn plan` says what
remains and what it costs. (Planning speed is a benchmark in docs/PERFORMANCE.md, not a test.)"""

import functools
import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import soundfile as sf
import yaml
from helpers import REPO, write_tsv

from bestofn.core.plan import build_plan
from bestofn.ops.cost import format_report, remaining

BIN = Path(sys.executable).parent


def snakemake(project: Path, *args: str) -> str:
    cmd = [
        str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(project), "--profile", str(REPO / "profiles/local"), *args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def planned(project: Path) -> list[str]:
    """The group jobs a dry run plans, as 'emotion/prompt_id'."""
    out = snakemake(project, "-n")
    return sorted(
        line.split("results/groups/", 1)[1].strip()
        for line in out.splitlines()
        if line.strip().startswith("output: results/groups/")
    )


def config(project: Path) -> dict:
    return yaml.safe_load((project / "config/config.yaml").read_text())


@pytest.mark.slow
def test_a_group_reruns_exactly_when_its_own_params_change(ran_project):
    """Run the tiny project, then change one prompt's text, the reference voice of one
    emotion, a runtime knob, and delete one group: each plans exactly the groups concerned."""
    project = ran_project  # the tiny project after `snakemake --profile profiles/local` (conftest)
    assert planned(project) == []

    # One prompt's text: the two groups of that prompt, nothing else.
    write_tsv(
        project / "config/prompts.tsv",
        ["prompt_id", "text"],
        [["p1", "Good morning to you all."], ["p2", "It is nine o'clock."]],
    )
    assert planned(project) == ["calm/p1", "happy/p1"]
    write_tsv(
        project / "config/prompts.tsv",
        ["prompt_id", "text"],
        [["p1", "Good morning to you."], ["p2", "It is nine o'clock."]],
    )
    assert planned(project) == []

    # The reference voice is no Snakemake input, but its content is part of the groups'
    # identity: new audio in the file reruns the groups that use it (only calm has one).
    ref = project / "config/voices/ref.flac"
    audio, rate = sf.read(ref)
    original = ref.read_bytes()
    sf.write(ref, audio[: len(audio) // 2], rate)
    assert planned(project) == ["calm/p1", "calm/p2"]
    ref.write_bytes(original)  # same content again (a new mtime): nothing to rerun
    assert planned(project) == []

    # Performance knobs are not params.
    (project / "config/config.yaml").write_text(
        yaml.safe_dump({**config(project), "runtime": {"queue_depth": 3}})
    )
    assert planned(project) == []

    # A deleted group directory is planned again (rule all names every group: Snakemake would
    # not regenerate a missing input of an up-to-date database).
    shutil.rmtree(project / "results/groups/happy/p2")
    assert planned(project) == ["happy/p2"]


def make_db(path: Path, rows: list[tuple]) -> None:
    """A results database with the throughput columns `bestofn plan` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE throughput (level VARCHAR, device VARCHAR, clips INT, wall_s DOUBLE)")
    con.executemany("INSERT INTO throughput VALUES (?, ?, ?, ?)", rows)
    con.close()


def test_plan_counts_remaining_groups_and_estimates_gpu_hours(project):
    write_tsv(
        project / "config/prompts.tsv",
        ["prompt_id", "text"],
        [[f"p{i}", f"Line number {i}."] for i in range(1, 6)],
    )
    plan = build_plan(config(project), project)  # 2 emotions x 5 prompts, 2 takes each
    groups = project / "results/groups"
    for group in ["calm/p1", "calm/p2", "happy/p4"]:
        (groups / group).mkdir(parents=True)
    (groups / "calm/.p3.partial-1234abcd").mkdir()  # a write in flight is not done
    (groups / "happy/.p5.staged-0123456789abcdef").mkdir()  # nor is a staged one

    r = remaining(plan, project / "results")
    assert r.planned == {"calm": 5, "happy": 5}
    assert r.done == {"calm": 2, "happy": 1}
    assert r.left == {"calm": 3, "happy": 4} and r.groups_left == 7
    assert r.rates == [] and "no measurement yet" in r.why_no_rate
    assert "estimate: none (no measurement yet" in format_report(r)

    # Measured: 3 groups on cuda:0 at 2 takes each, 0.5 s per take overall.
    make_db(
        project / "results/bestofn.duckdb",
        [("group", "cuda:0", 2, 1.0), ("group", "cuda:0", 2, 0.8), ("group", "cuda:0", 2, 1.2),
         ("overall", "cuda:0", 6, 3.0)],
    )  # fmt: skip
    r = remaining(plan, project / "results")
    [rate] = r.rates
    assert (rate.device, rate.groups, rate.clips) == ("cuda:0", 3, 6)
    assert rate.s_per_clip == pytest.approx(0.5)
    assert r.hours_left(rate) == pytest.approx(7 * 2 * 0.5 / 3600)
    report = format_report(r)
    assert "GPU-hours left at 0.5000 s/take" in report
    assert "total" in report and "7" in report.splitlines()[3]


def test_plan_cli(project):
    proc = subprocess.run(
        [str(BIN / "bestofn"), "plan"], cwd=project, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "remaining: 4 groups x 2 takes = 8 takes" in proc.stdout
    assert "estimate: none (no measurement yet" in proc.stdout
    (project / "config/prompts.tsv").write_text("prompt_id\ttext\np1\tHi.\np1\tAgain.\n")
    proc = subprocess.run(
        [str(BIN / "bestofn"), "plan"], cwd=project, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "duplicate prompt_id 'p1'" in proc.stderr


def test_signature_cache_answers_as_inspect_does():
    from bestofn.snakemake_speedups import OVERRIDE, cached

    calls = []

    def original(func):
        calls.append(func)
        return inspect.signature(func).parameters

    fast = cached(original)

    class Thing:
        def method(self, wildcards, input=None):
            return 1

    def plain(wildcards, attempt):
        return 2

    def variadic(wildcards, **kwargs):
        return 3

    part = functools.partial(plain, attempt=1)
    for func in [Thing().method, Thing().method, plain, plain, variadic, part, len, lambda w: w]:
        assert list(fast(func)) == list(inspect.signature(func).parameters), func
    assert len(calls) == 6  # one inspect per function (bound methods share their function's)

    class NoWeakref:  # answered every time, never cached
        __slots__ = ()

        def __call__(self, wildcards):
            return 4

    for _ in range(2):
        assert list(fast(NoWeakref())) == ["wildcards"]
    assert len(calls) == 8

    def overridden(*args):
        return args

    setattr(overridden, OVERRIDE, ["wildcards", "groupid"])  # Snakemake's own override
    assert fast(overridden) == ["wildcards", "groupid"]
