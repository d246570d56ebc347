"""`bestofn weights fetch | lock` and the lock check, offline.

Fetch runs the real huggingface_hub code (snapshot_download: repo info, tree listing, HEAD and
GET of each file, local_dir metadata) against a small hub stand-in on 127.0.0.1 (HF_ENDPOINT),
serving tiny files in the manifest's layout. A stand-in server rather than a pre-populated
cache with HF_HUB_OFFLINE=1: offline, snapshot_download never lists the repo nor filters by
allow_patterns nor downloads, so the cache would test none of what `fetch` asks of the hub."""

import hashlib
import os
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import REPO, Hub

from bestofn.cli import main as bestofn
from bestofn.weights import lock
from bestofn.weights.manifest import BY_NAME, MANIFEST, entries_for_config


def hub_files() -> dict[str, dict[str, bytes]]:
    """repo -> {path: bytes}: the VoiceCLAP heads repos (two repos, one folder) with a file
    that the allow patterns leave out, and Sidon's adapter repo."""
    return {
        "laion/voiceclap-commercial-genuineness": {
            "genu_commercial_best.pt": b"genuineness head" * 64,
            "genuineness_scorer.py": b"# not fetched: not in allow_patterns\n",
        },
        "laion/voiceclap-commercial-vocalburst-blend": {
            "blend_head_commercial.pt": b"blend head" * 100,
            "README.md": b"not fetched\n",
        },
        "sarulab-speech/sidon_raw_weight": {
            "adapter_config.json": b"{}",
            "adapter_model.safetensors": b"\0" * 5000,
            "decoder_state_dict.pt": b"decoder" * 300,
        },
    }


@pytest.fixture
def hub():
    Hub.serving(hub_files())
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def run_cli(args, env_extra, tmp_path):
    """`bestofn` in a fresh process: huggingface_hub reads HF_ENDPOINT when imported."""
    env = {**os.environ, **env_extra, "HF_HOME": str(tmp_path / "hf-home")}
    env.pop("HF_HUB_OFFLINE", None)
    cmd = [sys.executable, "-m", "bestofn.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_fetch_from_a_hub_stand_in_then_lock_and_check(hub, tmp_path):
    root = tmp_path / "models"
    proc = run_cli(["weights", "fetch", "--root", str(root), "--only", "voiceclap-genuineness",
                    "voiceclap-blend", "sidon"], {"HF_ENDPOINT": hub}, tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "default branch" in proc.stdout  # the manifest pins no revision: said, not hidden
    heads = root / "voiceclap-heads"  # two repos, one folder
    assert sorted(p.name for p in heads.iterdir() if not p.name.startswith(".")) == [
        "blend_head_commercial.pt", "genu_commercial_best.pt"]  # fmt: skip
    for repo, files in hub_files().items():
        folder = root / next(e.folder for e in MANIFEST if e.repo_id == repo)
        for name, body in files.items():
            fetched = folder / name
            if name.endswith((".pt", ".json", ".safetensors")):
                assert fetched.read_bytes() == body
            else:  # left out by the allow patterns
                assert not fetched.exists()
    # lock: every file, sizes and sha256, hidden hub metadata left out
    assert bestofn(["weights", "lock", "--root", str(root)]) == 0
    files = lock.read_lock(root / lock.LOCK_NAME)
    assert set(files) == {"voiceclap-heads/genu_commercial_best.pt",
                          "voiceclap-heads/blend_head_commercial.pt",
                          "sidon_raw_weight/adapter_config.json",
                          "sidon_raw_weight/adapter_model.safetensors",
                          "sidon_raw_weight/decoder_state_dict.pt"}  # fmt: skip
    body = hub_files()["sarulab-speech/sidon_raw_weight"]["decoder_state_dict.pt"]
    assert files["sidon_raw_weight/decoder_state_dict.pt"] == {
        "size": len(body), "sha256": hashlib.sha256(body).hexdigest()}  # fmt: skip
    assert lock.verify(root) == []


def test_fetch_unknown_name_lists_the_known_ones_and_writes_nothing(tmp_path, capsys):
    root = tmp_path / "models"
    assert bestofn(["weights", "fetch", "--root", str(root), "--only", "sidon", "nope"]) == 2
    err = capsys.readouterr().err
    assert "'nope'" in err and all(e.name in err for e in MANIFEST)
    assert not root.exists()


def config_for(root: Path) -> dict:
    return {
        "weights_root": str(root),
        "models": {
            "generator": {"backend": "piper"},
            "restorer": {"backend": "sidon", "options": {
                "adapter_dir": "sidon_raw_weight",
                "decoder_path": "sidon_raw_weight/decoder_state_dict.pt"}},
            "scorers": [{"backend": "voiceclap", "options": {
                "genuineness_path": "voiceclap-heads/genu_commercial_best.pt"}}],
        },
    }  # fmt: skip


def shards(root: Path) -> Path:
    folder = root / "sidon_raw_weight"
    folder.mkdir(parents=True)
    for i in range(3):
        (folder / f"model-0000{i}-of-00003.safetensors").write_bytes(bytes([i]) * 10000)
    (folder / "decoder_state_dict.pt").write_bytes(b"d" * 100)
    (root / "voiceclap-heads").mkdir()
    (root / "voiceclap-heads/genu_commercial_best.pt").write_bytes(b"g" * 100)
    (root / "elsewhere").mkdir()
    (root / "elsewhere/unused.bin").write_bytes(b"u")
    lock.write_lock(root)
    return folder


def test_lock_check_names_a_truncated_a_missing_and_an_extra_shard(tmp_path):
    root = tmp_path / "models"
    folder = shards(root)
    config = config_for(root)
    memo = tmp_path / "results/cache/sha256-memo"
    assert lock.check_config(config, tmp_path) == []
    assert list(memo.iterdir())  # hashes memoised where the workers keep theirs
    shard = folder / "model-00001-of-00003.safetensors"
    good = shard.read_bytes()
    shard.write_bytes(good[:-4096])
    assert lock.check_config(config, tmp_path) == [
        f"{shard}: 5904 bytes, the lock {root / lock.LOCK_NAME} says 10000"]  # fmt: skip
    shard.unlink()
    (problem,) = lock.check_config(config, tmp_path)
    assert problem.startswith(f"{shard}: missing")
    shard.write_bytes(b"x" * len(good))  # same size, other bytes: the hash tells
    (problem,) = lock.check_config(config, tmp_path)
    assert problem.startswith(f"{shard}: sha256 differs")
    shard.write_bytes(good)
    (folder / "model-00003-of-00003.safetensors").write_bytes(b"new")
    (problem,) = lock.check_config(config, tmp_path)
    assert "model-00003-of-00003.safetensors: not in the lock" in problem
    (folder / "model-00003-of-00003.safetensors").unlink()
    (root / "elsewhere/unused.bin").write_bytes(b"changed")  # a folder the config does not use
    assert lock.check_config(config, tmp_path) == []


def test_a_lock_that_does_not_parse_is_named(tmp_path):
    root = tmp_path / "models"
    shards(root)
    (root / lock.LOCK_NAME).write_text('{"format": 1, "files": {"a": {"size": "big"}}')
    (problem,) = lock.check_config(config_for(root), tmp_path)
    assert str(root / lock.LOCK_NAME) in problem and "does not parse" in problem
    assert "weights_root" in lock.check_config(config_for(tmp_path / "nowhere"), tmp_path)[0]


def test_entries_for_config_are_the_folders_it_names():
    config = config_for(Path("/models"))
    config["models"]["scorers"][0]["options"]["blend_path"] = "/models/voiceclap-heads/b.pt"
    names = [e.name for e in entries_for_config(config)]
    assert names == ["sidon", "voiceclap-genuineness", "voiceclap-blend"]
    assert BY_NAME["parakeet"].allow_patterns == ("parakeet-tdt-0.6b-v3.nemo",)


def test_worker_key_follows_the_weights_bytes_not_only_their_path(tmp_path):
    from bestofn.worker.client.group_job import _weights_digest, slot_spec
    from bestofn.worker.client.runtime import Runtime, SlotPool
    from bestofn.worker.key import worker_key

    root = tmp_path / "models"
    shards(root)
    models = config_for(root)["models"]
    models["restorer"]["options"] = {
        k: str(root / v) for k, v in models["restorer"]["options"].items()
    }
    pool = SlotPool(tmp_path / "state", 1, 1, "cpu")
    rt = Runtime.from_config(None)

    def key():
        _weights_digest.cache_clear()  # a new group job's process
        return worker_key(slot_spec(pool, 0, models, tmp_path / "results", "PCM_16", rt))

    before = key()
    assert key() == before
    (root / "sidon_raw_weight/decoder_state_dict.pt").write_bytes(b"e" * 100)
    lock.write_lock(root)  # with a lock the identity is the lock's (the plan checks the files)
    after = key()
    assert after != before
    (root / lock.LOCK_NAME).unlink()  # without: the files' own hashes, the same value
    assert key() == after


def test_a_cut_safetensors_shard_is_named_without_a_lock(tmp_path):
    """What the worker's load error says only as "incomplete metadata, file not fully covered"
    (safetensors), the diagnosis after a failed start names by file."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from bestofn.weights.diagnose import broken_weights

    folder = tmp_path / "MOSS-TTS-Local-Transformer-v1.5"
    folder.mkdir()
    shard = folder / "model-00002-of-00002.safetensors"
    save_file({"a": np.ones((64, 64), np.float32)}, folder / "model-00001-of-00002.safetensors")
    save_file({"b": np.zeros((32, 8), np.float16)}, shard)
    models = {"generator": {"backend": "moss-fast", "options": {"model_dir": str(folder)}}}
    assert broken_weights(models) == []
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(Exception, match="incomplete metadata"):  # the loader's own words
        load_file(shard)
    (problem,) = broken_weights(models)
    assert problem.startswith(f"{shard}: ") and "cut short" in problem
    shard.unlink()
    models["generator"]["options"]["model_dir"] = str(shard)
    assert broken_weights(models) == [f"{shard}: missing"]


SCORER_WEIGHTS = ["parakeet", "voiceclap", "voiceclap-genuineness", "voiceclap-blend",
                  "bud-e-whisper", "empathic-insight"]  # fmt: skip
RECIPE_WEIGHTS = {
    "emotions": ["moss-tts-local-voice-acting", "moss-audio-tokenizer-v2", *SCORER_WEIGHTS],
    "clone": ["moss-tts-local-voice-acting", "moss-audio-tokenizer-v2", *SCORER_WEIGHTS,
              "wavlm-speaker"],
    "delay": ["moss-tts-delay-voice-acting", "moss-audio-tokenizer", "w2v-bert-2.0", "sidon",
              *SCORER_WEIGHTS],
    "base": ["moss-tts-local", "moss-audio-tokenizer-v2", "w2v-bert-2.0", "sidon",
             *SCORER_WEIGHTS, "wavlm-speaker"],
}  # fmt: skip


@pytest.mark.parametrize("recipe", sorted(RECIPE_WEIGHTS))
def test_each_recipe_fetches_its_models_repos(recipe):
    """`bestofn weights fetch --config config/recipes/X.yaml` fetches exactly the repos of the
    recipe's models (the manifest's order)."""
    import yaml

    config = yaml.safe_load((REPO / f"config/recipes/{recipe}.yaml").read_text())
    names = [e.name for e in entries_for_config(config)]
    assert sorted(names) == sorted(RECIPE_WEIGHTS[recipe])
    repos = {BY_NAME[n].repo_id for n in names}
    if recipe in ("emotions", "clone"):
        assert "laion/moss-tts-local-transformer-4.55b-voice-acting" in repos
    if recipe == "delay":
        assert "laion/moss-tts-v1.5-8b-voice-acting" in repos
