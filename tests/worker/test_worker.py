"""Warm workers on CPU slots with the embedded backends (issue: fused worker per GPU)."""

import io
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import duckdb
import pytest
import soundfile as sf
import yaml
from helpers import BIN, REPO, gone, snakemake, verify, write_tsv

from bestofn.core.pipeline import stable_hash
from bestofn.worker.client.group_job import _read_pid, ensure_worker, health
from bestofn.worker.client.runtime import Runtime, SlotPool
from bestofn.worker.uds_http import request

pytestmark = pytest.mark.slow  # workers started, killed and reaped; snakemake through them

MODELS = {"generator": {"backend": "piper"}, "scorers": [{"backend": "duration"}]}


@pytest.fixture
def pool(tmp_path):
    pool = SlotPool(tmp_path / "state", slots=1, queue_depth=2, device="cpu")
    yield pool
    pid = _read_pid(pool.pidfile(0))
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start(pool, tmp_path, models=MODELS, idle=60.0):
    rt = Runtime(idle_timeout_s=idle, start_timeout_s=120)
    return ensure_worker(pool, 0, models, tmp_path / "results", rt, tmp_path / "logs")


def test_socket_is_owner_only_and_speech_endpoint_renders(pool, tmp_path):
    h = start(pool, tmp_path)
    assert h["load_count"] == 1 and h["models_hash"] == stable_hash(MODELS)
    mode = os.stat(pool.socket(0)).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert stat.S_IMODE(os.stat(pool.dir).st_mode) == 0o700

    for fmt in ("wav", "flac"):
        status, body, ctype = request(
            pool.socket(0), "POST", "/v1/audio/speech",
            {"model": "piper", "input": "Hello there.", "voice": "default", "response_format": fmt},
        )  # fmt: skip
        assert status == 200 and ctype == f"audio/{fmt}"
        audio, sr = sf.read(io.BytesIO(body))
        assert sr == 22050 and len(audio) > sr // 4


@pytest.mark.parametrize(
    "url, body, status, reason",
    [
        ("/v1/audio/speech", {"input": ""}, 400, "non-empty"),
        ("/v1/audio/speech", {"input": "Hi.", "response_format": "mp3"}, 400, "mp3"),
        ("/v1/audio/speech", {"input": "Hi.", "model": "gpt-4o-mini-tts"}, 400, "not served"),
        ("/v1/groups", {"spec": {"emotion": "x"}, "models_hash": None}, 409, "request wants"),
        ("/v1/nope", {}, 404, "no such endpoint"),
    ],
)
def test_bad_requests_get_4xx_and_worker_keeps_serving(pool, tmp_path, url, body, status, reason):
    h = start(pool, tmp_path)
    got, answer, _ = request(pool.socket(0), "POST", url, body)
    assert got == status and reason in answer["error"]
    after = health(pool.socket(0))
    assert after["pid"] == h["pid"] and after["status"] == "ok"


def test_malformed_json_and_paths_outside_results(pool, tmp_path):
    h = start(pool, tmp_path)
    from bestofn.worker.uds_http import UnixHTTPConnection

    conn = UnixHTTPConnection(pool.socket(0), timeout=10)
    conn.request("POST", "/v1/groups", body=b"{not json", headers={"Content-Length": "9"})
    resp = conn.getresponse()
    assert resp.status == 400 and b"not JSON" in resp.read()
    conn.close()

    spec = {"emotion": "calm", "prompt_id": "p1", "text": "Hi.", "n_takes": 1}
    for out in ("/etc/evil", str(tmp_path / "results/../escape")):
        got, answer, _ = request(
            pool.socket(0), "POST", "/v1/groups",
            {"spec": spec, "out": out, "worker_key": h["worker_key"]},
        )  # fmt: skip
        assert got == 403 and "outside the results directory" in answer["error"]
    assert not (tmp_path / "escape").exists()


def test_config_change_replaces_worker(pool, tmp_path):
    first = start(pool, tmp_path)
    other = {**MODELS, "generator": {"backend": "piper", "options": {"noise_scale": 0.5}}}
    second = start(pool, tmp_path, models=other)
    assert second["pid"] != first["pid"]
    assert second["models_hash"] == stable_hash(other)
    assert gone(first["pid"])


def test_idle_worker_exits_by_itself(pool, tmp_path):
    h = start(pool, tmp_path, idle=1.0)
    assert gone(h["pid"], timeout=30)
    assert not Path(pool.socket(0)).exists()


def test_killed_client_does_not_wedge_worker(pool, tmp_path):
    h = start(pool, tmp_path)
    (tmp_path / "results").mkdir(exist_ok=True)
    spec = {"emotion": "calm", "prompt_id": "p1", "text": "One two three four five.", "n_takes": 3}
    body = json.dumps(
        {"spec": spec, "out": str(tmp_path / "results/groups/calm/p1"),
         "worker_key": h["worker_key"]}
    )  # fmt: skip
    script = (
        "import sys; from bestofn.worker.uds_http import request; "
        f"request({pool.socket(0)!r}, 'POST', '/v1/groups', {body})"
    )
    client = subprocess.Popen([str(BIN / "python"), "-c", script])
    time.sleep(0.5)
    client.kill()
    client.wait()
    deadline = time.time() + 60
    while (
        time.time() < deadline and not (tmp_path / "results/groups/calm/p1/scores.parquet").exists()
    ):
        time.sleep(0.2)
    h2 = health(pool.socket(0))
    assert h2["pid"] == h["pid"] and h2["groups_served"] == 1
    status, _, _ = request(pool.socket(0), "POST", "/v1/audio/speech", {"input": "Still here."})
    assert status == 200


def six_group_project(project: Path, slots: int) -> None:
    write_tsv(
        project / "config/prompts.tsv",
        ["prompt_id", "text"],
        [["p1", "Good morning."], ["p2", "It is nine."], ["p3", "See you soon, friend."]],
    )
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config["runtime"] = {"slots": slots, "queue_depth": 2, "idle_timeout_s": 120}
    (project / "config/config.yaml").write_text(yaml.safe_dump(config))


def per_group(project: Path):
    con = duckdb.connect(str(project / "results/bestofn.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT group_id, any_value(worker_slot), any_value(worker_pid), any_value(group_load_s) "
        "FROM takes GROUP BY 1 ORDER BY 1"
    ).fetchall()
    con.close()
    return rows


def test_six_groups_two_slots_models_load_once_per_worker(project):
    six_group_project(project, slots=2)
    snakemake(project, "--resources", "group_slots=4")
    rows = per_group(project)
    assert len(rows) == 6
    slots = {r[1] for r in rows}
    assert slots == {0, 1}, rows  # groups spread over both slots
    pids_by_slot = {s: {r[2] for r in rows if r[1] == s} for s in slots}
    assert all(len(p) == 1 for p in pids_by_slot.values()), pids_by_slot  # one worker per slot
    assert len({r[2] for r in rows}) == 2
    # Model load is charged once per worker (its first group), never per group.
    assert sorted(r[3] > 0 for r in rows) == [False] * 4 + [True] * 2
    logs = project / "results/logs/workers"
    for slot in (0, 1):
        assert (logs / f"slot{slot}.log").read_text().count("models loaded") == 1
    report = (project / "results/report/throughput.md").read_text()
    assert "| load |" in report and "| idle |" in report


def test_worker_sigkill_mid_group_is_retried_and_completes(project):
    six_group_project(project, slots=1)
    cmd = [
        str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(project), "--profile",
        str(REPO / "profiles/local"), "--retries", "2",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    from bestofn.worker.client.runtime import default_state_dir

    pool = SlotPool(default_state_dir(project), 1, 2, "cpu")
    killed = None
    deadline = time.time() + 240
    while time.time() < deadline and killed is None and proc.poll() is None:
        h = health(pool.socket(0), timeout=1)
        if h and h["busy"] and h["groups_served"] >= 1:
            os.kill(h["pid"], signal.SIGKILL)
            killed = h["pid"]
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=600)
    assert killed, "never saw the worker busy with a group"
    assert proc.returncode == 0, out[-4000:]
    logs = "\n".join(p.read_text() for p in (project / "results/logs/groups").rglob("*.log"))
    assert f"worker pid {killed} on slot 0 died while running" in logs + out
    assert "6 groups checked, 0 problem(s)" in verify(project)
    # a fresh worker took over. The killed one's finished groups may carry its pid, or not: a
    # group published just before the kill, whose answer never reached its job, is run again
    # (the same takes) by the fresh worker.
    assert {r[2] for r in per_group(project)} - {killed}


def test_gpu_slots_follow_cuda_visible_devices(tmp_path, monkeypatch):
    from bestofn.worker.client.runtime import detect_slots

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")  # e.g. what a SLURM allocation exposes
    assert detect_slots("cuda") == 2
    assert detect_slots("cpu") == 1
    pool = SlotPool(tmp_path / "gpu", slots=2, queue_depth=2, device="cuda")
    assert [pool.cuda_visible(k) for k in range(2)] == ["2", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    pool = SlotPool(tmp_path / "gpu8", slots=8, queue_depth=2, device="cuda")
    assert [pool.cuda_visible(k) for k in range(8)] == [str(k) for k in range(8)]


def test_places_spread_over_slots_before_queueing(tmp_path):
    pool = SlotPool(tmp_path / "places", slots=2, queue_depth=2, device="cpu")
    with pool.place() as a, pool.place() as b, pool.place() as c, pool.place() as d:
        assert [a, b, c, d] == [0, 1, 0, 1]  # q0 of every slot first, then q1
