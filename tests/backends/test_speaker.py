"""The wavlm-speaker scorer on tiny random weights in the published wavlm-base-plus-sv layout."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("transformers")

from helpers import REPO

from bestofn.backends import registry  # noqa: E402
from bestofn.backends.speaker import SpeakerScorer, WeightsError  # noqa: E402
from bestofn.fakes import speaker as fake  # noqa: E402
from bestofn.util.audio import load_audio  # noqa: E402
from bestofn.util.spec import GroupSpec  # noqa: E402

VOICE = REPO / "config" / "voices" / "joe_reference.flac"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return Path(fake.write(tmp_path_factory.mktemp("spk"), "tiny")["model_path"])


@pytest.fixture(scope="module")
def scorer(folder):
    return registry.build("scorer", "wavlm-speaker", {"model_path": str(folder)})


def other_voice(n: int, sr: int = 16000) -> np.ndarray:
    """A clearly different signal: a high, buzzy square-ish tone with noise."""
    rng = np.random.default_rng(1)
    t = np.arange(n) / sr
    return (0.3 * np.sign(np.sin(2 * np.pi * 620 * t)) + 0.2 * rng.standard_normal(n)).astype(
        np.float32
    )


def test_loads_the_published_layout(scorer, folder):
    from safetensors.torch import load_file

    assert isinstance(scorer, SpeakerScorer)
    assert {p.name for p in folder.iterdir()} == {
        "config.json",
        "preprocessor_config.json",
        "model.safetensors",
    }
    saved = load_file(folder / "model.safetensors")
    for name, param in scorer.model.named_parameters():  # the file's weights, not a fresh init
        np.testing.assert_array_equal(param.detach().numpy(), saved[name].numpy())
    p = scorer.provenance()
    assert p["backend"] == "wavlm-speaker" and "model.safetensors" in str(p["weights_sha256"])


def test_the_references_own_voice_scores_higher(scorer, tmp_path):
    voice, _ = load_audio(VOICE, sample_rate=16000)
    other = other_voice(voice.size)
    spec = GroupSpec(
        emotion="calm", prompt_id="p1", text="hi", n_takes=2, reference_audio=str(VOICE)
    )
    out = scorer.score([voice, other], 16000, spec)
    assert out["spk_ref"] == ["reference", "reference"]
    own, stranger = out["spk_sim"]
    assert own > 0.999 and stranger < own
    # the reference is embedded once per worker, keyed by content: a copy elsewhere reuses it
    copy = tmp_path / "copy.flac"
    shutil.copyfile(VOICE, copy)
    again = scorer.score([voice, other], 16000, spec.__class__(**{**spec.__dict__,
                         "reference_audio": str(copy)}))  # fmt: skip
    assert again["spk_sim"] == out["spk_sim"] and len(scorer._references) == 1
    # a reference whose content changed is embedded anew
    sf.write(copy, other, 16000)
    changed = scorer.score([voice, other], 16000, spec.__class__(**{**spec.__dict__,
                           "reference_audio": str(copy)}))  # fmt: skip
    assert changed["spk_sim"][1] > 0.999 and changed["spk_sim"][0] < changed["spk_sim"][1]


def test_without_a_reference_the_group_centroid(scorer):
    voice, _ = load_audio(VOICE, sample_rate=16000)
    spec = GroupSpec(emotion="calm", prompt_id="p1", text="hi", n_takes=3)
    out = scorer.score([voice, voice, other_voice(voice.size)], 16000, spec)
    assert out["spk_ref"] == ["group_centroid"] * 3
    a, b, c = out["spk_sim"]
    assert a == pytest.approx(b) and c < a  # the odd one out is farthest from the centroid


@pytest.mark.parametrize(
    "damage, named",
    [
        ("config.json", "config.json"),
        ("preprocessor_config.json", "preprocessor_config.json"),
        ("model.safetensors", "no weights"),
        ("truncate", "model.safetensors"),
        ("partial", "model.safetensors"),
        ("architecture", "config.json"),
    ],
)
def test_a_wrong_or_partial_folder_names_the_file(folder, tmp_path, damage, named):
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    weights = bad / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "partial":
        from safetensors.torch import load_file, save_file

        sd = load_file(weights)
        save_file({k: v for k, v in sd.items() if not k.startswith("tdnn")}, weights,
                  metadata={"format": "pt"})  # fmt: skip
    elif damage == "architecture":
        cfg = (bad / "config.json").read_text()
        (bad / "config.json").write_text(cfg.replace("WavLMForXVector", "WavLMModel"))
    else:
        (bad / damage).unlink()
    with pytest.raises(WeightsError, match=named):
        SpeakerScorer(model_path=str(bad))


def test_missing_option_is_named():
    with pytest.raises(WeightsError, match="model_path"):
        SpeakerScorer(model_path=None)
