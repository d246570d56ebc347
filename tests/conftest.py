import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# torch's CPU threads under pytest-xdist: each worker's share of the cores, for the worker and
# every process it starts (snakemake, bestofn workers, the lab's scripts; the product reads
# OMP_NUM_THREADS too, bestofn.util.torch_threads.default_cpu_threads). With torch's default of
# one thread per core in each of `make test`'s two workers on two cores, a tiny model's many
# small ops each wait for a thread the other worker holds: the speech service's CPU smoke took
# 10 s alone and 460 s beside another worker. Set before torch is imported (it reads the
# variable once); left alone when set, and without xdist. A test that needs more threads sets
# them (torch.set_num_threads, a backend's threads option).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ and "OMP_NUM_THREADS" not in os.environ:
    _cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    _workers = max(1, int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(max(1, (_cpus or 1) // _workers))

import torch  # noqa: E402
from helpers import REPO, make_tiny_project  # noqa: E402

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


@pytest.fixture
def project(tmp_path):
    """A working directory with config/ (tiny config, 2 emotions x 2 prompts) and a voice."""
    return make_tiny_project(tmp_path)


def _once_per_run(tmp_path_factory, name: str, write) -> Path:
    """``write(path)`` once for the whole test run, under the run's root temporary directory:
    by the first pytest worker that needs it, while the others wait on a file lock. A write
    that failed half-way is written again by the next worker that asks."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's root
    out, done = shared / name, shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            shutil.rmtree(out, ignore_errors=True)  # a write that failed half-way
            write(out)
            done.touch()
    return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The `project` after one full `snakemake --profile profiles/local` run, made once per test
    run (by the first pytest worker that needs it, the others wait); use it through
    `ran_project` (or a copy of your own), never in place."""

    def write(root: Path) -> None:
        make_tiny_project(root)
        cmd = [
            str(Path(sys.executable).parent / "snakemake"), "--snakefile", str(REPO / "Snakefile"),
            "--directory", str(root), "--profile", str(REPO / "profiles/local"),
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"

    return _once_per_run(tmp_path_factory, "tiny-run", write)


@pytest.fixture(scope="session")
def tiny_fake_weights(tmp_path_factory) -> Path:
    """One `bestofn fake-weights --size tiny` tree (its default options) for the whole run,
    written once (a write is a NeMo model built and saved, among others); read-only for its
    users: a test that changes weight files works on a copy (helpers.copy_fake_weights)."""
    from bestofn.cli import main as bestofn

    def write(out: Path) -> None:
        assert bestofn(["fake-weights", str(out), "--size", "tiny"]) == 0

    return _once_per_run(tmp_path_factory, "tiny-fake-weights", write)


@pytest.fixture
def ran_project(tiny_run, tmp_path):
    """A copy of `tiny_run` (results, .snakemake records, mtimes and all): the same state as
    `project` after a full run, for the tests that start with exactly that run."""
    return Path(shutil.copytree(tiny_run, tmp_path / "ran", symlinks=True))


# The suite by kind (the markers are registered in pyproject.toml): `slurm` (needs the one-node
# SLURM of .ci/slurm-up.sh), `browser` (headless Chromium, .ci/chromium-up.sh), `gpu` (CUDA:
# skipped, with the reason, without one) and `slow` (tens of seconds: snakemake end to end,
# workers, production weights). `pytest -m "not slow and not slurm"` is the quick loop.
#
# With `pytest -n 2 --dist loadfile` (make test) a test file runs whole on one worker, and xdist
# hands the files out in collection order (pytest_configure below), so a long file handed out last
# would run alone at the end. The files with a `slurm` test go first, then those with a `slow`
# one, each group in collection order; no test depends on the order, it only balances the workers.
_FIRST = ("slurm", "slow")


def pytest_configure(config):
    # pytest-xdist's loadfile reorders the files by their number of tests unless told not to,
    # which would undo the order below (the SLURM file, few tests and the longest, went last).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    if not torch.cuda.is_available():
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(no_gpu)

    def kind(item) -> int:
        marks = {m.name for m in item.iter_markers()}
        return next((i for i, name in enumerate(_FIRST) if name in marks), len(_FIRST))

    by_file: dict = {}
    for item in items:
        by_file[item.path] = min(by_file.get(item.path, len(_FIRST)), kind(item))
    items.sort(key=lambda item: by_file[item.path])  # stable: each file keeps its own order
