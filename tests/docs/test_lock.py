"""requirements/lock.txt, the constraints file `make install` uses: it pins every dependency
pyproject.toml declares, leaves torch (and what only torch needs) to the Makefile's TORCH, and
is what this environment was installed from."""

import importlib.metadata as md
import importlib.util
import re
import tomllib

from helpers import REPO

LOCK = REPO / "requirements/lock.txt"


def _refresh_lock():
    # by path: an installed distribution (requirements-parser) owns the name `requirements`
    spec = importlib.util.spec_from_file_location("refresh_lock", LOCK.with_name("refresh_lock.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pins() -> dict[str, str]:
    out = {}
    for line in LOCK.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if m:
            out[norm(m.group(1))] = m.group(2)
    return out


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]
    return {norm(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in reqs}


def test_the_lock_pins_every_declared_dependency_but_torch():
    locked = pins()
    assert "torch" not in locked
    missing = declared() - set(locked)
    assert not missing, f"not in {LOCK}: {sorted(missing)} (run `make lock`)"


def test_this_environment_follows_the_lock():
    """`make install` installs with -c requirements/lock.txt: every locked distribution that
    is installed has the locked version (a dependency installed by hand shows here)."""
    off = {}
    for name, version in pins().items():
        try:
            installed = md.version(name)
        except md.PackageNotFoundError:
            continue  # e.g. a platform marker left it out here
        if installed != version:
            off[name] = (installed, version)
    assert not off, f"installed vs locked: {off} (make install, or make lock after a change)"


def test_what_only_torch_needs_is_left_to_torch():
    compiled = (
        "filelock==3.20.0\n    # via\n    #   huggingface-hub\n    #   torch\n"
        "nvidia-cudnn-cu13==9.13.0\n    # via torch\n"
        "nvidia-cublas-cu13==13.1.0\n    # via\n    #   nvidia-cudnn-cu13\n    #   torch\n"
        "numpy==2.4.6\n    # via bestofn (pyproject.toml)\n"
        "\n# The following packages are considered to be unsafe in a requirements file:\n"
        "# torch\n"
    )
    kept = _refresh_lock().torch_only(compiled)
    assert "filelock==3.20.0" in kept and "numpy==2.4.6" in kept  # others need them too
    assert "nvidia" not in kept  # torch's CUDA libraries: the build TORCH chooses brings its own
