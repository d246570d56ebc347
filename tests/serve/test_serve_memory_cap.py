"""runtime.gpu_memory_gb: the worker's GPU memory cap (bestofn.util.gpu_memory). The CUDA calls
are replaced by a stand-in device here (no GPU on the test machine); the CPU path is run for
real, through `bestofn serve` and its worker."""

from __future__ import annotations

import logging

import pytest
import torch
import yaml
from helpers import Server, make_project, speak, tiny_config, write_tsv

from bestofn.core.plan import PlanError, build_plan
from bestofn.util import gpu_memory

GIB = 2**30


class FakeCuda:
    """torch.cuda as far as apply_cap uses it: one device of ``total_gb`` GiB."""

    def __init__(self, monkeypatch, total_gb: float):
        self.calls: list[tuple[float, int]] = []
        props = type("Props", (), {"total_memory": int(total_gb * GIB)})()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
        monkeypatch.setattr(
            torch.cuda, "set_per_process_memory_fraction", lambda f, i: self.calls.append((f, i))
        )


def test_a_cap_sets_the_memory_fraction_of_the_workers_device(monkeypatch):
    cuda = FakeCuda(monkeypatch, total_gb=80)
    got = gpu_memory.apply_cap(8, "cuda:0")
    assert cuda.calls == [(pytest.approx(0.1), 0)]
    assert got["gb"] == 8 and got["fraction"] == pytest.approx(0.1) and got["total_gb"] == 80
    assert gpu_memory.apply_cap("12.5", "cuda:1")["gb"] == 12.5 and cuda.calls[-1][1] == 1
    assert gpu_memory.apply_cap(None, "cuda:0") is None and len(cuda.calls) == 2


def test_a_cap_larger_than_the_device_is_refused(monkeypatch):
    cuda = FakeCuda(monkeypatch, total_gb=7.5)
    with pytest.raises(ValueError, match=r"runtime.gpu_memory_gb = 8 GiB is more than cuda:0 has"
                       r" \(7.50 GiB\)"):  # fmt: skip
        gpu_memory.apply_cap(8, "cuda:0")
    assert cuda.calls == []


@pytest.mark.parametrize("bad", [0, -1, "8GB", float("nan"), float("inf")])
def test_a_cap_that_is_not_a_positive_number_is_refused(bad):
    with pytest.raises(ValueError, match="runtime.gpu_memory_gb"):
        gpu_memory.parse_cap(bad)


def test_on_a_cpu_the_cap_is_ignored_with_a_log_line(monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda *a: calls.append(a))
    with caplog.at_level(logging.INFO, logger="bestofn.util.gpu_memory"):
        assert gpu_memory.apply_cap(8, "cpu") is None
    assert calls == [] and "gpu_memory_gb = 8 ignored" in caplog.text


def test_the_config_field_is_checked_before_anything_runs(tmp_path):
    write_tsv(tmp_path / "e.tsv", ["emotion", "description"], [["calm", "A calm voice."]])
    write_tsv(tmp_path / "p.tsv", ["prompt_id", "text"], [["p1", "Hello."]])
    config = tiny_config(runtime={"gpu_memory_gb": -1})
    config.update(emotions="e.tsv", prompts="p.tsv")
    with pytest.raises(PlanError, match="config field runtime.gpu_memory_gb"):
        build_plan(config, tmp_path)
    config["runtime"]["gpu_memory_gb"] = 8
    assert build_plan(config, tmp_path).config["runtime"]["gpu_memory_gb"] == 8


def test_serve_passes_the_cap_to_its_worker_which_ignores_it_on_a_cpu(tmp_path):

    root = make_project(tmp_path, gpu_memory_gb=8)
    assert yaml.safe_load((root / "config/config.yaml").read_text())["runtime"]["gpu_memory_gb"]
    srv = Server(root)
    try:
        assert speak(srv.client(), "Good morning.")[:4] == b"RIFF"
        h = srv.health()
        assert h["worker"]["device"] == "cpu" and h["worker"]["gpu_memory_cap"] is None
        log = "".join(p.read_text() for p in (root / "results/logs/workers").glob("*.log"))
        assert "runtime.gpu_memory_gb = 8 ignored: the worker runs on cpu" in log
    finally:
        srv.close()
