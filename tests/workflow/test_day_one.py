"""A team's first day on a GPU box, on a CPU with tiny random weights in the published layouts,
end to end through the commands a user types (the README's "Production in three commands" run
as written, in a workflow directory that is a checkout: Snakefile, workflow/, profiles/):

1. fetch the weights the config uses into its ``weights_root`` and lock them (the README's first
   command);
2. ``bestofn check``, ``bestofn doctor`` (the second);
3. ``bestofn plan``: a wall-clock estimate before any group ran (from the doctor's pilot);
4. the profile's ``snakemake`` (the third), on the worker the doctor left warm, then
   ``bestofn status``;
5. the weights moved and ``weights_root`` changed: a dry run plans no group;
6. one weight file's bytes changed: a file no group reads plans no group again; a file every
   group reads (the VoiceCLAP blend head) plans exactly those groups again, once relocked (the
   lock refuses it by name first).

2 groups x 2 takes. The production models' random weights are written by ``bestofn fake-weights``
(the session's tree, conftest.py) into the folder the fetch reads from."""

import importlib.util
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import BIN, REPO, Hub
from readme_snippets import code_blocks

from bestofn.worker.client.group_job import stop_all
from bestofn.worker.client.runtime import default_state_dir

pytestmark = [  # snakemake end to end on the production backends
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(importlib.util.find_spec(m) for m in ("transformers", "nemo")),
        reason="the production backends need transformers and nemo_toolkit[asr]",
    ),
]
CONFIG = "config/recipes/emotions.yaml"  # the README's config path, here the tiny weights' config


def readme_commands() -> list[list[str]]:
    """The README's production block: its three command lines, each split at ``&&``."""
    [block] = code_blocks(REPO / "README.md", "Production in three commands")
    lines = [ln for ln in block.code.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(lines) == 3, lines
    return [[shlex.split(part) for part in ln.split("&&")] for ln in lines]


def run(project: Path, argv: list[str], env: dict | None = None, ok: bool = True):
    tool = {"bestofn": BIN / "bestofn", "snakemake": BIN / "snakemake"}[argv[0]]
    proc = subprocess.run(
        [str(tool), *argv[1:]], cwd=project, capture_output=True, text=True, timeout=900,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    if ok and proc.returncode != 0:
        raise AssertionError(f"{argv} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def planned_groups(project: Path) -> int:
    proc = run(project, ["snakemake", "-n", "--quiet", "rules", "--profile", "profiles/a100x8",
                         "--configfile", CONFIG])  # fmt: skip
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "group":
            return int(parts[1])
    return 0


def checkout(project: Path, hub: Path) -> None:
    """A workflow directory as a user has it, and the production config of the tiny weights
    with every model path relative to ``weights_root: weights``; 2 emotions x 1 prompt."""
    (project / "config/voices").mkdir(parents=True)
    (project / CONFIG).parent.mkdir(parents=True)
    for name in ("Snakefile", "workflow", "profiles"):
        (project / name).symlink_to(REPO / name)
    shutil.copy(hub / "joe_reference.flac", project / "config/voices/ref.flac")
    # both emotions (calm has a voice), one prompt: the config's reward `emo` compares each
    # group's own Empathic-Insight head with the other emotion's (ei_spec needs two)
    emotions = (hub / "emotions.tsv").read_text()
    emotions = emotions.replace(str(hub / "joe_reference.flac"), "config/voices/ref.flac")
    (project / "config/emotions.tsv").write_text(emotions)
    header, first = (hub / "prompts.tsv").read_text().splitlines()[:2]
    (project / "config/prompts.tsv").write_text(f"{header}\n{first}\n")
    text = (hub / "config.yaml").read_text().replace(f'"{hub}/', '"')
    config = yaml.safe_load(text)
    config.update(emotions="config/emotions.tsv", prompts="config/prompts.tsv", takes=2,
                  weights_root="weights")  # fmt: skip
    (project / CONFIG).write_text(yaml.safe_dump(config))


def hub_repos(hub: Path) -> dict[str, dict[str, bytes]]:
    """repo -> {path: bytes} for every manifest entry: the files of its folder in ``hub`` (the
    fake weights) that its allow patterns take; a repo the fake weights lack is served empty."""
    from fnmatch import fnmatch

    from bestofn.weights.manifest import MANIFEST

    repos = {}
    for e in MANIFEST:
        folder = hub / e.folder
        files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
        rels = [p.relative_to(folder).as_posix() for p in files]
        repos[e.repo_id] = {
            r: (folder / r).read_bytes()
            for r in rels
            if any(fnmatch(r, a) for a in e.allow_patterns)
        }
    return repos


def fetch(project: Path, hub: Path, argv: list[str]) -> None:
    """The README's fetch command, through huggingface_hub, against the weights' own hub
    stand-in on loopback (tests/helpers.py) serving the fake weights."""
    from http.server import ThreadingHTTPServer
    from threading import Thread

    from bestofn.weights.manifest import MANIFEST

    # a repo the manifest pins to a commit is served at that commit, as the real hub has it
    Hub.serving(hub_repos(hub), heads={e.repo_id: e.revision for e in MANIFEST if e.pinned})
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    Thread(target=server.serve_forever, daemon=True).start()
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
           "HF_HOME": str(project.parent / "hf-home"), "HF_HUB_OFFLINE": "0"}  # fmt: skip
    try:
        run(project, argv, env=env)
    finally:
        server.shutdown()


def test_day_one(tiny_fake_weights, tmp_path):
    # the hub serves the session's `bestofn fake-weights --size tiny` tree (read only: the
    # fetch copies it into the project)
    hub, project = tiny_fake_weights, tmp_path / "project"
    checkout(project, hub)
    (fetch_cmd, doctor, snakemake) = readme_commands()
    assert fetch_cmd[0] == ["bestofn", "weights", "fetch", "--config", CONFIG]
    assert doctor[0] == ["bestofn", "doctor", "--config", CONFIG]
    assert snakemake[0][:2] == ["snakemake", "--profile"] and snakemake[0][-2:] == [
        "--configfile", CONFIG,
    ]  # fmt: skip

    # 1-2: fetch (and lock), check, doctor
    fetch(project, hub, fetch_cmd[0])
    assert not (project / "weights/MOSS-TTS-Delay-v1.5").exists()  # not in the config
    # a model outside the config, fetched by name (step 6 changes a file of it)
    fetch(project, hub, ["bestofn", "weights", "fetch", "--root", "weights", "--only",
                         "moss-tts-delay"])  # fmt: skip
    assert (project / "weights/bestofn-weights.lock.json").is_file()
    assert "ok: 2 groups x 2 takes" in run(project, ["bestofn", "check", "--config", CONFIG]).stdout
    try:
        out = run(project, doctor[0]).stdout
        assert "ok       weights lock" in out and "ok       pilot: 1 group(s) of 2 takes" in out
        assert "skipped  GPU memory: no CUDA device" in out and "doctor: ready" in out

        # 3: the cost before any group ran
        out = run(project, ["bestofn", "plan", "--config", CONFIG]).stdout
        assert "remaining: 2 groups x 2 takes = 4 takes" in out
        assert "wall-clock: " in out and "from the doctor pilot: " in out

        # 4: the run, on the worker the doctor's pilot left warm (the README's order), then
        # its status
        run(project, snakemake[0])
    finally:  # whatever failed, no worker outlives the test (the run's end stops its own)
        stop_all(default_state_dir(project))
    worker_log = (project / "results/logs/workers/slot0.log").read_text()
    assert worker_log.count("models loaded in") == 1, worker_log[-3000:]
    out = run(project, ["bestofn", "status", "--config", CONFIG]).stdout
    assert "groups: 2 done, 0 left of 2 (100.0 %)" in out and "failed: 0" in out
    assert planned_groups(project) == 0

    # 5: the weights moved, weights_root changed: nothing to redo
    moved = tmp_path / "scratch/weights"
    moved.parent.mkdir()
    shutil.move(project / "weights", moved)
    config = yaml.safe_load((project / CONFIG).read_text())
    config["weights_root"] = str(moved)
    (project / CONFIG).write_text(yaml.safe_dump(config))
    assert planned_groups(project) == 0

    # 6: a weight file's bytes changed. One that no group reads (the Delay generator, not in
    # this config): no group; one that every group reads: every group, once relocked.
    unused = next(p for p in (moved / "MOSS-TTS-Delay-v1.5").rglob("*.json"))
    unused.write_text(unused.read_text() + "\n")
    run(project, ["bestofn", "weights", "lock", "--root", str(moved)])
    assert planned_groups(project) == 0
    blend = moved / "voiceclap-heads/blend_head_commercial.pt"
    blend.write_bytes(blend.read_bytes() + b"\0")
    proc = run(project, ["bestofn", "check", "--config", CONFIG], ok=False)
    assert proc.returncode != 0 and "blend_head_commercial.pt" in proc.stdout + proc.stderr
    run(project, ["bestofn", "weights", "lock", "--root", str(moved)])
    assert planned_groups(project) == 2
