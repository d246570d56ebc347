"""The issue's measured case on the production backends: tiny fake weights with the generator's
model.safetensors cut short by 4 KiB. `bestofn check` names the file once the weights are
locked; without a lock, a run started anyway starts one worker (not one per group and retry)
and every group's error names the file."""

import importlib.util
import shutil

import pytest
from helpers import copy_fake_weights, snakemake

from bestofn.cli import main as bestofn
from bestofn.weights.lock import LOCK_NAME

pytestmark = [  # snakemake end to end on the production backends
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(importlib.util.find_spec(m) for m in ("transformers", "nemo")),
        reason="the production backends need transformers and nemo_toolkit[asr]",
    ),
]


def test_cut_generator_shard_is_named_and_the_run_stops_once(tiny_fake_weights, tmp_path, capsys):
    project = tmp_path / "project"
    weights = copy_fake_weights(tiny_fake_weights, tmp_path / "weights")  # a shard is cut below
    project.mkdir()
    shutil.copy(weights / "config.yaml", project / "config.yaml")
    shard = weights / "MOSS-TTS-Local-Transformer-v1.5/model.safetensors"
    assert bestofn(["weights", "lock", "--root", str(weights)]) == 0
    shard.write_bytes(shard.read_bytes()[:-4096])
    capsys.readouterr()
    assert bestofn(["check", "--config", str(project / "config.yaml"), "--base", str(project)]) == 2
    err = capsys.readouterr().err
    assert f"{shard}: " in err and "the lock" in err

    (weights / LOCK_NAME).unlink()  # nothing to compare with: the run starts
    proc = snakemake(project, "--configfile", str(project / "config.yaml"), check=False)
    assert proc.returncode != 0
    slot_log = (project / "results/logs/workers/slot0.log").read_text()
    assert slot_log.count("Traceback (most recent call last)") == 1, slot_log[-3000:]
    assert "incomplete metadata" in slot_log  # the loader's words, which name no file
    logs = {p: p.read_text() for p in (project / "results/logs/groups").rglob("*.log")}
    assert len(logs) == 4
    for text in logs.values():
        assert f"{shard}: " in text and "cut short" in text, text[-3000:]
