"""VoiceCLAP scorer loaded the way a real checkpoint is: a local folder in the published file set
whose own remote code (configuration_voiceclap.py / modeling_voiceclap.py) defines the towers,
plus two head files. The remote code is ours (``bestofn.fakes.voiceclap``: the published one is
not public), tiny and random."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from bestofn.backends import registry  # noqa: E402
from bestofn.backends.voiceclap import MODEL_FILES, VoiceCLAPScorer, WeightsError  # noqa: E402
from bestofn.fakes import voiceclap as fake  # noqa: E402
from bestofn.util.spec import GroupSpec  # noqa: E402

DIM, WINDOW = 16, 3 * 16000  # the tiny model: 16-d joint space, 3-s chunks


def write_head(path: Path, bias: float, seed: int, numpy_stats: bool) -> Path:
    g = torch.Generator().manual_seed(seed)
    sd = {
        "f1.weight": torch.randn(16, DIM, generator=g),
        "f1.bias": torch.randn(16, generator=g),
        # small: the outputs stay inside the label range (a clamped 0 hides what the head read)
        "f2.weight": 0.02 * torch.randn(1, 16, generator=g),
        "f2.bias": torch.tensor([bias]),
    }
    mu, sd_ = np.full(DIM, 0.01, np.float32), np.full(DIM, 0.3, np.float32)
    if not numpy_stats:
        mu, sd_ = torch.from_numpy(mu), torch.from_numpy(sd_)
    torch.save(
        {"state_dict": sd, "mu": mu, "sd": sd_, "arch": {"D": DIM, "H": 16, "p": 0.33, "out": 1}},
        path,
    )
    return path


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vc")
    genu_dir = root / "genuineness"
    genu_dir.mkdir()
    return {
        "model_path": Path(fake.write(root, "tiny")["model_path"]),
        # the published heads keep mu/sd as numpy arrays (needs the full unpickler)
        "genuineness_path": write_head(
            genu_dir / "genu_commercial_best.pt", 3.0, 1, numpy_stats=True
        ),
        "blend_path": write_head(root / "blend_head_commercial.pt", 5.0, 2, numpy_stats=False),
    }


def build(weights, **kw):
    opts = {k: str(v) for k, v in weights.items()} | {"window_s": 3.0} | kw
    return registry.build("scorer", "voiceclap", opts)


def takes(n, sr=24000, seconds=1.5):
    rng = np.random.default_rng(1)
    t = np.arange(int(sr * seconds)) / sr
    return [
        (0.4 * np.sin(2 * np.pi * (120 + 90 * i) * t) + 0.1 * rng.standard_normal(t.size)).astype(
            np.float32
        )
        for i in range(n)
    ]


SPEC = GroupSpec(
    emotion="anger",
    prompt_id="p1",
    text="Get out!",
    n_takes=5,
    emotion_description="furious, shouting, barely controlled rage",
    negative_description="robotic, distorted",
)


def test_scores_match_an_independent_computation(weights):
    s = build(weights, batch_size=2)
    assert isinstance(s, VoiceCLAPScorer)
    audio = takes(5)
    out = s.score(audio, 24000, SPEC)
    assert set(out) == set(VoiceCLAPScorer.columns) and all(len(v) == 5 for v in out.values())

    # reference: the checkpoint's own towers, head math written out by hand
    model = transformers.AutoModel.from_pretrained(weights["model_path"], trust_remote_code=True)
    import soxr

    resampled = [soxr.resample(a, 24000, 16000) for a in audio]
    wav = np.stack([np.pad(r, (0, WINDOW - len(r))) for r in resampled])
    tok = transformers.AutoTokenizer.from_pretrained(weights["model_path"], trust_remote_code=True)
    enc = tok([SPEC.emotion_description, SPEC.negative_description], padding=True,
              return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        raw = model.encode_waveform(torch.from_numpy(wav).float())
        a = F.normalize(raw, dim=-1)
        t = F.normalize(model.encode_text(enc["input_ids"], enc["attention_mask"]), dim=-1)
    np.testing.assert_allclose(
        out["vc_prompt_sim"], (a @ t[0] - a @ t[1]).numpy(), rtol=1e-4, atol=1e-5
    )
    # LAION's recipe section 5: the genuineness head reads the L2-normalised embedding, the
    # blend head the raw one (each standardised by its own mu / sd)
    assert not torch.allclose(raw.norm(dim=-1), torch.ones(5))  # the two inputs differ here
    for col, key, hi, emb in (("vc_genuineness", "genuineness_path", 6, a),
                              ("vc_blend", "blend_path", 10, raw)):  # fmt: skip
        want = head_by_hand(weights[key], emb, hi)
        np.testing.assert_allclose(out[col], want, rtol=1e-4, atol=1e-5)
        other = head_by_hand(weights[key], raw if emb is a else a, hi)  # the other input
        assert not np.allclose(out[col], other, rtol=1e-3, atol=1e-3), col
    assert len(set(np.round(out["vc_prompt_sim"], 6))) > 1  # takes differ


def head_by_hand(path, emb, hi):
    """A published head's output on ``emb``, its math written out: standardise, MLP, clamp."""
    ck = torch.load(path, weights_only=False)
    x = (emb - torch.as_tensor(np.asarray(ck["mu"]))) / torch.as_tensor(np.asarray(ck["sd"]))
    h = x @ ck["state_dict"]["f1.weight"].T + ck["state_dict"]["f1.bias"]
    y = (
        0.5 * h * (1 + torch.erf(h / 2**0.5)) @ ck["state_dict"]["f2.weight"].T
        + ck["state_dict"]["f2.bias"]
    )
    return y.squeeze(-1).clamp(0, hi).numpy()


def test_one_audio_encode_per_take_and_texts_cached(weights):
    s = build(weights, batch_size=2)
    calls = {"wav": 0, "rows": 0, "text": 0}
    enc_w, enc_t = s.model.encode_waveform, s.model.encode_text

    def count_w(wav, **kw):
        calls["wav"] += 1
        calls["rows"] += wav.shape[0]
        return enc_w(wav, **kw)

    def count_t(ids, mask):
        calls["text"] += ids.shape[0]
        return enc_t(ids, mask)

    s.model.encode_waveform, s.model.encode_text = count_w, count_t
    s.score(takes(5), 24000, SPEC)
    s.score(takes(5), 24000, SPEC)
    assert calls == {"wav": 6, "rows": 10, "text": 2}  # 3 batches x 2 groups; 2 texts, once each


def test_negative_text_and_fallback(weights):
    s = build(weights)
    audio = takes(3)
    both = s.score(audio, 24000, SPEC)
    pos_only = s.score(
        audio, 24000, GroupSpec("anger", "p1", "x", 3, emotion_description=SPEC.emotion_description)
    )
    diff = np.array(pos_only["vc_prompt_sim"]) - np.array(both["vc_prompt_sim"])
    assert np.all(np.abs(diff) > 1e-6)  # the negative term is really subtracted
    bare = s.score(audio, 24000, GroupSpec("anger", "p1", "x", 3))
    by_name = s.score(audio, 24000, GroupSpec("anger", "p1", "x", 3, emotion_description="anger"))
    assert bare["vc_prompt_sim"] == by_name["vc_prompt_sim"]


def test_heads_clamp_to_label_range(weights, tmp_path):
    hot = write_head(tmp_path / "hot.pt", 1e4, 3, numpy_stats=False)
    cold = write_head(tmp_path / "cold.pt", -1e4, 4, numpy_stats=False)
    s = build(weights, genuineness_path=str(hot), blend_path=str(cold))
    out = s.score(takes(2), 24000, SPEC)
    assert out["vc_genuineness"] == [6.0, 6.0] and out["vc_blend"] == [0.0, 0.0]


def test_clear_errors(weights, tmp_path):
    with pytest.raises(WeightsError, match="model_path"):
        build(weights, model_path=str(tmp_path / "missing"))
    with pytest.raises(WeightsError, match="blend_path"):
        build(weights, blend_path=str(tmp_path / "missing.pt"))
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match="bad.pt"):
        build(weights, genuineness_path=str(bad))
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(WeightsError, match="state_dict/mu/sd"):
        build(weights, genuineness_path=str(tmp_path / "other.pt"))
    with pytest.raises(WeightsError, match="2 head files"):
        build(weights, genuineness_path=str(tmp_path))  # bad.pt + other.pt
    # a remote-code model without the text tower API is refused at load, not scored wrongly
    no_text = tmp_path / "no_text"
    shutil.copytree(weights["model_path"], no_text)
    code = (no_text / "modeling_voiceclap.py").read_text()
    (no_text / "modeling_voiceclap.py").write_text(code.replace("def encode_text", "def embed"))
    with pytest.raises(WeightsError, match="encode_text"):
        build(weights, model_path=str(no_text))


@pytest.mark.parametrize("name", MODEL_FILES)
def test_a_partial_folder_names_the_missing_file(weights, tmp_path, name):
    partial = tmp_path / "partial"
    shutil.copytree(weights["model_path"], partial)
    (partial / name).unlink()
    with pytest.raises(WeightsError, match=name.replace(".", r"\.")):
        build(weights, model_path=str(partial))


def test_a_wrong_folder_names_the_file(weights, tmp_path):
    from safetensors.torch import load_file, save_file

    wrong = tmp_path / "wrong"
    shutil.copytree(weights["model_path"], wrong)
    cfg = json.loads((wrong / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps(cfg | {"model_type": "whisper"}))
    with pytest.raises(WeightsError, match="config.json.*model_type"):
        build(weights, model_path=str(wrong))
    (wrong / "config.json").write_text(json.dumps(cfg))
    sd = load_file(wrong / "model.safetensors")  # weights of the text tower left out
    save_file({k: v for k, v in sd.items() if not k.startswith("text_")},
              wrong / "model.safetensors", metadata={"format": "pt"})  # fmt: skip
    with pytest.raises(WeightsError, match="model.safetensors.*lacks"):
        build(weights, model_path=str(wrong))
    (wrong / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(WeightsError, match="model.safetensors"):
        build(weights, model_path=str(wrong))


def test_the_published_layout(weights):
    folder = weights["model_path"]
    assert set(MODEL_FILES) <= {p.name for p in folder.iterdir()}
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "voiceclap-small" and cfg["embed_dim"] == DIM
    assert {"n_state", "n_layer", "text_hidden_size"} <= set(cfg)
    fe = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    assert fe.feature_size == 80 and fe.sampling_rate == 16000
    s = build(weights)  # the loaded weights are the file's, not a fresh init
    from safetensors.torch import load_file

    saved = load_file(folder / "model.safetensors")
    for name, param in s.model.named_parameters():
        torch.testing.assert_close(param.detach(), saved[name])
    real = fake.build_model(tiny=False).config  # the published sizes at real size
    assert (real.n_state, real.n_layer, real.n_mels, real.embed_dim) == (768, 12, 80, 768)
    assert (real.text_hidden_size, real.text_proj_hidden, real.text_num_layers) == (384, 576, 6)


def test_provenance_and_random_tiny_build(weights):
    p = build(weights).provenance()
    names = {Path(k).name for k in p["weights_sha256"]}
    assert {"model.safetensors", "modeling_voiceclap.py", "genu_commercial_best.pt"} <= names
    assert VoiceCLAPScorer.input_sample_rate == 16000
    from bestofn.fakes.voiceclap import build as random_build

    s = random_build("cpu", "tiny")
    out = s.score(takes(2, sr=16000), 16000, SPEC)
    assert all(len(v) == 2 for v in out.values())
    assert 0 <= min(out["vc_genuineness"]) and max(out["vc_blend"]) <= 10
