"""Weights pinned to hub commits: `bestofn weights fetch` records the commit each repo resolved
to, and `bestofn weights fetch --lock` on another machine fetches exactly those commits and
checks every file's sha256, after the repo's branch has moved on to another commit.

Through the real huggingface_hub code against the hub stand-in on 127.0.0.1 (tests/helpers.py),
serving two commits of one repo."""

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer

import pytest
from helpers import Hub

from bestofn.weights import lock

REPO = "sarulab-speech/sidon_raw_weight"
OLD, NEW = "1" * 40, "2" * 40  # two commits of REPO
V1 = {"adapter_config.json": b'{"r": 1}', "adapter_model.safetensors": b"\1" * 4000,
      "decoder_state_dict.pt": b"decoder v1" * 50}  # fmt: skip
V2 = {"adapter_config.json": b'{"r": 2}', "adapter_model.safetensors": b"\2" * 4000,
      "decoder_state_dict.pt": b"decoder v2" * 60}  # fmt: skip


@pytest.fixture
def hub():
    Hub.serving({REPO: V1}, heads={REPO: OLD})
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    Hub.serving({})


def bestofn(args, hub, tmp_path, home="hf-home"):
    """`bestofn` in a fresh process (huggingface_hub reads HF_ENDPOINT when imported), each
    "machine" with its own HF_HOME."""
    env = {**os.environ, "HF_ENDPOINT": hub, "HF_HOME": str(tmp_path / home)}
    env.pop("HF_HUB_OFFLINE", None)
    cmd = [sys.executable, "-m", "bestofn.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def folder_bytes(root):
    folder = root / "sidon_raw_weight"
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_a_second_machine_fetches_the_locked_commit_after_the_branch_moved(hub, tmp_path):
    first = tmp_path / "machine-a"
    proc = bestofn(["weights", "fetch", "--root", str(first), "--only", "sidon"], hub, tmp_path)
    assert proc.returncode == 0, proc.stderr
    repos = lock.read_repos(first / lock.LOCK_NAME)
    assert repos == {"sidon": {"repo_id": REPO, "commit": OLD, "folder": "sidon_raw_weight"}}
    assert folder_bytes(first) == V1

    Hub.serving({REPO: V2}, heads={REPO: NEW}, history={REPO: {OLD: V1}})  # the branch moves

    second = tmp_path / "machine-b"
    proc = bestofn(["weights", "fetch", "--lock", str(first / lock.LOCK_NAME), "--root",
                    str(second)], hub, tmp_path, home="hf-home-b")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert folder_bytes(second) == V1  # the locked commit, not the branch's new head
    assert any(path.startswith(f"/{REPO}/resolve/{OLD}/") for _, path in Hub.requests)
    assert not any(f"/resolve/{NEW}/" in path for _, path in Hub.requests)
    assert (second / lock.LOCK_NAME).read_bytes() == (first / lock.LOCK_NAME).read_bytes()
    assert lock.verify(second) == []

    listed = bestofn(["weights", "list", "--root", str(second)], hub, tmp_path)
    line = next(ln for ln in listed.stdout.splitlines() if ln.startswith("sidon "))
    assert f"locked commit {OLD}" in line
    assert "locked commit none" in next(
        ln for ln in listed.stdout.splitlines() if ln.startswith("parakeet ")
    )

    # a plain fetch now takes the new head and records it
    third = tmp_path / "machine-c"
    proc = bestofn(["weights", "fetch", "--root", str(third), "--only", "sidon"], hub, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert lock.read_repos(third / lock.LOCK_NAME)["sidon"]["commit"] == NEW
    assert folder_bytes(third) == V2


def test_a_file_that_differs_from_the_lock_is_named_and_no_lock_is_written(hub, tmp_path):
    first = tmp_path / "machine-a"
    assert bestofn(["weights", "fetch", "--root", str(first)] + ["--only", "sidon"], hub,
                   tmp_path).returncode == 0  # fmt: skip
    # the lock says another decoder than the commit holds (a lock edited, or a commit rewritten)
    doc = json.loads((first / lock.LOCK_NAME).read_text())
    doc["files"]["sidon_raw_weight/decoder_state_dict.pt"]["sha256"] = hashlib.sha256(
        b"d" * len(V1["decoder_state_dict.pt"])
    ).hexdigest()
    edited = tmp_path / "edited.lock.json"
    edited.write_text(json.dumps(doc))
    second = tmp_path / "machine-b"
    proc = bestofn(["weights", "fetch", "--lock", str(edited), "--root", str(second)], hub,
                   tmp_path, home="hf-home-b")  # fmt: skip
    assert proc.returncode == 2
    assert f"{second}/sidon_raw_weight/decoder_state_dict.pt: sha256 differs" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (second / lock.LOCK_NAME).exists()


def test_a_commit_the_hub_does_not_have_is_named(hub, tmp_path):
    first = tmp_path / "machine-a"
    assert bestofn(["weights", "fetch", "--root", str(first), "--only", "sidon"], hub,
                   tmp_path).returncode == 0  # fmt: skip
    doc = json.loads((first / lock.LOCK_NAME).read_text())
    doc["repos"]["sidon"]["commit"] = "3" * 40
    gone = tmp_path / "gone.lock.json"
    gone.write_text(json.dumps(doc))
    proc = bestofn(["weights", "fetch", "--lock", str(gone), "--root", str(tmp_path / "b")], hub,
                   tmp_path, home="hf-home-b")  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"error: weights fetch: {REPO}@{'3' * 40}:" in proc.stderr


def test_a_lock_without_commits_is_refused_naming_it(tmp_path, capsys):
    from bestofn.cli import main

    root = tmp_path / "models"
    (root / "sidon_raw_weight").mkdir(parents=True)
    (root / "sidon_raw_weight/decoder_state_dict.pt").write_bytes(b"x" * 10)
    assert main(["weights", "lock", "--root", str(root)]) == 0  # by content only
    assert main(["weights", "fetch", "--lock", str(root / lock.LOCK_NAME)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {root / lock.LOCK_NAME}: records no hub commit")


def test_relocking_keeps_the_commits_of_folders_still_there(hub, tmp_path):
    root = tmp_path / "models"
    assert bestofn(["weights", "fetch", "--root", str(root), "--only", "sidon"], hub,
                   tmp_path).returncode == 0  # fmt: skip
    (root / "sidon_raw_weight/extra.txt").write_text("a file added by hand")
    lock.write_lock(root)
    assert lock.read_repos(root / lock.LOCK_NAME)["sidon"]["commit"] == OLD
    assert "sidon_raw_weight/extra.txt" in lock.read_lock(root / lock.LOCK_NAME)
