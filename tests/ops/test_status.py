"""`bestofn status`: a run's progress from the files it writes (never the database): published
groups, their finish times, the group logs' last attempts and the quarantine."""

import os
import subprocess
import time

import yaml
from helpers import BIN

from bestofn.core.plan import build_plan
from bestofn.ops.status import format_status, read_status


def publish(project, group, finished_ago_s):
    d = project / "results/groups" / group
    d.mkdir(parents=True)
    scores = d / "scores.parquet"
    scores.write_bytes(b"")
    t = time.time() - finished_ago_s
    os.utime(scores, (t, t))


def group_log(project, group, text):
    emotion, prompt_id = group.split("/")
    path = project / "results/logs/groups" / emotion / f"{prompt_id}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_status_counts_pace_eta_running_failed_and_quarantined(project):
    plan = build_plan(yaml.safe_load((project / "config/config.yaml").read_text()), project)
    publish(project, "calm/p1", finished_ago_s=70)
    publish(project, "calm/p2", finished_ago_s=10)  # 60 s apart, 2 takes each
    publish(project, "calm/p9", finished_ago_s=5)  # not in the plan: not counted
    group_log(project, "happy/p1", "x group happy/p1 failed\nRuntimeError: boom in scorer\n")
    group_log(project, "happy/p2", "x slot 0: worker pid 12 ready\n")
    group_log(project, "calm/p1", "x group calm/p1 failed\nRuntimeError: first try\n")  # redone
    (project / "results/quarantine/calm/p1").mkdir(parents=True)

    st = read_status(plan, project / "results")
    assert (st.planned, st.done, st.left) == (4, 2, 2)
    assert st.takes_per_s() == 2 / (st.finished[1] - st.finished[0])
    assert abs(st.takes_per_s() - 2 / 60) < 1e-3
    assert st.takes_per_s(window_s=30) is None  # one group in that window: no pace yet
    assert st.running == ["happy/p2"]
    assert st.failed == {"happy/p1": "RuntimeError: boom in scorer"}
    assert st.quarantined == 1

    text = format_status(st)
    assert "groups: 2 done, 2 left of 4 (50.0 %)" in text
    assert "takes/s: 0.03" in text and "eta: 2m00s for 4 takes at that pace" in text
    assert "running: 1 (happy/p2)" in text
    assert "failed: 1 " in text and "  happy/p1: RuntimeError: boom in scorer" in text
    assert "quarantined: 1" in text

    # the command: exit 1 while a group's last attempt failed; the database is never needed
    proc = subprocess.run([str(BIN / "bestofn"), "status"], cwd=project, capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode == 1 and "groups: 2 done, 2 left of 4" in proc.stdout, proc.stderr
    assert not (project / "results/bestofn.duckdb").exists()


def test_status_watch_returns_once_the_run_is_done(ran_project):
    proc = subprocess.run(
        [str(BIN / "bestofn"), "status", "--watch", "1"], cwd=ran_project, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "groups: 4 done, 0 left of 4 (100.0 %)" in proc.stdout
    assert "eta: done" in proc.stdout and "failed: 0" in proc.stdout
