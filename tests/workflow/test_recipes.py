"""The four shipped recipes (config/recipes/*.yaml) run end to end through snakemake on tiny
random weights in the published layouts (``bestofn fake-weights``), each as shipped except for
what makes a CPU run small: the weights folder, the device, 2 takes of two groups (the Anger
and Jealousy_Envy rows of the recipe's own emotions sheet, whose heads the tiny Empathic-Insight
fake has, so that ei_spec has two heads to compare; one prompt each of its prompts sheet), a
frame-budget cap and small batches. Everything a recipe says
about models, prompts, sampling, pacing, restorer, scorers and selection runs as written, and
the takes show it (rate, restorer, columns, provenance)."""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
from pathlib import Path

import duckdb
import pytest
import yaml
from helpers import REPO, snakemake, verify

from bestofn.cli import main as bestofn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(importlib.util.find_spec(m) for m in ("transformers", "nemo")),
        reason="the production backends need transformers and nemo_toolkit[asr]",
    ),
]
# every shipped recipe: a new one is its config (and its sheets), nothing here
RECIPES = sorted(p.stem for p in (REPO / "config" / "recipes").glob("*.yaml"))


@pytest.fixture(scope="module")
def weights(tiny_fake_weights) -> Path:
    return tiny_fake_weights  # read only: every recipe's run writes under its project


def first_rows(path: Path, keep) -> list[list[str]]:
    rows = list(csv.reader(path.open(encoding="utf-8"), delimiter="\t"))
    return [rows[0], *[r for r in rows[1:] if keep(r)]]


def write_rows(path: Path, rows) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        csv.writer(f, delimiter="\t", lineterminator="\n").writerows(rows)


def small(recipe: dict, weights: Path) -> dict:
    """The recipe, sized for a CPU test (the keys changed are named in the docstring)."""
    c = {**recipe, "weights_root": str(weights), "device": "cpu", "takes": 2}
    models = c["models"]
    gen = models["generator"]
    gen["options"] = {**gen["options"], "max_frames": 16}  # the budget's cap: short CPU takes
    gen["runtime"] = {"batch_size": 2, "decode_batch_size": 2, "pair_groups": False}
    if "restorer" in models:
        models["restorer"]["runtime"] = {"batch_size": 2}
    for s in models["scorers"]:
        if s["backend"] in ("parakeet", "voiceclap", "empathic-insight"):
            s["runtime"] = {"batch_size": 4}
    c["runtime"] = {**c["runtime"], "queue_depth": 2, "idle_timeout_s": 120,
                    "start_timeout_s": 600}  # fmt: skip
    return c


def project_for(tmp_path: Path, name: str, weights: Path) -> tuple[Path, Path, dict]:
    """A workflow directory with the repository's config/ (the recipes' sheets), the recipe's
    sheets cut to one group, and the small recipe config."""
    project = tmp_path / "project"
    shutil.copytree(REPO / "config", project / "config")
    recipe = yaml.safe_load((REPO / f"config/recipes/{name}.yaml").read_text())
    for key, keep in (
        ("emotions", lambda r: r[0] in ("Anger", "Jealousy_Envy")),
        # p001 is read by every emotion; the others were written for one
        ("prompts", lambda r: r[0] in ("p001", "anger_1", "jealousy_envy_1")),
    ):
        write_rows(project / recipe[key], first_rows(REPO / recipe[key], keep))
    config = project / f"config/recipes/{name}.yaml"
    config.write_text(yaml.safe_dump(small(recipe, weights)))
    return project, config, recipe


EXPECT = {
    # recipe: (generator folder, restorer that ran, speaker scorer, audio temperature)
    "emotions": ("moss-tts-local-transformer-4.55b-voice-acting", "identity", False, 0.8),
    "clone": ("moss-tts-local-transformer-4.55b-voice-acting", "identity", True, 1.0),
    "delay": ("moss-tts-v1.5-8b-voice-acting", "sidon", False, 0.8),
    "base": ("MOSS-TTS-Local-Transformer-v1.5", "sidon", True, 1.7),
}


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_end_to_end(name, weights, tmp_path, capsys):
    project, config, recipe = project_for(tmp_path, name, weights)
    assert bestofn(["check", "--config", str(config), "--base", str(project)]) == 0
    warned = "sidon restores a 48000 Hz generator" in capsys.readouterr().err
    assert warned == (name == "base")  # Sidon on a 48 kHz-native generator: only base keeps it
    snakemake(project, "--configfile", str(config))
    assert "2 groups checked, 0 problem(s)" in verify(project)

    folder, restorer, speaker, temperature = EXPECT[name]
    con = duckdb.connect(str(project / "results/bestofn.duckdb"), read_only=True)
    columns = {row[0] for row in con.execute("DESCRIBE takes").fetchall()}
    rows = con.execute("SELECT sample_rate, models FROM takes").fetchall()
    groups = con.execute("SELECT count(*) FROM groups").fetchone()[0]
    con.close()
    assert len(rows) == 4 and groups == 2
    # every recipe: the volume and the truncation check, the emotion scorers; the speaker
    # scorer only where the recipe has one
    assert {"vol_rms_db", "vol_peak_db", "finished", "wer", "ei_target", "vc_blend"} <= columns
    assert ("spk_sim" in columns) == speaker
    assert {rate for rate, _ in rows} == {48000}  # codec v2 raw, or Sidon's 48 kHz
    models = json.loads(rows[0][1])
    gen = models["generator"]
    assert Path(gen["model_dir"]).name == folder
    assert models["restorer"]["backend"] == restorer
    assert gen["sampling"]["temperature"] == temperature
    assert gen["frame_budget"]["min_tokens"] == 96 and gen["frame_budget"]["budget_scale"] == 2.2
    if name == "delay":
        assert gen["local_attention"] == "none (Delay)"  # the Delay engine ran
    if name == "clone":  # the group's instruction is empty, its voice the sheet's
        from bestofn.core.config import load_config
        from bestofn.core.plan import build_plan

        for spec in build_plan(load_config(config), project).groups.values():
            assert not spec.extra.get("instruction") and spec.reference_audio
        assert json.loads(rows[0][1])["scorers"][-1]["backend"] == "wavlm-speaker"
