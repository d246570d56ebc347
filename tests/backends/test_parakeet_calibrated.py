"""The calibrated Parakeet fake (``bestofn.fakes.parakeet.write``): beside the plain random
.nemo, the same weights with the joint's output biases set so that NeMo's own greedy TDT
decoding emits about ``TARGET_TOKENS_PER_S`` tokens per second; declared on disk as a
calibration. Tiny size, CPU."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from bestofn.backends.parakeet import ParakeetScorer
from bestofn.fakes import parakeet as fake

# Whether NeMo is installed, not imported: importing nemo.collections.asr takes ~8 s, which every
# pytest-xdist worker paid while collecting (this file's tests import it where they run).
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("nemo") is None, reason="nemo_toolkit[asr] not installed"
)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("fake-parakeet")
    return out, fake.write(out, "tiny", seed=0)


def _rate(scorer, clips):
    enc, lens = scorer.encode_batch(clips)
    return fake.emitted_tokens_per_s(scorer, enc, lens)


def _weights(nemo_path):
    """The state dict inside a .nemo archive (a tar holding model_weights.ckpt), read without
    building the model."""
    import io
    import tarfile

    import torch

    with tarfile.open(nemo_path) as tar:
        (member,) = [m for m in tar.getmembers() if m.name.endswith("model_weights.ckpt")]
        return torch.load(io.BytesIO(tar.extractfile(member).read()), map_location="cpu")


def test_calibrated_fake_emits_the_target_rate_on_held_out_audio(written):
    """Loaded through the scorer's own loader (as the workflow loads it), the calibrated fake
    emits within the stated band of the target on synthetic clips it was not calibrated on,
    every clip some tokens, and its transcripts are text."""
    _, opts = written
    held_out = fake.synthetic_clips(seed=7, seconds=(3.0, 6.5, 12.0, 14.5))
    lo, hi = fake.CALIBRATION_BAND
    target = fake.TARGET_TOKENS_PER_S
    calibrated = ParakeetScorer(
        model_path=opts["calibrated_model_path"], hash_weights=False, batch_size=16
    )
    rate, per_clip = _rate(calibrated, held_out)
    assert lo * target <= rate <= hi * target, (rate, per_clip)
    assert all(n > 0 for n in per_clip)  # no all-or-nothing clips
    texts = calibrated.transcribe(held_out[:3], 16000)
    assert all(isinstance(t, str) and t for t in texts)


def test_calibration_changes_only_the_joints_output_layer(written):
    """The plain fake keeps its random joint (saved before the calibration); the calibrated
    one differs from it only in the joint's output layer: the blank's bias (by the recorded
    offset) and the duration head (zero weights, its bias picks one duration)."""
    import torch

    out, opts = written
    plain, cal = _weights(opts["model_path"]), _weights(opts["calibrated_model_path"])
    assert plain.keys() == cal.keys()
    changed = sorted(k for k in plain if not torch.equal(plain[k], cal[k]))
    layer = changed[0].rsplit(".", 1)[0]
    assert layer.startswith("joint.joint_net.") and changed == [f"{layer}.bias", f"{layer}.weight"]
    vocab = fake.TINY_SIZE["vocab_size"]
    w_p, w_c = plain[f"{layer}.weight"], cal[f"{layer}.weight"]
    b_p, b_c = plain[f"{layer}.bias"], cal[f"{layer}.bias"]
    assert torch.count_nonzero(w_p[vocab + 1 :]) == w_p[vocab + 1 :].numel()  # plain: random
    assert torch.equal(w_p[: vocab + 1], w_c[: vocab + 1])  # token and blank weights random
    assert torch.equal(b_p[:vocab], b_c[:vocab])
    record = json.loads((out / fake.CALIBRATED_DIR / "calibration.json").read_text())
    assert float(b_c[vocab] - b_p[vocab]) == pytest.approx(record["blank_bias_offset"], abs=1e-5)
    assert torch.count_nonzero(w_c[vocab + 1 :]) == 0
    durations = fake.TDT_DURATIONS
    assert int(torch.argmax(b_c[vocab + 1 :])) == durations.index(fake.CALIBRATED_DURATION_FRAMES)


def test_calibration_is_declared_on_disk(written):
    out, opts = written
    d = out / fake.CALIBRATED_DIR
    assert opts["calibrated_model_path"] == str((d / "parakeet-tdt-0.6b-v3.nemo").resolve())
    note = (d / "CALIBRATION.md").read_text()
    assert note.startswith("# CALIBRATION, not a model")
    record = json.loads((d / "calibration.json").read_text())
    assert record["what"] == "a calibration of random weights, not a model"
    assert record["target_tokens_per_s"] == fake.TARGET_TOKENS_PER_S
    err = abs(record["emitted_tokens_per_s"] - fake.TARGET_TOKENS_PER_S)
    assert err <= fake.CALIBRATION_TOLERANCE * fake.TARGET_TOKENS_PER_S
    assert str(record["emitted_tokens_per_s"]) in note


def test_fake_weights_option_points_the_config_at_it(tmp_path, monkeypatch):
    """``--parakeet calibrated`` writes the config with the calibrated fake; plain by default.
    (Only the Parakeet writer runs: the others are replaced by stubs returning their options.)"""
    import yaml

    from bestofn.fakes import weights

    def stub(opts):
        return lambda *a, **k: opts

    calls = {}

    def parakeet_write(out, size, seed):
        calls["n"] = calls.get("n", 0) + 1
        return {"model_path": "/p/plain.nemo", "calibrated_model_path": "/p/cal.nemo"}

    from bestofn.fakes import empathic, moss, moss_audio_tokenizer, sidon, voiceclap

    monkeypatch.setattr(moss, "write", stub({"model_dir": "/m", "codec_dir": "/c"}))
    monkeypatch.setattr(moss_audio_tokenizer, "write", stub({}))
    monkeypatch.setattr(sidon, "write", stub({"w2v_bert_dir": "/w", "adapter_dir": "/a",
                                              "decoder_path": "/d"}))  # fmt: skip
    monkeypatch.setattr(voiceclap, "write", stub({"model_path": "/v"}))
    monkeypatch.setattr(empathic, "write", stub({"encoder_path": "/e", "heads_path": "/h"}))
    monkeypatch.setattr(fake, "write", parakeet_write)
    for variant, want in (("plain", "/p/plain.nemo"), ("calibrated", "/p/cal.nemo")):
        cfg = weights.write_all(tmp_path / variant, "tiny", delay=False, parakeet_variant=variant,
                                log=lambda *a: None)  # fmt: skip
        scorers = yaml.safe_load(cfg.read_text())["models"]["scorers"]
        (parakeet,) = [s for s in scorers if s["backend"] == "parakeet"]
        assert parakeet["options"]["model_path"] == want
        assert f"points at the {variant} one" in (cfg.parent / "FAKE_WEIGHTS.md").read_text()
    with pytest.raises(ValueError, match="--parakeet must be plain or calibrated"):
        weights.write_all(tmp_path / "x", "tiny", parakeet_variant="real")


def test_synthetic_clips_are_deterministic():
    a, b = fake.synthetic_clips(seed=3), fake.synthetic_clips(seed=3)
    assert len(a) == 9 and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
