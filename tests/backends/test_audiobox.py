"""The Audiobox Aesthetics scorer loads tiny random weights in both published layouts
(config.json + model.safetensors, and checkpoint.pt) and scores audio: the numbers the loaded
model gives are those of the model that was written, takes over 10 s are scored window by
window, and a folder that is not the published layout is refused by name."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from bestofn.backends.audiobox import (
    SAMPLE_RATE,
    AudioboxAestheticsScorer,
    WeightsError,
    load_model,
    published_wavlm_name,
    wavlm_name,
)
from bestofn.backends.registry import backend_class
from bestofn.fakes import audiobox as fake
from bestofn.util.spec import GroupSpec

SPEC = GroupSpec("calm", "p1", "Good morning.", 3)


def _clips():
    rng = np.random.default_rng(0)
    t = np.arange(int(12.5 * SAMPLE_RATE)) / SAMPLE_RATE
    tone = (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    return [
        tone,  # two windows: 10 s and 2.5 s
        (0.05 * rng.standard_normal(SAMPLE_RATE)).astype(np.float32),  # 1 s of noise
        tone[: 3 * SAMPLE_RATE] * 0.5,
    ]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return fake.write(tmp_path_factory.mktemp("aes"), "tiny", seed=0)["model_path"]


def test_published_layout_loads_and_scores(folder):
    scorer = AudioboxAestheticsScorer(model_path=folder)
    out = scorer.score(_clips(), SAMPLE_RATE, SPEC)
    assert list(out) == ["aes_ce", "aes_cu", "aes_pc", "aes_pq"]
    values = np.array(list(out.values()))
    assert values.shape == (4, 3) and np.isfinite(values).all()
    assert len({round(v, 9) for v in out["aes_pq"]}) == 3  # different audio, different scores
    # the loaded model is the model that was written (every tensor went where it belongs)
    written, _ = fake.build_model(tiny=True, seed=11)
    direct = AudioboxAestheticsScorer.from_model(written).score(_clips(), SAMPLE_RATE, SPEC)
    np.testing.assert_allclose(values, np.array(list(direct.values())), rtol=0, atol=1e-5)
    hashed = {Path(f).name for f in scorer.provenance()["weights_sha256"]}
    assert hashed == {"config.json", "model.safetensors"}
    # a 48 kHz stereo take is brought to 16 kHz mono by the scorer itself
    stereo = np.repeat(np.repeat(_clips()[2][:, None], 3, axis=0), 2, axis=1)
    again = scorer.score([stereo], 48000, SPEC)
    assert abs(again["aes_pq"][0] - out["aes_pq"][2]) < 0.05


def test_the_published_tensor_names(folder):
    """Spot checks of names the published module has (facts: docs/notes/scorers-facts.md)."""
    names = set(load_file(f"{folder}/model.safetensors"))
    for name in (
        "wavlm_model.mask_emb",
        "wavlm_model.feature_extractor.conv_layers.0.0.weight",
        "wavlm_model.feature_extractor.conv_layers.0.2.bias",
        "wavlm_model.post_extract_proj.weight",
        "wavlm_model.encoder.pos_conv.0.weight_g",
        "wavlm_model.encoder.pos_conv.0.weight_v",
        "wavlm_model.encoder.layers.0.self_attn.relative_attention_bias.weight",
        "wavlm_model.encoder.layers.1.self_attn.grep_linear.weight",
        "wavlm_model.encoder.layers.1.final_layer_norm.bias",
        "proj_layer.PQ.0.weight",
        "layer_weights.CE",
    ):
        assert name in names, name
    assert not any(n.startswith(("wavlm.", "heads.")) for n in names)
    assert published_wavlm_name(wavlm_name("encoder.layers.3.fc2.bias")) == (
        "encoder.layers.3.fc2.bias"
    )


def test_windows_are_weighted_by_their_length(folder):
    scorer = AudioboxAestheticsScorer(model_path=folder)
    clip = _clips()[0]
    cut = 10 * SAMPLE_RATE
    whole = scorer.axes([clip])[0]
    first, rest = scorer.axes([clip[:cut], clip[cut:]])
    np.testing.assert_allclose(whole, (1.0 * first + 0.25 * rest) / 1.25, atol=1e-5)
    # an empty take has no score (NaN), and does not disturb the others'
    empty = np.zeros(0, np.float32)
    both = scorer.axes([empty, clip])
    assert np.isnan(both[0]).all()
    np.testing.assert_allclose(both[1], whole, atol=1e-5)
    assert np.isnan(scorer.axes([empty])).all()


def test_checkpoint_form_gives_the_same_scores(folder, tmp_path):
    ckpt = fake.write_checkpoint(tmp_path / "checkpoint.pt", "tiny", seed=0)
    a = AudioboxAestheticsScorer(model_path=folder).score(_clips(), SAMPLE_RATE, SPEC)
    b = AudioboxAestheticsScorer(model_path=str(ckpt)).score(_clips(), SAMPLE_RATE, SPEC)
    np.testing.assert_allclose(list(a.values()), list(b.values()), atol=1e-6)
    # a folder holding only checkpoint.pt loads too
    assert load_model(str(tmp_path))[1] == [ckpt]
    # the later hub export: the same tensors under "encoder."
    hub = tmp_path / "hub"
    hub.mkdir()
    state = load_file(f"{folder}/model.safetensors")
    save_file({f"encoder.{k}": v for k, v in state.items()}, str(hub / "model.safetensors"))
    (hub / "config.json").write_text(Path(folder, "config.json").read_text())
    c = AudioboxAestheticsScorer(model_path=str(hub)).score(_clips(), SAMPLE_RATE, SPEC)
    np.testing.assert_allclose(list(a.values()), list(c.values()), atol=1e-6)


def test_not_the_published_layout_is_refused(folder, tmp_path):
    with pytest.raises(WeightsError, match="does not exist"):
        load_model(str(tmp_path / "nowhere"))
    with pytest.raises(WeightsError, match="neither config.json"):
        load_model(str(tmp_path))
    broken = tmp_path / "broken"
    broken.mkdir()
    state = load_file(f"{folder}/model.safetensors")
    del state["wavlm_model.encoder.layers.1.fc1.weight"]
    state["wavlm_model.extra.weight"] = torch.zeros(2)
    save_file(state, str(broken / "model.safetensors"))
    config = json.loads(Path(folder, "config.json").read_text())
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match=r"1 missing .*1 unknown") as e:
        load_model(str(broken))
    assert str(broken) in str(e.value)
    del config["target_transform"]["PQ"]
    (broken / "config.json").write_text(json.dumps(config))
    save_file(load_file(f"{folder}/model.safetensors"), str(broken / "model.safetensors"))
    with pytest.raises(WeightsError, match="target_transform must give mean and std"):
        load_model(str(broken))
    (broken / "config.json").unlink()
    with pytest.raises(WeightsError, match="config.json' is missing"):
        load_model(str(broken))


def test_registered_with_its_columns_and_directions():
    cls = backend_class("scorer", "audiobox-aesthetics")
    assert cls is AudioboxAestheticsScorer
    assert cls.input_sample_rate == SAMPLE_RATE
    assert cls.better == {"aes_ce": "higher", "aes_cu": "higher", "aes_pq": "higher"}
    assert {"model_path", "dtype", "batch_size", "cache_dir"} <= cls.known_options()


@pytest.mark.slow  # snakemake end to end
def test_a_run_scores_and_selects_on_audiobox_axes(tmp_path):
    """piper -> identity -> duration + audiobox-aesthetics (tiny fake weights) through
    snakemake: every take has the four axes, and the selection follows ``aes_pq``."""
    import duckdb
    import yaml
    from helpers import make_tiny_project, snakemake, tiny_config, verify

    project = make_tiny_project(tmp_path / "project")
    options = fake.write(project / "weights", "tiny", seed=0)
    config = tiny_config(
        models={
            "generator": {"backend": "piper"},
            "restorer": {"backend": "identity"},
            "scorers": [
                {"backend": "duration"},
                {
                    "backend": "audiobox-aesthetics",
                    "options": {"model_path": "weights/" + fake.FOLDER, "batch_size": 4},
                },
            ],
        },
        selection={"filter": "words_per_s > 0.5", "score": "aes_pq"},
    )
    (project / "config/config.yaml").write_text(yaml.safe_dump(config))
    assert Path(options["model_path"]).is_dir()
    snakemake(project)
    assert "4 groups checked, 0 problem(s)" in verify(project)
    con = duckdb.connect(str(project / "results/bestofn.duckdb"), read_only=True)
    try:
        counts = con.execute(
            "SELECT count(*), count(aes_ce), count(aes_cu), count(aes_pc), count(aes_pq), "
            "count(DISTINCT aes_pq) FROM takes"
        ).fetchone()
        picked = con.execute(
            "SELECT s.group_id, s.take, arg_max(t.take, t.aes_pq) FROM selection s JOIN takes t "
            "USING (group_id) WHERE t.words_per_s > 0.5 GROUP BY s.group_id, s.take"
        ).fetchall()
    finally:
        con.close()
    assert counts[:5] == (8,) * 5 and counts[5] > 1
    assert picked and all(take == best for _, take, best in picked)
