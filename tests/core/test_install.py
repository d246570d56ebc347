"""A plain (non-editable) install works: the package carries its schemas and nothing reads the
repository tree. Installs into a temporary directory, then runs `bestofn check` from outside
the repository with only that directory (and this venv's dependencies) to import from."""

import os
import shutil
import subprocess
import sys

from helpers import REPO


def test_check_from_a_plain_install_outside_the_repo(tmp_path):
    # Build from a copy holding only what the package build reads, so nothing of the checkout
    # (an editable install's egg-info, a build/ directory) can leak in or be written there.
    src = tmp_path / "src-copy"
    shutil.copytree(
        REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    shutil.copy(REPO / "pyproject.toml", src)
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--target", str(target), str(src)], check=True, timeout=600)
    assert (target / "bestofn/schemas/config.schema.yaml").is_file()
    # The lab (benchmarks, probes, fault injection) stays out of the wheel: lab/ at the root.
    shipped = [p.relative_to(target).as_posix() for p in (target / "bestofn").rglob("*.py")]
    lab_code = [p for p in shipped if any(w in p for w in ("bench", "probe", "fault", "opcount"))]
    assert not lab_code, lab_code
    assert (target / "bestofn/parity/local.py").is_file()  # `bestofn parity` stays a user command

    # The workflow's sheets and config, away from the repository.
    work = tmp_path / "work"
    shutil.copytree(REPO / "config", work / "config")
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = (
        "import sys, bestofn.cli; print('FROM', bestofn.cli.__file__);"
        "sys.exit(bestofn.cli.main(['check', '--config', 'config/config.yaml']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"FROM {target}/bestofn/cli.py" in proc.stdout
    assert "ok: 12 groups x 8 takes" in proc.stdout

    # The same through `python -m bestofn.cli`, and a bad option still names its field.
    config = (work / "config/config.yaml").read_text().replace("noise_scale", "noise_scal")
    (work / "bad.yaml").write_text(config)
    proc = subprocess.run(
        [sys.executable, "-m", "bestofn.cli", "check", "--config", "bad.yaml"],
        cwd=work, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "did you mean 'noise_scale'?" in proc.stderr
