"""Every hand-written Triton kernel compiles for the GPUs the product runs on (sm_80, sm_90),
here, with no GPU (``kernels_for_gpus.py``: Triton's compiler and the wheel's ptxas)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

SCRIPT = Path(__file__).with_name("kernels_for_gpus.py")


@pytest.mark.slow  # about 20 s of compiling on one core
def test_every_triton_kernel_compiles_for_a100_and_h100(tmp_path):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (CPU torch wheels lack it; the `dev` extra has it)")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TRITON_CACHE_DIR": str(tmp_path)}
    env.pop("TRITON_INTERPRET", None)  # compiled for the GPU, not interpreted
    done = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for gpu in ("sm_80", "sm_90"):
        names = {line.split(": ", 1)[1].split(" (")[0] for line in lines if f"ok {gpu}" in line}
        assert {"ring_heads bf16", "ring_attention bf16", "window_attention bf16",
                "heads_rope bf16", "residual_layer_norm bf16", "decode attention partial bf16",
                "sidon snake channels last"} <= names, lines  # fmt: skip
