"""The GPU scripts of docs/bench and the lab code the ledger names, run in their CPU smoke modes
(tiny random weights, tiny sizes) so that a config, layout or API change that breaks one fails
here, not on a GPU box. One tiny fake-weights tree serves them all (``tiny_weights``), and one
run covers several scripts where one calls the others:

- workflow_trees.sh -> gpu_workflow.sh -> lab/project.py (the recipe on the fake weights) ->
  snakemake -> summary.json; then steady_from_group_logs.py on its logs;
- worker_start_gpu.sh -> lab.probes.worker_start;
- fixed_costs.py: a run's fixed costs through snakemake, and the weights' identity alone;
- lab.sh bench scorers (the product's speaker scorer, two runtime variants), lab.sh bench
  database, plan_sheets.py, project_256k.py.

``test_every_ledger_script_is_smoked`` keeps the list honest: a script the ledger names is
either run by a test (the file named below runs it) or listed as not yet, with the reason."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO

LEDGER = REPO / "docs/bench/ledger.jsonl"
PRODUCTION = REPO / "config/recipes/base.yaml"

# script (as the ledger's commands name it) -> the test file that runs it in a smoke mode
SMOKED = {
    "docs/bench/gpu_workflow.sh": "tests/lab/test_gpu_scripts.py",
    "docs/bench/workflow_trees.sh": "tests/lab/test_gpu_scripts.py",
    "docs/bench/worker_start_gpu.sh": "tests/lab/test_gpu_scripts.py",
    "docs/bench/lab.sh": "tests/lab/test_gpu_scripts.py",
    "docs/bench/plan_sheets.py": "tests/lab/test_gpu_scripts.py",
    "docs/bench/fixed_costs.py": "tests/lab/test_gpu_scripts.py",
    "probe worker_start": "tests/lab/test_gpu_scripts.py",
    "probe speech_profile": "tests/lab/test_gpu_scripts.py",
    "probe speaker_tolerance": "tests/lab/test_gpu_scripts.py",
    "probe stream_codec": "tests/lab/test_gpu_scripts.py",
    "docs/bench/serve_gpu.sh": "tests/lab/test_gpu_scripts.py",
    "docs/bench/steady_from_group_logs.py": "tests/lab/test_gpu_scripts.py",
    "docs/bench/project_256k.py": "tests/lab/test_gpu_scripts.py",
    "bench scorers": "tests/lab/test_gpu_scripts.py",
    "bench database": "tests/lab/test_gpu_scripts.py",
    "bench pipeline": "tests/lab/test_bench_pipeline.py",
    "bench codec": "tests/moss/test_moss_codec_v2.py",
    "probe parakeet_encoder_probe": "tests/lab/test_parakeet_profile.py",
}
# Named by the ledger, not yet run by a test: each with why (a debt: smoke it when it changes)
NOT_YET = {
    "docs/bench/soak_gpu.sh": "150 groups; its CPU mode (SIZE=tiny ... SOAK_GROUPS=6) is minutes "
    "on 2 cores; tests/worker/test_soak.py soaks the same worker path",
    "docs/bench/ab_int8_gpu.sh": "int8 weights need CUDA (no CPU mode)",
    "docs/bench/codec_gpu.sh": "the published codec's remote code on CUDA (no CPU mode)",
    "docs/bench/codec_v2_gpu.sh": "wraps bench codec, which tests/moss/test_moss_codec_v2.py runs",
    "docs/bench/delay_gpu.sh": "MOSS-TTS Delay 8B parity against the published code on CUDA",
    "docs/bench/parakeet_calibrated_gpu.sh": "NeMo's CUDA-graph decoders (no CPU mode)",
    "docs/bench/slurm_bundle_idle.sh": "needs SLURM and a GPU partition",
    "docs/bench/demo_cpu.py": "it runs `make demo` whole (minutes): the demo test covers the path",
    "docs/bench/gil_convoy.py": "minutes of wall by design (three switch intervals)",
    "docs/bench/parakeet_config_yaml.py": "compares against an older source tree (OLD_SRC)",
    "docs/bench/parakeet_decoding.py": "needs a real Parakeet config and CUDA",
    "docs/bench/parakeet_load.py": "needs a real .nemo archive and its extracted cache",
    "bench generate": "its --tiny mode is minutes of wall on 2 cores",
    "bench export": "minutes of wall on 2 cores; tests/export covers the exporters",
    "probe pairing": "its --tiny mode is over a minute; tests/worker covers pairing's bits",
    "probe gemm_probe": "CUDA graphs and cuBLAS only",
    "probe stage_profile": "CUDA only (real-size Sidon and Parakeet)",
    "probe parakeet_calibrated": "NeMo's CUDA-graph decoders; calibrated fake: tests/backends",
    "docs/bench/serve_cpu_ab.py": "two trees' servers side by side (an older tree checked out); "
    "tests/serve covers the service",
    "docs/bench/ab_speaker_gpu.sh": "bestofn ab spawns a process per side (minutes on 2 cores); "
    "its CPU mode (WORK=... TAKES=2 FRAMES=8) was run by hand",
}


def ledger_scripts() -> set[str]:
    names = set()
    for line in LEDGER.read_text().splitlines():
        command = json.loads(line)["command"]
        names |= set(re.findall(r"docs/bench/[\w.-]+\.(?:sh|py)", command))
        names |= {f"{k} {n}" for k, n in re.findall(r"lab\.sh (bench|probe) (\w+)", command)}
    return names


def test_every_ledger_script_is_smoked():
    named = ledger_scripts()
    assert "docs/bench/gpu_workflow.sh" in named and "probe worker_start" in named
    unknown = sorted(named - set(SMOKED) - set(NOT_YET))
    assert not unknown, f"ledger scripts with no smoke test and no reason in NOT_YET: {unknown}"
    assert not set(SMOKED) & set(NOT_YET)
    for script, test_file in SMOKED.items():  # the file named does run it
        text = (REPO / test_file).read_text()
        kind, _, name = script.partition(" ")
        needles = [script] if not name else [f'"{name}"', f"lab.{kind}.{name}", f"{kind}s.{name}"]
        needles += (
            [Path(script).name] if not name else [f"import {name}", f"lab.probes import {name}"]
        )
        assert any(n in text for n in needles), f"{test_file} does not run {script}"


def env(tmp: Path, **extra) -> dict:
    path = os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "PYTHON": sys.executable,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        **extra,
    }


def run(cmd: list[str], env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


def work_dir(tmp_path: Path, weights: Path) -> Path:
    """The scripts' WORK folder: their weights/ is the shared tiny tree."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "weights").symlink_to(weights)
    return work


@pytest.mark.slow  # one tiny fake-weights tree (shared) and plans
def test_the_recipe_runs_on_the_fake_weights(tiny_weights, tmp_path):
    """lab.project: production's backends and score on the fake tree, each emotion naming an
    Empathic-Insight head (the score's ei_target refuses an emotion with none); a recipe with
    no restorer and no speaker scorer too."""
    from bestofn.core.plan import PlanError, build_plan
    from lab.project import heads_of, write_project

    path = write_project(PRODUCTION, tiny_weights, tmp_path / "p", 3, 2, 2, 8, env={})
    config = yaml.safe_load(path.read_text())
    production = yaml.safe_load(PRODUCTION.read_text())
    assert [s["backend"] for s in config["models"]["scorers"]] == [
        s["backend"] for s in production["models"]["scorers"]
    ]
    assert config["selection"]["score"] == production["selection"]["score"]
    assert config["weights_root"] == str(tiny_weights) and config["device"] == "cpu"
    plan = build_plan(config, base=path.parent)
    assert len(plan.groups) == 6
    heads = {spec.extra.get("ei_head") for spec in plan.groups.values()}
    tree_heads = heads_of(config)
    assert tree_heads and heads == set(tree_heads[:3])  # each emotion a head, in turn
    # the sheet the script wrote before: no head, and the production score refuses the plan
    (path.parent / "emotions.tsv").write_text("emotion\tdescription\ne0\tEmotion 0.\n")
    with pytest.raises(PlanError, match="ei_target"):
        build_plan(yaml.safe_load(path.read_text()), base=path.parent)

    recipe = dict(production)
    recipe["models"] = {
        **production["models"],
        "restorer": {"backend": "identity"},
        "scorers": [s for s in production["models"]["scorers"] if s["backend"] != "wavlm-speaker"],
    }
    (tmp_path / "emotions.yaml").write_text(yaml.safe_dump(recipe))
    path = write_project(
        tmp_path / "emotions.yaml", tiny_weights, tmp_path / "e", 1, 2, 2, 8, env={}
    )
    config = yaml.safe_load(path.read_text())
    assert config["models"]["restorer"] == {"backend": "identity"}
    assert "wavlm-speaker" not in {s["backend"] for s in config["models"]["scorers"]}
    assert len(build_plan(config, base=path.parent).groups) == 2


@pytest.mark.slow  # snakemake end to end on the production backends (tiny)
def test_workflow_scripts_smoke(tiny_weights, tmp_path):
    """workflow_trees.sh -> gpu_workflow.sh with the recipe named, through snakemake, verified;
    then steady_from_group_logs.py on its group logs."""
    work = work_dir(tmp_path, tiny_weights)
    out = tmp_path / "out"
    e = env(
        tmp_path,
        WORK=str(work),
        SIZE="tiny",
        PROFILE="local",
        TAKES="2",
        FRAMES="8",
        WRITE_THREADS="2",
    )
    # two emotions: the recipe's ei_spec compares a group's head with the other emotions' heads
    proc = run(["bash", "docs/bench/workflow_trees.sh", str(out), "2", "2",
                "S=.:500@config/recipes/base.yaml"], e, timeout=700)  # fmt: skip
    log = (out / "S.log").read_text()
    assert "workflow S" in proc.stdout and "rc 0" in proc.stdout, proc.stdout + log[-3000:]
    summary = json.loads((out / "S/summary.json").read_text())
    assert summary["verify"].endswith("4 groups checked, 0 problem(s)"), summary["verify"]
    assert summary["overall"]["clips"] == 8
    # 8 takes of 8 frames (12.5 a second): the audio a per-audio-second figure divides by
    assert summary["overall"]["audio_s"] == pytest.approx(8 * 8 / 12.5)
    assert summary["overall"]["s_per_audio_s_per_gpu"] > 0
    ran = yaml.safe_load((out / "S/config.yaml").read_text())
    assert "ei_spec" in ran["selection"]["score"]
    assert ran["runtime"]["write_threads"] == 2  # the script's knob, in the config that ran
    steady = run([sys.executable, "docs/bench/steady_from_group_logs.py", "--takes", "2",
                  str(out / "S")], e)  # fmt: skip
    assert " 4 steady " in steady.stdout


@pytest.mark.slow  # a worker on the production backends (tiny)
def test_worker_start_smoke(tiny_weights, tmp_path):
    """worker_start_gpu.sh -> lab.probes.worker_start: the worker gets the plan's models (weights
    paths resolved under weights_root), loads every backend and makes two groups."""
    work = work_dir(tmp_path, tiny_weights)
    out = tmp_path / "out"
    e = env(tmp_path, WORK=str(work), SIZE="tiny", TAKES="2", FRAMES="8", RUNS="cold")
    run(["bash", "docs/bench/worker_start_gpu.sh", str(out), "config/recipes/base.yaml"], e)
    result = json.loads((out / "worker_start.json").read_text())
    [cold] = result["runs"]
    assert cold["run"] == "cold" and [g["clips"] for g in cold["groups"]] == [2, 2]
    backends = cold["load_report"]["backends"]
    assert any(k.endswith("wavlm-speaker") for k in backends), backends


@pytest.mark.slow  # snakemake end to end on the production backends (tiny)
def test_fixed_costs_smoke(tiny_weights, tmp_path):
    """fixed_costs.py: one run of the emotions recipe through snakemake, its marks in order and
    the worker's start read from its log; then the weights' identity alone on padded folders
    (a hard-linked copy: the shared tree is left as it was)."""
    e = env(tmp_path)
    common = ["--weights", str(tiny_weights), "--emotions", "2", "--prompts", "1",
              "--takes", "1", "--frames", "4", "--runs", "1"]  # fmt: skip
    run([sys.executable, "docs/bench/fixed_costs.py", *common, "--out", str(tmp_path / "run"),
         f"N={REPO}"], e)  # fmt: skip
    [r] = json.loads((tmp_path / "run/fixed_costs.json").read_text())["runs"]
    assert 0 < r["submitted"] < r["first_group"] <= r["groups_done"] < r["all_done"], r
    assert r["all_done"] <= r["complete"] <= r["exit"], r
    assert r["worker"]["ready_s"] > 0, r
    run([sys.executable, "docs/bench/fixed_costs.py", *common, "--out", str(tmp_path / "id"),
         "--identity", "--pad-mb", "1", f"A={REPO}", f"B={REPO}"], e)  # fmt: skip
    result = json.loads((tmp_path / "id/fixed_costs.json").read_text())
    assert [r["tag"] for r in result["runs"]] == ["A", "B"]
    assert all(r["identity"] > 0 for r in result["runs"])
    assert (tmp_path / "id/weights/BUD-E-Whisper/pad.bin").stat().st_size == 1 << 20
    assert not (tiny_weights / "BUD-E-Whisper/pad.bin").exists()


@pytest.mark.slow  # the product's speaker scorer (tiny) through lab.sh, two runtime variants
def test_bench_scorers_and_database_smoke(tmp_path):
    e = env(tmp_path)
    out = tmp_path / "scorers.jsonl"
    run(["bash", "docs/bench/lab.sh", "bench", "scorers", "--device", "cpu", "--size", "tiny",
         "--batches", "2,3", "--seconds", "1", "--repeats", "1", "--only", "wavlm-speaker",
         "--speaker-runtime", "precision=float32,batch_size=64,batching=one_length;"
         "precision=bfloat16,max_seconds=0.5", "--spread", "0.5", "--profile", "5",
         "--out", str(out)], e)  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert not [r for r in rows if "error" in r], rows
    speaker = [r for r in rows if r["backend"].startswith("wavlm-speaker")]
    assert {r["backend"] for r in speaker} == {
        "wavlm-speaker[precision=float32,batch_size=64,batching=one_length]",
        "wavlm-speaker[precision=bfloat16,max_seconds=0.5]",
    }
    assert all(r["s_per_clip"] > 0 and "peak_gib" in r for r in speaker)
    assert all(r["spread_s"] == 0.5 and any("Self CPU" in x for x in r["profile"]) for r in speaker)

    db = tmp_path / "db.jsonl"
    run(["bash", "docs/bench/lab.sh", "bench", "database", "--groups", "4", "--takes", "4",
         "--ei-heads", "3", "--out", str(tmp_path / "db"), "--json", str(db)], e)  # fmt: skip
    assert db.read_text().strip()

    run([sys.executable, "docs/bench/plan_sheets.py", str(tmp_path / "sheets"), "2", "3"], e)
    assert len((tmp_path / "sheets/config/prompts.tsv").read_text().splitlines()) >= 4


@pytest.mark.slow  # the speech service's render (moss-fast, tiny) through lab.sh
def test_speech_profile_smoke(tiny_weights, tmp_path):
    """lab.probes.speech_profile times the product's streaming render by part."""
    out = tmp_path / "speech.jsonl"
    run(["bash", "docs/bench/lab.sh", "probe", "speech_profile", "--device", "cpu",
         "--model-dir", str(tiny_weights / "MOSS-TTS-Local-Transformer-v1.5"),
         "--codec-dir", str(tiny_weights / "MOSS-Audio-Tokenizer-v2"),
         "--batches", "2", "--repeats", "1", "--stream-modes", "eager,padded",
         "--admit-tokens", "none,1", "--text", "Hi there, see you.", "--out", str(out)],
        env(tmp_path))  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["batch"], r["stream_mode"], r["admit_tokens"], r.get("warmup", False))
            for r in rows] == [
        (2, "eager", None, True), (2, "eager", None, False), (2, "eager", 1, True),
        (2, "eager", 1, False), (2, "padded", None, True), (2, "padded", None, False),
        (2, "padded", 1, True), (2, "padded", 1, False),
    ]  # fmt: skip
    for r in rows:
        assert r["audio_s"] > 0 and r["decode_loop_s"] > 0 and r["codec_s"] > 0
        assert r["decode_loop_s"] + r["codec_s"] <= r["wall_s"] + 1e-3
        assert 0 < r["admit_s"] < r["decode_loop_s"]  # the joins are inside the decode loop
        assert 0 < r["first_codes_mean_ms"] < r["ttfa_mean_ms"]  # frames come before their audio


def test_stream_codec_smoke(tiny_weights, tmp_path):
    """lab.probes.stream_codec: the service's streaming codec decode beside the one-shot one."""
    out = tmp_path / "stream.jsonl"
    run(["bash", "docs/bench/lab.sh", "probe", "stream_codec", "--device", "cpu",
         "--codec-dir", str(tiny_weights / "MOSS-Audio-Tokenizer-v2"), "--requests", "2",
         "--frames", "4", "--seen", "8", "--modes", "eager,padded", "--repeats", "1",
         "--dtype", "fp32", "--out", str(out)], env(tmp_path))  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["path"] for r in rows] == ["stream eager", "stream padded", "one-shot"]
    assert all(r["s_per_call"] > 0 and r["ms_per_audio_s"] > 0 for r in rows)
    # streamed in chunks and joined, as the one-shot decode: fp32 rounding only (keys left
    # without their RoPE put it at about 0.07)
    assert all(0 <= r["vs_one_shot_max_rel"] < 1e-4 for r in rows[:2]), rows


@pytest.mark.slow  # two servers (bf16, then int8 under its cap) on tiny weights: ~45 s
def test_serve_gpu_smoke(tmp_path):
    """docs/bench/serve_gpu.sh in its CPU mode: the service under the load generator at two
    levels, then the capped int8 part, and the summary of both; ADMIT_TOKENS reaches the
    served config (runtime.speech_admit_tokens: two requests at once join one a sync)."""
    with socket.socket() as s:  # a free port for the script's server
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    run(["bash", "docs/bench/serve_gpu.sh", str(out), "1,2"],
        env(tmp_path, WORK=str(tmp_path / "work"), SIZE="tiny", DEVICE="cpu", REQUESTS="2",
            TEXT="Hi there.", PORT=str(port), ADMIT_TOKENS="1"))  # fmt: skip
    served = yaml.safe_load((tmp_path / "work" / "speech.yaml").read_text())
    assert served["models"]["generator"]["runtime"]["speech_admit_tokens"] == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == {"1": 0, "2": 0}
    assert all(summary["audio_s_per_s"][level] > 0 for level in ("1", "2"))
    assert summary["ttfa_ms_c1"]["mean"] > 0
    cap = summary["cap"]
    assert cap is not None and cap["levels"][0]["ok"] == 2


def test_speaker_tolerance_smoke(tmp_path):
    """lab.probes.speaker_tolerance: each speed path's spk_sim against each take alone."""
    out = tmp_path / "tol.jsonl"
    run(["bash", "docs/bench/lab.sh", "probe", "speaker_tolerance", "--device", "cpu",
         "--size", "tiny", "--takes", "3", "--seconds", "1", "--spread", "0.5",
         "--runtime", "max_seconds=0.6", "--out", str(out)], env(tmp_path))  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["runtime"] for r in rows] == [
        {"precision": "float32"},
        "default",
        {"max_seconds": 0.6},
    ]
    assert rows[0]["path"]["batching"] == "padded" and rows[0]["max_abs_diff"] < 1e-5
    assert rows[2]["max_abs_diff"] > 1e-4  # a crop sees other seconds: it moves the score


def test_project_256k_arithmetic(tmp_path):
    sys.path.insert(0, str(REPO / "docs/bench"))
    try:
        import project_256k as p
    finally:
        sys.path.remove(str(REPO / "docs/bench"))
    ledger = [
        {"figure": "steady", "value": 0.05},
        {"figure": "steady", "value": "0.0200–0.0250"},  # the latest line counts
        {"figure": "start", "value": 60},
        {"figure": "end", "value": "20–30"},
    ]
    r = p.project(ledger, gpus=8, takes=256000, steady="steady", fixed=("start", "end"),
                  extra={"submit": 10.0})  # fmt: skip
    assert r["groups"] == 4000 and r["takes_on_busiest_gpu"] == 32000
    assert r["steady_s"] == pytest.approx(32000 * 0.025)
    assert r["total_s"] == pytest.approx(800 + 60 + 30 + 10)
    low = p.project(ledger, 8, 256000, "steady", ("start", "end"), end="low")
    assert low["total_s"] == pytest.approx(32000 * 0.02 + 60 + 20)
    # groups that do not split evenly: the busiest GPU makes one group more
    uneven = p.project(ledger, 3, 64 * 10, "steady", ())
    assert uneven["takes_on_busiest_gpu"] == 64 * 4
    with pytest.raises(p.LedgerError, match="nope"):
        p.project(ledger, 8, 1000, "nope")
    # the command on the real ledger, and a bad figure: exit 2 with the file named
    e = env(tmp_path)
    out = tmp_path / "p.json"
    run([sys.executable, "docs/bench/project_256k.py", "--json", str(out)], e)
    assert json.loads(out.read_text())["gpus"] == 8
    bad = subprocess.run([sys.executable, "docs/bench/project_256k.py", "--steady", "nope"],
                         cwd=REPO, env=e, capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "error:" in bad.stderr and "nope" in bad.stderr
