"""Empathic-Insight scorer on a tiny Whisper + random heads saved in the published layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

transformers = pytest.importorskip("transformers")

from bestofn.backends import registry  # noqa: E402
from bestofn.backends.empathic import EmpathicInsightScorer, WeightsError  # noqa: E402
from bestofn.util.spec import GroupSpec  # noqa: E402

SEQ, D = 150, 16  # tiny encoder: 3 s window -> 150 positions of width 16
SPEC = GroupSpec(emotion="anger", prompt_id="p1", text="hello", n_takes=3)


class PublishedHead(nn.Module):
    """The head as published (proj, then ReLU/Dropout/Linear blocks); written here independently
    of the backend so it serves as the naive per-head reference."""

    def __init__(self, in_dim, proj=64, hidden=(64, 32, 16)):
        super().__init__()
        self.proj = nn.Linear(in_dim, proj)
        layers, cur = [nn.ReLU(), nn.Dropout(0.0)], proj
        for i, h in enumerate(hidden):
            layers += [nn.Linear(cur, h), nn.ReLU(), nn.Dropout(0.1)]
            cur = h
            del i
        layers.append(nn.Linear(cur, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, x):
        return self.mlp(self.proj(x.flatten(1))).squeeze(-1)


def reference_pool(states):
    return torch.cat([states.mean(1), states.min(1).values, states.max(1).values, states.std(1)], 1)


HEADS = {  # file stem -> (input kind, torch.compile prefix?)
    "model_Anger_best": ("flat", True),
    "model_Jealousy_&_Envy_best": ("flat", False),
    "model_Gender_best": ("flat", True),
    "model_score_overall_quality_best": ("pooled", False),
    "model_score_content_enjoyment_best": ("pooled", True),
}


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ei")
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(
        d_model=D,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_layers=1,
        decoder_attention_heads=2,
        decoder_ffn_dim=32,
        num_mel_bins=16,
        max_source_positions=SEQ,
        vocab_size=64,
        max_target_positions=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    # BUD-E-Whisper is a full ASR checkpoint; save the same class so the encoder is pulled out of it
    transformers.WhisperForConditionalGeneration(cfg).save_pretrained(root / "encoder")
    transformers.WhisperFeatureExtractor(feature_size=16, chunk_length=3).save_pretrained(
        root / "encoder"
    )
    heads = root / "heads"
    heads.mkdir()
    for stem, (kind, compiled) in HEADS.items():
        sd = PublishedHead(SEQ * D if kind == "flat" else 4 * D).state_dict()
        if compiled:
            sd = {"_orig_mod." + k: v for k, v in sd.items()}
        torch.save(sd, heads / f"{stem}.pth")
    (heads / "README.md").write_text("not a head")
    (heads / "demo.mp3").write_bytes(b"\xff\xfb")
    return root


def load_reference(path: Path) -> PublishedHead:
    sd = {k.replace("_orig_mod.", ""): v for k, v in torch.load(path).items()}
    m = PublishedHead(sd["proj.weight"].shape[1])
    m.load_state_dict(sd)
    return m.eval()


def clips(n=3, sr=24000, seconds=2.0, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(int(sr * seconds)) / sr
    return [
        (0.3 * np.sin(2 * np.pi * (150 + 60 * i) * t) + 0.05 * rng.standard_normal(t.size)).astype(
            np.float32
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def scorer(weights):
    return EmpathicInsightScorer(
        encoder_path=str(weights / "encoder"),
        heads_path=str(weights / "heads"),
        batch_size=2,
        dtype="float32",
    )


def test_registry_builds_it_by_name(weights):
    s = registry.build(
        "scorer",
        "empathic-insight",
        {
            "encoder_path": str(weights / "encoder"),
            "heads_path": str(weights / "heads"),
            "dtype": "float32",
        },
    )
    assert isinstance(s, EmpathicInsightScorer)


def test_columns_discovered_from_directory(scorer):
    assert scorer.columns == {
        "ei_anger": "DOUBLE",
        "ei_jealousy_envy": "DOUBLE",
        "ei_gender": "DOUBLE",
        "ei_score_overall_quality": "DOUBLE",
        "ei_score_content_enjoyment": "DOUBLE",
        "ei_target": "DOUBLE",
    }
    kinds = {h: v["input"] for h, v in scorer.provenance()["heads"].items()}
    assert kinds["Jealousy_&_Envy"] == "flat" and kinds["score_content_enjoyment"] == "pooled"
    # one stacked group per input kind: the flat heads' first layers are one matrix
    assert sorted((k, len(n)) for k, n, _ in scorer.groups) == [("flat", 3), ("pooled", 2)]
    assert scorer.columns is not EmpathicInsightScorer.columns


def test_stacked_heads_equal_naive_loop(scorer, weights):
    audio16 = [c[::3][: 16000 * 2] for c in clips()]  # any 16 kHz clips
    states = scorer.encode(audio16)
    assert states.shape == (3, SEQ, D)
    batched = scorer.heads_from_states(states)
    with torch.no_grad():
        for stem, (kind, _) in HEADS.items():
            ref = load_reference(weights / "heads" / f"{stem}.pth")
            x = states if kind == "flat" else reference_pool(states)
            want = ref(x)
            got = batched[stem[len("model_") : -len("_best")]]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_bf16_heads_close_to_fp32_reference(weights, scorer):
    bf16 = EmpathicInsightScorer(
        encoder_path=str(weights / "encoder"), heads_path=str(weights / "heads"), dtype="bfloat16"
    )
    assert bf16.groups[0][2].w0.dtype == torch.bfloat16
    states = scorer.encode([c[::3] for c in clips()])  # fp32 states into both
    fp32, half = scorer.heads_from_states(states), bf16.heads_from_states(states)
    for name in fp32:
        scale = fp32[name].abs().max().item() + 1e-3
        assert (half[name] - fp32[name]).abs().max().item() < 0.05 * scale + 2e-3, name


def test_score_end_to_end(scorer):
    takes = clips(3)
    out = scorer.score(takes, 24000, SPEC)
    assert set(out) == set(scorer.columns)
    assert all(len(v) == 3 and all(np.isfinite(v)) for v in out.values())
    # batch size changes nothing; stereo is downmixed; audio past the window is ignored
    one = EmpathicInsightScorer.__new__(EmpathicInsightScorer)
    one.__dict__.update(scorer.__dict__, batch_size=1)
    stereo = [np.stack([c, c], axis=1) for c in takes]
    longer = [np.concatenate([c, np.ones(24000 * 3, np.float32)]) for c in takes]
    for other in (one.score(takes, 24000, SPEC), scorer.score(stereo, 24000, SPEC)):
        for col in out:
            np.testing.assert_allclose(other[col], out[col], rtol=1e-4, atol=1e-5)
    # different audio gives different scores (the heads do read the audio)
    assert out["ei_anger"][0] != out["ei_anger"][1]
    padded = scorer.score(longer, 24000, SPEC)
    cut = scorer.score(
        [np.concatenate([c, np.ones(24000, np.float32)]) for c in takes], 24000, SPEC
    )
    np.testing.assert_allclose(padded["ei_anger"], cut["ei_anger"], rtol=1e-4, atol=1e-5)


def test_provenance_hashes_weight_files(weights, tmp_path):
    import hashlib

    s = EmpathicInsightScorer(
        encoder_path=str(weights / "encoder"),
        heads_path=str(weights / "heads"),
        cache_dir=str(tmp_path),
    )
    p = s.provenance()
    assert p["backend"] == "empathic-insight"
    by_name = {Path(k).name: v for k, v in p["weights_sha256"].items()}
    assert {"model_Anger_best.pth", "config.json"} <= set(by_name) and "README.md" not in by_name
    anger = (weights / "heads" / "model_Anger_best.pth").read_bytes()
    assert by_name["model_Anger_best.pth"] == hashlib.sha256(anger).hexdigest()
    assert len(list((tmp_path / "hash-memo").iterdir())) == len(by_name)  # memo for later starts
    # the pipeline resamples once for 16 kHz scorers; the config check knows columns are dynamic
    assert (
        EmpathicInsightScorer.input_sample_rate == 16000 and EmpathicInsightScorer.dynamic_columns
    )


def test_clear_errors(weights, tmp_path):
    enc, heads = str(weights / "encoder"), str(weights / "heads")
    with pytest.raises(WeightsError, match="encoder_path"):
        EmpathicInsightScorer(encoder_path=str(tmp_path / "nope"), heads_path=heads)
    with pytest.raises(WeightsError, match="heads_path"):
        EmpathicInsightScorer(encoder_path=enc, heads_path=None)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(WeightsError, match="no head files"):
        EmpathicInsightScorer(encoder_path=enc, heads_path=str(empty))
    with pytest.raises(WeightsError, match="encoder_path"):
        EmpathicInsightScorer(encoder_path=str(empty), heads_path=heads)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "model_Anger_best.pth").write_bytes(b"\x80\x02garbage")
    with pytest.raises(WeightsError, match="model_Anger_best.pth"):
        EmpathicInsightScorer(encoder_path=enc, heads_path=str(corrupt))
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    torch.save(PublishedHead(123).state_dict(), wrong / "model_Odd_best.pth")
    with pytest.raises(WeightsError, match="reads 123 inputs"):
        EmpathicInsightScorer(encoder_path=enc, heads_path=str(wrong))
    torch.save({"fc.weight": torch.zeros(1, 2)}, wrong / "model_Odd_best.pth")
    with pytest.raises(WeightsError, match="proj/mlp layout"):
        EmpathicInsightScorer(encoder_path=enc, heads_path=str(wrong))


def test_random_tiny_build_runs():
    from bestofn.fakes.empathic import build

    s = build("cpu", "tiny", n_emotion_heads=3, n_quality_heads=1)
    out = s.score(clips(2, sr=16000), 16000, SPEC)
    assert len(out) == 5 and all(len(v) == 2 for v in out.values())  # 4 heads and ei_target


def test_encoder_weights_come_from_the_checkpoint(scorer, weights):
    # BUD-E-Whisper is saved as WhisperForConditionalGeneration ("model.encoder.*" keys): make
    # sure those weights are the ones in use, not a fresh random init
    from safetensors.torch import load_file

    saved = load_file(weights / "encoder" / "model.safetensors")
    for name, param in scorer.encoder.named_parameters():
        torch.testing.assert_close(param, saved[f"model.encoder.{name}"])


def test_emotion_heads_and_their_mapping(weights):
    from bestofn.backends.empathic import emotion_head_names, resolve_head

    heads = emotion_head_names(weights / "heads")
    assert heads == ["Anger", "Gender", "Jealousy_&_Envy"]  # quality heads and non-heads left out
    assert resolve_head("anger", None, heads) == "Anger"
    assert resolve_head("Jealousy & Envy", None, heads) == "Jealousy_&_Envy"
    assert resolve_head("jealousy_envy", "", heads) == "Jealousy_&_Envy"
    # the sheet's ei_head wins over the emotion's name
    assert resolve_head("rage", "ANGER", heads) == "Anger"
    assert resolve_head("anger", "Gender", heads) == "Gender"
    assert resolve_head("rage", None, heads) is None
    assert resolve_head("anger", "no such head", heads) is None
    with pytest.raises(WeightsError, match="heads_path"):
        emotion_head_names(weights / "missing")


def test_ei_target_is_the_group_emotions_head(scorer):
    takes = clips(3)
    anger = scorer.score(takes, 24000, SPEC)
    assert anger["ei_target"] == anger["ei_anger"]
    envy = GroupSpec(emotion="Jealousy & Envy", prompt_id="p1", text="hello", n_takes=3)
    out = scorer.score(takes, 24000, envy)
    assert out["ei_target"] == out["ei_jealousy_envy"] != out["ei_anger"]
    mapped = GroupSpec(
        emotion="rage", prompt_id="p1", text="hello", n_takes=3, extra={"ei_head": "Gender"}
    )
    out = scorer.score(takes, 24000, mapped)
    assert out["ei_target"] == out["ei_gender"]
    unmapped = GroupSpec(emotion="rage", prompt_id="p1", text="hello", n_takes=3)
    assert all(np.isnan(scorer.score(takes, 24000, unmapped)["ei_target"]))
