import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]

# The lab (benchmarks, probes, fault injection) sits at the repository root, outside the wheel.
# Tests import it, and so do the workers and Snakemake processes they start (fault-injecting
# backends are named as `lab.faults:Class` plug-ins).
if str(REPO) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
    )

# Without a GPU, Triton kernels can only run in Triton's interpreter (the tests of our kernels do).
# Set before anything imports triton: its own library functions (tl.max, tl.sum, ...) are built
# for the interpreter or not when triton is first imported, whatever a test sets later.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def triton_interpreter(monkeypatch):
    """For a test that runs our Triton kernels through Triton's CPU interpreter: skips, with the
    reason, where triton is missing or was imported before TRITON_INTERPRET was set; sets it
    (read when a kernel is built)."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (CPU torch wheels lack it; the `dev` extra has it)")
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported before TRITON_INTERPRET was set (see above)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def write_tsv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n")
    return path


def tiny_config(**overrides) -> dict:
    """A fast config: piper generator, no restoration, duration + whisper scorers."""
    config = {
        "emotions": "config/emotions.tsv",
        "prompts": "config/prompts.tsv",
        "results": "results",
        "takes": 2,
        "seed": 7,
        "models": {
            "generator": {"backend": "piper"},
            "restorer": {"backend": "identity"},
            "scorers": [{"backend": "duration"}],
        },
        "selection": {"filter": "words_per_s > 0.5", "score": "-abs(words_per_s - 2.5)"},
    }
    config.update(overrides)
    return config


def make_tiny_project(root: Path) -> Path:
    """config/ (tiny config, 2 emotions x 2 prompts) and a voice in ``root``."""
    (root / "config" / "voices").mkdir(parents=True)
    shutil.copy(REPO / "config/voices/joe_reference.flac", root / "config/voices/ref.flac")
    write_tsv(
        root / "config/emotions.tsv",
        ["emotion", "description", "reference_audio"],
        [["calm", "A calm voice.", "config/voices/ref.flac"], ["happy", "A happy voice.", ""]],
    )
    write_tsv(
        root / "config/prompts.tsv",
        ["prompt_id", "text"],
        [["p1", "Good morning to you."], ["p2", "It is nine o'clock."]],
    )
    (root / "config/config.yaml").write_text(yaml.safe_dump(tiny_config()))
    return root


@pytest.fixture
def project(tmp_path):
    """A working directory with config/ (tiny config, 2 emotions x 2 prompts) and a voice."""
    return make_tiny_project(tmp_path)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The `project` after one full `snakemake --profile profiles/local` run, made once per
    pytest worker; use it through `ran_project`, never in place."""
    root = make_tiny_project(tmp_path_factory.mktemp("tiny-run"))
    cmd = [
        str(Path(sys.executable).parent / "snakemake"), "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(root), "--profile", str(REPO / "profiles/local"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return root


@pytest.fixture
def ran_project(tiny_run, tmp_path):
    """A copy of `tiny_run` (results, .snakemake records, mtimes and all): the same state as
    `project` after a full run, for the tests that start with exactly that run."""
    return Path(shutil.copytree(tiny_run, tmp_path / "ran", symlinks=True))


# The longest files first: with `pytest -n 2 --dist loadfile` (make test) a file runs whole on one
# worker, and xdist hands the files out in collection order (pytest_configure below), so a long
# file handed out last would run alone at the end. Seconds per file as measured in make test on
# this project's 2-core machine (2026-12-01, two runs, both workers busy), the longest first (a
# range: how long the file took depended on what the other worker ran); files not named here
# are short and follow in their own order. Re-measure with --durations=0 when a file grows: the
# order only balances the two workers, no test depends on it.
_LONGEST_FIRST = (
    "test_slurm.py",  # ~210 (2026-12-02, its time-limit test capped; ~370-570 before)
    "test_workflow_e2e.py",  # ~110
    "test_worker.py",  # ~85
    "test_ab.py",  # ~75
    "test_production_workflow.py",  # ~65
    "test_pairing_workflow.py",  # ~65
    "test_serve_continuous.py",  # ~20-95
    "test_serve.py",  # ~55
    "test_votes_browser.py",  # ~55
    "test_overlap.py",  # ~50
    "test_moss_codec_v2.py",  # ~15-80
    "test_dag_scale.py",  # ~45
    "test_snakemake_speedups.py",  # ~40
    "test_worker_contract.py",  # ~40
    "test_dnsmos.py",  # ~30
    "test_cpu_threads.py",  # ~30
    "test_soak.py",  # ~30
    "test_export.py",  # ~30
    "test_moss_delay.py",  # ~25
    "test_worker_start.py",  # ~25
    "test_trust.py",  # ~25
    "test_pairing.py",  # ~20
    "test_moss_local_loop.py",  # ~20
    "test_final_rules_equal.py",  # ~20
    "test_bench_pipeline.py",  # ~15
)


def pytest_configure(config):
    # pytest-xdist's loadfile reorders the files by their number of tests unless told not to,
    # which would undo the order above (test_slurm.py, 5 tests and the longest, went last).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = item.path.name
        return _LONGEST_FIRST.index(name) if name in _LONGEST_FIRST else len(_LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file keeps its own order
