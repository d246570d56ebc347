"""The worker contract: one spec (models, device, flac_subtype, results dir) decides reuse; a
worker never serves after a fatal device error; flac_path is relative to the workdir."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import BIN, gone, snakemake, verify

from bestofn.worker import key as contract
from bestofn.worker.client.group_job import _read_pid, ensure_worker, health
from bestofn.worker.client.runtime import Runtime, SlotPool
from bestofn.worker.lifecycle import fatal_device_error
from bestofn.worker.uds_http import request

pytestmark = pytest.mark.slow  # workers started, killed and reaped; snakemake through them

SCRIPTED = {"backend": "lab.faults:ScriptedGenerator", "options": {"seconds": 0.4}}
FAULT = "lab.faults:FatalOnceScorer"
SPEC = {"emotion": "calm", "prompt_id": "p1", "text": "Good morning to you.", "n_takes": 2}


def models(**fault) -> dict:
    scorers = [{"backend": "duration"}]
    if fault:
        scorers.append({"backend": FAULT, "options": fault})
    return {"generator": SCRIPTED, "scorers": scorers}


@pytest.fixture
def pools(tmp_path):
    made = []

    def make(device="cpu"):
        made.append(SlotPool(tmp_path / "state", slots=1, queue_depth=2, device=device))
        return made[-1]

    yield make
    if made:
        pid = _read_pid(made[0].pidfile(0))
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start(pool, tmp_path, mdl, results="results", flac_subtype="PCM_16", **runtime):
    rt = Runtime(**{"idle_timeout_s": 60, "start_timeout_s": 120, **runtime})
    return ensure_worker(
        pool, 0, mdl, (tmp_path / results).resolve(), rt, tmp_path / "logs", flac_subtype
    )


def post_group(pool, h, out, spec=SPEC):
    body = {"spec": spec, "out": str(out), "worker_key": h["worker_key"], "workdir": "."}
    return request(pool.socket(0), "POST", "/v1/groups", body, timeout=120)


def test_fatal_device_errors_are_told_from_recoverable_ones():
    import torch

    fatal = [
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("CUDA error: device-side assert triggered\nCUDA kernel errors might be"),
        RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"),
        RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`"),
        RuntimeError("[ONNXRuntimeError] : 1 : FAIL : CUDA failure 700: an illegal memory access"),
        torch.AcceleratorError("CUDA error: unspecified launch failure"),
    ]
    for e in fatal:
        assert fatal_device_error(e), e
    try:  # wrapped by a library: the cause decides
        try:
            raise RuntimeError("CUDA error: misaligned address")
        except RuntimeError as inner:
            raise ValueError("decoding failed") from inner
    except ValueError as wrapped:
        assert "misaligned address" in fatal_device_error(wrapped)
    recoverable = [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: out of memory"),
        ValueError("bad option"),
        RuntimeError("scorer 'x' returned no column 'y'"),
    ]
    for e in recoverable:
        assert fatal_device_error(e) is None, e


def test_fatal_error_fails_the_group_and_the_worker_exits(pools, tmp_path):
    pool = pools()
    marker = tmp_path / "fault.marker"
    h = start(pool, tmp_path, models(marker=str(marker), group="calm/p1"))
    out = tmp_path / "results/groups/calm/p1"
    status, answer, _ = post_group(pool, h, out)
    assert status == 500 and answer["worker_exiting"] is True
    assert "illegal memory access" in answer["fatal"]
    assert "worker is exiting" in answer["error"]
    assert "a retry gets a fresh worker" in answer["error"]
    assert json.loads(marker.read_text())["pid"] == h["pid"]
    assert gone(h["pid"], timeout=40), "the worker kept running after a fatal device error"
    assert not out.exists() and not list(out.parent.glob(".*"))  # nothing published
    assert not Path(pool.socket(0)).exists()
    log = (tmp_path / "logs/slot0.log").read_text()
    assert f"worker pid {h['pid']} exited after a fatal device error" in log
    # the slot's next group gets a fresh worker, which runs the group (the marker now exists)
    h2 = start(pool, tmp_path, models(marker=str(marker), group="calm/p1"))
    assert h2["pid"] != h["pid"] and h2["status"] == "ok"
    status, _, _ = post_group(pool, h2, out)
    assert status == 200
    assert set(pq.read_table(out / "scores.parquet").column("worker_pid").to_pylist()) == {
        h2["pid"]
    }


def test_out_of_memory_fails_the_group_but_the_worker_keeps_serving(pools, tmp_path):
    pool = pools()
    h = start(pool, tmp_path, models(marker=str(tmp_path / "m"), error="oom"))
    out = tmp_path / "results/groups/calm/p1"
    status, answer, _ = post_group(pool, h, out)
    assert status == 500 and "CUDA out of memory" in answer["error"] and not answer.get("fatal")
    again = health(pool.socket(0))
    assert again["pid"] == h["pid"] and again["status"] == "ok"
    status, _, _ = post_group(pool, h, out)
    assert status == 200 and (out / "scores.parquet").is_file()


CHANGES = {  # a spec change: start()'s arguments, and (spec field, its new value)
    "device": ({}, ("device", "cpu:0")),
    "flac_subtype": ({"flac_subtype": "PCM_24"}, ("flac_subtype", "PCM_24")),
    "results": ({"results": "elsewhere"}, ("results_dir", "elsewhere")),
    # runtime options the worker serves with (a long-lived `bestofn serve` must not keep old
    # ones after its config changed)
    "overlap": ({"overlap": "off"}, ("serving", "overlap", "off")),
    "generate_priority": (
        {"experimental": {"generate_priority": "high"}},
        ("serving", "generate_priority", "high"),
    ),
    "experimental overlap": ({"experimental": {"overlap": "host"}}, ("serving", "overlap", "host")),
    "gpu_memory_gb": ({"gpu_memory_gb": 512.0}, ("serving", "gpu_memory_gb", 512.0)),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_any_spec_change_replaces_the_worker(pools, tmp_path, change, caplog):
    first = start(pools(), tmp_path, models())
    kwargs, want = CHANGES[change]
    pool = pools("cpu:0" if change == "device" else "cpu")
    with caplog.at_level("INFO", logger="bestofn.client"):
        second = start(pool, tmp_path, models(), **kwargs)
    assert second["pid"] != first["pid"] and second["worker_key"] != first["worker_key"]
    assert gone(first["pid"])
    if want[0] == "serving":
        assert second["spec"]["serving"][want[1]] == want[2]
        assert f"runtime.{want[1]} " in caplog.text  # the log says which option changed
    elif change == "results":
        assert second["spec"]["results_dir"] == str((tmp_path / "elsewhere").resolve())
    else:
        assert second["spec"][want[0]] == want[1]
    # the same spec again: the warm worker is reused
    assert start(pool, tmp_path, models(), **kwargs)["pid"] == second["pid"]
    # a request made for the old spec is refused, not served with the wrong settings
    status, answer, _ = post_group(pool, first, tmp_path / "results/groups/calm/p1")
    assert status == 409 and "request wants" in answer["error"]


def test_a_worker_running_other_code_is_replaced(pools, tmp_path, monkeypatch, caplog):
    # What an upgrade (or an edited checkout) looks like to the group job: its own code's
    # identity differs from the warm worker's.
    first = start(pools(), tmp_path, models())
    assert first["spec"]["code"] == contract.code_identity()
    monkeypatch.setattr(contract, "code_identity", lambda: "0" * 16)
    with caplog.at_level("INFO", logger="bestofn.client"):
        second = start(pools(), tmp_path, models())
    assert second["pid"] != first["pid"] and gone(first["pid"])
    assert "spec differs: code " in caplog.text
    assert start(pools(), tmp_path, models())["pid"] == second["pid"]  # same code: reused


def test_the_code_digest_follows_the_package_files_not_their_byte_code(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub/__pycache__").mkdir(parents=True)
    (pkg / "a.py").write_text("A = 1\n")
    (pkg / "sub/b.sql").write_text("SELECT 1\n")
    before = contract.tree_digest(pkg)
    (pkg / "sub/__pycache__/b.cpython-312.pyc").write_bytes(b"\0" * 8)
    (pkg / ".cache").mkdir()
    (pkg / ".cache/lock").write_text("1")
    assert contract.tree_digest(pkg) == before
    (pkg / "sub/b.sql").write_text("SELECT 2\n")
    edited = contract.tree_digest(pkg)
    assert edited != before
    (pkg / "sub/b.sql").rename(pkg / "b.sql")  # the same bytes under another name
    assert contract.tree_digest(pkg) not in (before, edited)
    assert contract.code_identity() == contract.tree_digest(contract.PACKAGE)


def write_config(project: Path, mdl: dict, **extra) -> None:
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config["models"] = mdl
    config.update(extra)
    (project / "config/config.yaml").write_text(yaml.safe_dump(config))


def per_group_pids(db: Path) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT group_id, any_value(worker_pid) FROM takes GROUP BY 1").fetchall()
    con.close()
    return dict(rows)


def test_fatal_error_through_snakemake_retry_runs_on_a_fresh_worker(project):
    marker = project / "fault.marker"
    write_config(project, models(marker=str(marker), group="calm/p1"))
    proc = snakemake(project)  # profiles/local: retries 1
    failed = json.loads(marker.read_text())
    assert failed["group_id"] == "calm/p1"
    pids = per_group_pids(project / "results/bestofn.duckdb")
    assert sorted(pids) == ["calm/p1", "calm/p2", "happy/p1", "happy/p2"]
    assert pids["calm/p1"] != failed["pid"], "the retry went back to the worker that failed"
    assert not os.path.exists(f"/proc/{failed['pid']}")
    log = (project / "results/logs/workers/slot0.log").read_text()
    assert f"worker pid {failed['pid']} exited after a fatal device error" in log
    group_logs = "\n".join(p.read_text() for p in (project / "results/logs").rglob("*.log"))
    assert f"worker pid {failed['pid']} on slot 0 hit a fatal device error" in (
        group_logs + proc.stdout + proc.stderr
    )
    out = verify(project)
    assert "4 groups checked, 0 problem(s)" in out and "partial" not in out


def test_flac_path_is_relative_and_a_moved_results_dir_verifies(project, tmp_path_factory):
    write_config(project, models())
    snakemake(project)
    rows = pq.read_table(project / "results/groups/calm/p1/scores.parquet").to_pylist()
    assert [r["flac_path"] for r in rows] == [
        "results/groups/calm/p1/takes/000.flac",
        "results/groups/calm/p1/takes/001.flac",
    ]
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    shutil.move(str(project / "results"), str(elsewhere / "results"))
    shutil.rmtree(project)  # nothing of the old working directory is left to resolve against
    proc = subprocess.run(
        [str(BIN / "bestofn"), "verify", "results"], cwd=elsewhere, capture_output=True, text=True
    )
    assert proc.returncode == 0 and "4 groups checked, 0 problem(s)" in proc.stdout, proc.stdout
    con = duckdb.connect(str(elsewhere / "results/bestofn.duckdb"), read_only=True)
    paths = [r[0] for r in con.execute("SELECT flac_path FROM selection").fetchall()]
    takes = con.execute("SELECT count(*) FROM takes WHERE flac_path LIKE '/%'").fetchone()[0]
    con.close()
    assert len(paths) == 4 and takes == 0
    assert all((elsewhere / p).is_file() for p in paths)
