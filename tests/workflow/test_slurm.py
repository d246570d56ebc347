"""profiles/slurm against a real one-node SLURM: Debian's slurmctld + slurmd + munge with three
fake GPUs (.ci/slurm-up.sh, which `make test` runs first). Real sbatch jobs, real scancel, a real
time limit. When SLURM cannot start here the tests fail with the reason; they never skip."""

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pytest
import yaml
from helpers import REPO, tiny_config, write_tsv

from bestofn.worker.client.group_job import health
from bestofn.worker.client.runtime import default_state_dir

pytestmark = [pytest.mark.slurm, pytest.mark.slow]  # SLURM jobs through the one-node SLURM

BIN = Path(sys.executable).parent
SLURM_UP = REPO / ".ci/slurm-up.sh"
QUICK_POLL = Path(__file__).with_name("slurm_quick_poll.py")


@pytest.fixture(scope="module")
def slurm():
    """A running one-node SLURM with gpu:3, or a failure that says why."""
    try:
        proc = subprocess.run(["bash", str(SLURM_UP)], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"SLURM could not be started on this machine ({SLURM_UP}): {e}")
    if proc.returncode != 0:
        pytest.fail(
            f"SLURM could not be started on this machine ({SLURM_UP} exited "
            f"{proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    info = subprocess.run(["sinfo", "-h", "-o", "%T %G"], capture_output=True, text=True)
    assert "gpu:3" in info.stdout, info.stdout + info.stderr
    return info.stdout.strip()


def make_project(root: Path, emotions: list[str], prompts: int, components: int) -> Path:
    """A workflow directory with the tiny config and a copy of profiles/slurm that differs only
    where this test cluster does (no slurmdbd, so squeue; no accounts; a 2-core node)."""
    (root / "config/voices").mkdir(parents=True)
    shutil.copy(REPO / "config/voices/joe_reference.flac", root / "config/voices/ref.flac")
    write_tsv(
        root / "config/emotions.tsv",
        ["emotion", "description", "reference_audio"],
        [[e, f"A {e} voice.", "config/voices/ref.flac"] for e in emotions],
    )
    texts = ["Good morning to you.", "It is nine o'clock.", "The train leaves at noon.",
             "Please close the door.", "We will meet again soon."]  # fmt: skip
    write_tsv(
        root / "config/prompts.tsv",
        ["prompt_id", "text"],
        [[f"p{i + 1}", texts[i % len(texts)]] for i in range(prompts)],
    )
    (root / "config/config.yaml").write_text(yaml.safe_dump(tiny_config()))
    profile = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    profile.update(
        {
            "slurm-status-command": "squeue",
            "slurm-init-seconds-before-status-checks": 2,
            "slurm-no-account": True,
            "slurm-keep-successful-logs": True,
            "group-components": [f"bundle={components}"],
            "retries": 0,
            "latency-wait": 5,
        }
    )
    profile["set-resources"]["group"].update(mem_mb=1000, cpus_per_task=1)
    profile["default-resources"] = ["mem_mb=1000", "runtime=10"]
    (root / "profile").mkdir()
    (root / "profile/config.yaml").write_text(yaml.safe_dump(profile))
    return root


def snakemake_cmd(project: Path, *args: str) -> list[str]:
    # Snakemake as `snakemake` runs it, with the SLURM plugin's pause between two squeue checks
    # capped at 2 s (it grows by 10 s a check, so each run's end was seen up to 1.5 min late):
    # tests/workflow/slurm_quick_poll.py says why that changes nothing these tests assert.
    return [
        sys.executable, str(QUICK_POLL), "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(project), "--profile", str(project / "profile"), *args,
    ]  # fmt: skip


def run(project: Path, *args: str, ok=True) -> str:
    proc = subprocess.run(
        snakemake_cmd(project, *args), capture_output=True, text=True, timeout=600
    )
    out = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == ok, out[-6000:]
    return out


def submitted(log: str, kind: str = "") -> list[str]:
    """SLURM job ids Snakemake submitted; ``kind``: 'group_bundle' for bundles only."""
    found = re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/(\w+)/", log)
    return [job for job, k in found if k.startswith(kind)]


def job_field(job: str, field: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", "-d", job], capture_output=True, text=True
    ).stdout
    m = re.search(rf"\b{field}=(\S+)", out)
    return m.group(1) if m else ""


def verify(project: Path) -> str:
    proc = subprocess.run(
        [str(BIN / "bestofn"), "verify", "results"], cwd=project, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def workers(project: Path) -> list[tuple]:
    """(slurm job, groups, model loads, idle fraction) per worker, from the throughput table."""
    con = duckdb.connect(str(project / "results/bestofn.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT slurm_job_id, groups, loads, idle_fraction FROM throughput "
        "WHERE level = 'worker' ORDER BY slurm_job_id"
    ).fetchall()
    con.close()
    return rows


def groups_by_job(project: Path) -> dict[str, int]:
    con = duckdb.connect(str(project / "results/bestofn.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT slurm_job_id, count(*) FROM throughput WHERE level = 'group' GROUP BY 1"
    ).fetchall()
    con.close()
    return dict(rows)


def published(project: Path) -> list[Path]:
    return sorted(p for p in (project / "results/groups").glob("*/*") if not p.name.startswith("."))


def hidden(project: Path, mark: str) -> list[Path]:
    return sorted((project / "results/groups").glob(f"*/.*{mark}*"))


def job_worker(project: Path, job: str, monkeypatch) -> dict | None:
    """Health of the warm worker of SLURM job ``job`` (its state dir is per job)."""
    with monkeypatch.context() as m:
        m.setenv("SLURM_JOB_ID", job)
        state = default_state_dir(project)
    return health(str(state / "slot0.sock"), timeout=2)


def wait_for(what: str, cond, timeout: float, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"snakemake exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def start(project: Path, log: Path, *args: str) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(snakemake_cmd(project, *args), stdout=f, stderr=subprocess.STDOUT)


def complete_hidden(project: Path, mark: str) -> list[Path]:
    return [p for p in hidden(project, mark) if (p / "scores.parquet").is_file()]


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller (as .ci/slurm-up.sh's node)


@contextlib.contextmanager
def cpu_capped(pid: int, fraction: float, name: str):
    """Process ``pid`` (every thread of it, and any child it starts) gets at most ``fraction``
    of one CPU while this lasts: a CFS quota on a cgroup of its own in the cpu controller. Only
    the speed changes: the process runs the same code, and SLURM still finds and signals it
    through its job's own (freezer) cgroup. Needs root, as the test cluster does."""
    group = CPU_CGROUP / name
    try:
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(round(100000 * fraction)))
        (group / "cgroup.procs").write_text(str(pid))
    except OSError as e:
        pytest.fail(f"could not cap the CPU of pid {pid} with the cgroup {group}: {e}")
    try:
        yield
    finally:
        for _ in range(50):  # whatever still runs in it goes back, then the group is removed
            for left in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (CPU_CGROUP / "cgroup.procs").write_text(left)
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@pytest.fixture(scope="module")
def time_limited(slurm, tmp_path_factory):
    """The run of test_time_limit_loses_at_most_the_group_in_flight up to its wait for the time
    limit: one bundle of 8 groups in one SLURM job whose TimeLimit is set to 1 minute once it
    runs, its worker CPU-capped once it has served a group. Started when the module starts (the
    scancel test asks for it first): slurmctld's kill comes 60-90 s after the job starts, and
    the scancel test runs on the node's other two fake GPUs meanwhile, instead of the module
    waiting for the two one after the other. Yields what the time-limit test checks."""
    # The limit must come while the worker still generates. slurmctld checks time limits every
    # 30 s: the job ends 60-90 s after it starts (60-87 s in this node's slurmctld.log). Once its
    # worker has finished a group, that worker runs on at most `cap` of one CPU (cpu_capped: the
    # same code, only slower), so how long the rest takes no longer hangs on how fast or how busy
    # the machine is: a group of 20 piper takes took 3.7-6 s uncapped and 66 s capped (~3.3 s of
    # CPU), so the 6 groups left after the one in flight need ~6 x 66 = 400 s, 4.4x the latest
    # kill (2.2x on a CPU twice as fast); 1 or 2 of 8 were done at the kill. Should the job ever
    # finish first, the test fails (JobState COMPLETED, or nothing left to rerun); it never
    # passes. The rerun runs uncapped (a new job, a new worker): there the groups' Snakemake
    # processes cost more than their takes, one per group, published or staged alike, hence
    # only 8 groups. (Uncapped, 16 groups of 100 takes had to outlast the kill on an idle
    # machine: 3.5 minutes alone, 5-8 on a loaded one, mostly the rerun's takes.)
    groups, takes, cap = 8, 20, 0.05
    tmp = tmp_path_factory.mktemp("time-limit")
    project = make_project(tmp / "p", ["calm", "happy"], prompts=4, components=groups)
    cfg = yaml.safe_load((project / "config/config.yaml").read_text())
    (project / "config/config.yaml").write_text(yaml.safe_dump({**cfg, "takes": takes}))
    log = tmp / "run1.log"
    t0 = time.monotonic()
    proc = start(project, log, "--until", "group")
    with contextlib.ExitStack() as capped, pytest.MonkeyPatch.context() as mp:
        try:
            job = wait_for("the sbatch job", lambda: submitted(log.read_text()), 120, proc)[0]
            wait_for(f"job {job} to run", lambda: job_field(job, "JobState") == "RUNNING", 60)
            # Its time limit becomes 1 minute: slurmctld ends it at its next check after that.
            subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=1"], check=True)
            health = wait_for(
                f"job {job} serving groups",
                lambda: (h := job_worker(project, job, mp)) and h["groups_served"] >= 1 and h,
                240, proc,
            )  # fmt: skip
            capped.enter_context(cpu_capped(health["pid"], cap, f"bestofn-test-slurm-job{job}"))
            yield SimpleNamespace(project=project, groups=groups, job=job, proc=proc, log=log,
                                  t0=t0, uncap=capped.close)  # fmt: skip
        finally:
            if proc.poll() is None:
                proc.kill()


def test_bundles_run_as_slurm_jobs_then_scancel_mid_group_and_rerun(
    slurm, time_limited, tmp_path, monkeypatch
):
    """2 emotions x 3 prompts in bundles of 3: two SLURM jobs with one GPU each, side by side on
    two of the node's three fake GPUs (the time-limit test's job, started by `time_limited`,
    which this test asks for only to start it, holds the third). One is scancelled mid-group;
    the other completes. The rerun completes with no half group and `bestofn verify` clean;
    every SLURM job's worker loaded the models once and served its whole bundle."""
    project = make_project(tmp_path / "p", ["calm", "happy"], prompts=3, components=3)
    # 6 takes a group: on an idle machine 2-take bundles could end before they were inspected.
    cfg = yaml.safe_load((project / "config/config.yaml").read_text())
    (project / "config/config.yaml").write_text(yaml.safe_dump({**cfg, "takes": 6}))
    log = tmp_path / "run1.log"
    proc = start(project, log)
    try:
        jobs = wait_for("two sbatch jobs", lambda: len(submitted(log.read_text())) == 2 and
                        submitted(log.read_text()), 120, proc)  # fmt: skip
        # Each job got one GPU of its own (the fake GRES devices of the test node), read while
        # the job runs (a finished job shows no GRES).
        gres = {}
        for job in jobs:
            wait_for(f"job {job} to run", lambda j=job: job_field(j, "JobState") == "RUNNING", 60)
            gres[job] = job_field(job, "GRES")
            assert job_field(job, "JOB_GRES") == "gpu:1"
        # one GPU each, not the same one (of the node's three: `time_limited`'s job holds
        # the third meanwhile)
        assert all(re.fullmatch(r"gpu:1\(IDX:[0-2]\)", g) for g in gres.values()), gres
        assert len(set(gres.values())) == 2, gres
        victim, survivor = jobs
        # Mid-group: the job's worker has finished a group and runs the next one.
        wait_for(
            f"job {victim} in the middle of a group",
            lambda: (h := job_worker(project, victim, monkeypatch))
            and h["groups_served"] >= 1 and h["busy"],
            240, proc,
        )  # fmt: skip
        subprocess.run(["scancel", victim], check=True)
        assert proc.wait(timeout=400) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert job_field(victim, "JobState") == "CANCELLED", log.read_text()[-3000:]
    assert job_field(survivor, "JobState") == "COMPLETED", log.read_text()[-3000:]
    # No half group: all that looks like a group is complete; the group in flight left only a
    # hidden partial directory, and finished groups not yet published wait, staged.
    for group in published(project):
        assert (group / "scores.parquet").is_file(), group
    assert len(hidden(project, ".partial-")) <= 1
    kept = len(published(project)) + len(complete_hidden(project, ".staged-"))

    second = run(project)
    reruns = submitted(second, "group_bundle")
    assert len(reruns) == 1, second[-3000:]  # one job for what the cancelled bundle left
    assert "6 groups checked, 0 problem(s)" in verify(project)
    assert not hidden(project, ".staged-")  # every staged group was claimed

    served = workers(project)
    print("\nSLURM job | groups served | model loads | idle fraction")
    for row in served:
        print(" | ".join(map(str, row)))
    by_job = {job: (n, loads) for job, n, loads, _ in served}
    assert by_job[survivor] == (3, 1), served  # its whole bundle, models loaded once
    assert by_job[reruns[0]][1] == 1, served
    assert by_job.get(victim, (0, 0))[0] == kept - 3, (served, kept)  # nothing it finished redone
    assert sum(n for n, _ in by_job.values()) == 6
    assert all(frac is not None and 0 <= frac < 1 for *_, frac in served)
    report = (project / "results/report/throughput.md").read_text()
    assert "## Workers" in report and f"| {survivor} | 3 | 1 |" in report


def test_time_limit_loses_at_most_the_group_in_flight(time_limited):
    """One bundle of 8 groups whose job hits its time limit (SIGTERM, then SIGKILL 5 s later)
    while its worker is still generating: every group the worker finished survives (published,
    or staged for the rerun); at most the group in flight is lost, and the rerun runs only what
    was not finished. The run up to the time limit: the `time_limited` fixture."""
    run1 = time_limited
    project, groups, job, log, t0 = run1.project, run1.groups, run1.job, run1.log, run1.t0
    assert run1.proc.wait(timeout=400) != 0
    run1.uncap()  # the capped worker is gone with its job; the rerun's worker runs uncapped
    t_killed = time.monotonic() - t0
    assert job_field(job, "JobState") == "TIMEOUT", log.read_text()[-3000:]
    for group in published(project):
        assert (group / "scores.parquet").is_file(), group
    in_flight = hidden(project, ".partial-")
    assert len(in_flight) <= 1, in_flight
    kept = len(published(project)) + len(complete_hidden(project, ".staged-"))
    assert 1 <= kept < groups, kept  # the limit came while the worker was still generating

    run(project, "--until", "group")
    assert f"{groups} groups checked, 0 problem(s)" in verify(project)
    assert not hidden(project, ".staged-")
    con = duckdb.connect()
    by_job = dict(
        con.execute(
            "SELECT slurm_job_id, count(DISTINCT group_id) FROM read_parquet(?) GROUP BY 1",
            [str(project / "results/groups/*/*/scores.parquet")],
        ).fetchall()
    )
    print(
        f"\ntime-limited job {job}: {kept} groups kept, {groups - kept} run again; {by_job}; "
        f"killed run {t_killed:.0f} s, rerun {time.monotonic() - t0 - t_killed:.0f} s"
    )
    # What the killed job finished was kept, not run again: those groups carry its job id.
    assert by_job.get(job, 0) == kept, (by_job, kept)
    assert sum(by_job.values()) == groups


# ---- the pieces, without a cluster -------------------------------------------------------


def test_worker_state_is_per_slurm_job_and_slots_follow_the_allocation(tmp_path, monkeypatch):
    from bestofn.worker.client.runtime import detect_slots

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    plain = default_state_dir(tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    job = default_state_dir(tmp_path)
    assert job.parent == plain.parent == Path(f"/tmp/bestofn-{os.getuid()}")
    assert job.name == f"{plain.name}-slurm123"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "2")
    assert detect_slots("cuda") == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # what SLURM sets for the job's GRES
    assert detect_slots("cuda") == 1
    assert detect_slots("cpu") == 1


def test_bundle_targets_from_the_jobs_snakemake_command_line():
    from bestofn.worker.client.slurm_feeder import parse_target_jobs

    argv = ["python", "-m", "snakemake", "--target-jobs", "group:emotion=calm,prompt_id=p1",
            "group:emotion=happy,prompt_id=p2.b", "database:", "--executor", "x"]  # fmt: skip
    assert parse_target_jobs(argv) == [("calm", "p1"), ("happy", "p2.b")]
    assert parse_target_jobs(["snakemake", "--cores", "1"]) == []


def test_claim_publishes_a_staged_group_with_its_final_paths(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bestofn.worker.client.slurm_feeder import claim, stage_key, staged_path

    out = tmp_path / "results/groups/calm/p1"
    key = stage_key('{"emotion": "calm", "prompt_id": "p1"}', '{"generator": {}}', "cpu", "PCM_16")
    staged = staged_path(out, key)
    assert staged.parent == out.parent and staged.name.startswith(".p1.staged-")
    (staged / "takes").mkdir(parents=True)
    (staged / "takes/000.flac").write_bytes(b"flac")
    rel = f"results/groups/calm/{staged.name}/takes/000.flac"
    pq.write_table(
        pa.table({"group_id": ["calm/p1"], "flac_path": [rel], "group_wall_s": [1.5]}),
        staged / "scores.parquet",
    )
    assert claim(out, tmp_path / "results/groups/calm/.p1.staged-other") is None
    answer = claim(out, staged)
    assert answer["claimed"] == staged.name and answer["timings"] == {"wall_s": 1.5}
    assert not staged.exists() and (out / "takes/000.flac").is_file()
    paths = pq.read_table(out / "scores.parquet").column("flac_path").to_pylist()
    assert paths == ["results/groups/calm/p1/takes/000.flac"]
