import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> Path:
    """One tiny `bestofn fake-weights` tree per pytest worker, as the GPU scripts write theirs
    (takes pinned by p_stop ~0, no Delay model, the calibrated Parakeet), shared by every
    smoke test of a GPU script; read-only for them (each writes its project elsewhere)."""
    out = tmp_path_factory.mktemp("tiny-weights") / "weights"
    cmd = [sys.executable, "-m", "bestofn.cli", "fake-weights", str(out), "--size", "tiny",
           "--p-stop", "1e-9", "--no-delay", "--parakeet", "calibrated"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out
