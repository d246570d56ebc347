"""Every profile sets what the workflow relies on (docs/ARCHITECTURE.md, "Data layout"):

- ``force-use-threads``: group jobs are run: blocks, run in Snakemake's threads (no Python
  process per group);
- ``replace-workflow-config``: --configfile replaces config/config.yaml, so a production config
  does not inherit the embedded default's backend options;
- ``rerun-triggers`` without ``code``: editing bestofn never reruns finished groups."""

import pytest
import yaml
from helpers import REPO

PROFILES = sorted(p.parent.name for p in (REPO / "profiles").glob("*/config.yaml"))


def test_the_profiles_are_the_documented_ones():
    assert PROFILES == ["a100x8", "local", "slurm"]
    readme = (REPO / "README.md").read_text()
    assert all(f"`profiles/{name}`" in readme for name in PROFILES)


@pytest.mark.parametrize("name", PROFILES)
def test_profile_sets_what_the_workflow_relies_on(name):
    profile = yaml.safe_load((REPO / "profiles" / name / "config.yaml").read_text())
    assert profile.get("force-use-threads") is True, name
    assert profile.get("replace-workflow-config") is True, name
    triggers = profile.get("rerun-triggers")
    assert triggers and "code" not in triggers, (name, triggers)
    assert {"params", "input"} <= set(triggers), (name, triggers)  # a group's identity


def _resources(profile: dict) -> dict[str, str]:
    return dict(r.split("=", 1) for r in profile.get("resources") or [])


@pytest.mark.parametrize("name", PROFILES)
def test_gpu_means_gpus_in_every_profile(name):
    """`gpu` is the GPUs a job gets of its own (SLURM's --gpus), wherever it appears; group jobs
    in flight are `group_slots`, a resource of the group rule that the local profiles cap."""
    profile = yaml.safe_load((REPO / "profiles" / name / "config.yaml").read_text())
    resources = _resources(profile)
    rule = (REPO / "workflow/rules/generate.smk").read_text()
    assert "group_slots=1," in rule and "gpu=" not in rule
    if profile.get("executor") == "slurm":
        # one GPU per SLURM job, its bundled groups in turn on it (scope local: per job)
        assert profile["set-resources"]["group"]["gpu"] == 1
        assert resources == {"gpu": "1"} and "gpu=local" in profile["set-resource-scopes"]
    else:
        # the local executor: workers take the GPUs of CUDA_VISIBLE_DEVICES; no job gets one
        assert "gpu" not in resources and "gpu" not in str(profile.get("set-resources") or "")
        assert int(resources["group_slots"]) >= 1
