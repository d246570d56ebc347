"""`bestofn doctor` on a CPU box: the GPU checks are skipped with the reason, the pilot runs one
real group through the warm worker, its timing lands where `bestofn plan` reads it, and nothing
is published under results/groups. The verdict rules for the CUDA build, the GPU memory need
and the disk, each against the figures the module names."""

import json
import subprocess

import pytest
import yaml
from helpers import BIN, REPO, tiny_config

from bestofn.cli import main as bestofn
from bestofn.core.config import load_config
from bestofn.core.plan import build_plan
from bestofn.ops import doctor


def run(project, *args):
    return subprocess.run(
        [str(BIN / "bestofn"), *args], cwd=project, capture_output=True, text=True, timeout=600
    )


def test_doctor_on_cpu_then_plan_reads_the_pilot(project):
    try:
        proc = run(project, "doctor", "--config", "config/config.yaml")
    finally:
        run(project, "workers", "stop")  # the pilot's worker stays warm for a run otherwise
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "skipped  torch CUDA build vs driver: no CUDA device" in out
    assert "skipped  GPU memory: no CUDA device" in out
    assert "ok       pilot: 1 group(s) of 2 takes, one per slot" in out
    assert "ok       disk (pilot):" in out and "doctor: ready" in out
    record = json.loads((project / "results/doctor.json").read_text())
    pilot = record["pilot"]
    assert (pilot["groups"], pilot["takes"], pilot["device"]) == (1, 2, "cpu")
    assert pilot["wall_s"] > 0 and pilot["flac_bytes"] > 0
    [group] = pilot["runs"]
    assert len(list((project / group["out"] / "takes").glob("*.flac"))) == 2
    assert (project / group["out"] / "scores.parquet").is_file()
    assert not (project / "results/groups").exists()  # the pilot is no published group

    plan = run(project, "plan")
    assert plan.returncode == 0, plan.stderr
    s_per_take = pilot["wall_s"] / pilot["takes"]
    assert f"{s_per_take:.4f} s/take per slot" in plan.stdout
    assert "wall-clock:" in plan.stdout and "from the doctor pilot: " in plan.stdout


def test_a_failed_check_skips_the_pilot_and_fails_the_doctor(project, monkeypatch, capsys):
    monkeypatch.setattr(doctor, "_free_bytes", lambda path: 1000)
    monkeypatch.chdir(project)
    assert bestofn(["doctor", "--config", "config/config.yaml"]) == 1
    out = capsys.readouterr().out
    assert "fail     disk: 0.0 MiB free under results" in out
    assert "skipped  pilot: a check above failed" in out
    assert "doctor: FAIL: disk" in out
    assert not (project / "results/doctor").exists()
    record = json.loads((project / "results/doctor.json").read_text())
    assert record["pilot"] is None  # plan falls back to another source


@pytest.mark.parametrize(
    "built, driver, verdict",
    [
        ("12.4", (12, 8), "ok"),
        ("12.4", (12, 4), "ok"),
        ("12.8", (12, 4), "warn"),  # minor version compatibility
        ("12.4", (11, 8), "fail"),
        (None, (12, 8), "fail"),  # a CPU build of torch
        ("12.4", None, "fail"),  # no driver
    ],
)
def test_cuda_build_against_the_driver(monkeypatch, built, driver, verdict):
    import torch

    monkeypatch.setattr(torch.version, "cuda", built)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(doctor, "driver_cuda_version", lambda: driver)
    check = doctor.cuda_build_check("cuda")
    assert check.verdict == verdict, check.detail
    assert doctor.cuda_build_check("cpu").verdict == "skipped"


def test_memory_need_is_the_measured_peak_or_the_cap():
    config = load_config(REPO / "config/recipes/base.yaml")
    assert doctor.memory_need(config)[0] == 73.5  # pair_groups: true in the measured set
    config["models"]["generator"]["runtime"]["pair_groups"] = False
    assert doctor.memory_need(config)[0] == 52.4
    config["runtime"]["gpu_memory_gb"] = 40
    assert doctor.memory_need(config) == (40.0, "the config's cap runtime.gpu_memory_gb")
    assert doctor.memory_need(tiny_config()) is None  # piper: no measured figure


def test_output_estimate_names_its_assumptions(project):
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config["flac_subtype"] = "PCM_24"
    plan = build_plan(config, project)
    nbytes, how = doctor.output_estimate(plan, sorted(plan.groups))
    words = 2 * (4 + 4) * 2  # 2 emotions x (4 + 4 words) x 2 takes
    assert nbytes == pytest.approx(words / 2.5 * 48000 * 1 * 3 * 0.6)
    for named in ("words/s (assumed)", "channel (assumed)", "FLAC ratio 0.6 (assumed)"):
        assert named in how
