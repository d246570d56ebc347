"""moss-hf: frame budget, per-take seeds, checkpoint errors, and the full published path on a
tiny random checkpoint built from the reference remote code (.ref/moss_tts_local_v1.5)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO

from bestofn.backends import moss_hf, moss_hf_common
from bestofn.moss.budget import FrameBudget, count_words, frame_budget
from bestofn.moss.published_draws import LocalDraws
from bestofn.util.spec import GroupSpec

REF_CODE = REPO / ".ref" / "moss_tts_local_v1.5"


# ---- frame budget ------------------------------------------------------------------------------


def test_pacing_dial_hint_and_budget():
    """The recipe's dial: hint = clamp(words x 6.0, 96, 1400), budget = 2.2 x hint + 300."""
    b = FrameBudget()
    twelve = "one two three four five six seven eight nine ten eleven twelve"
    assert b.tokens(twelve) == 96  # 72 raised to the floor
    assert b.frames(twelve) == 511  # 2.2 x 96 + 300 = 511.2, floored
    forty = " ".join(["word"] * 40)
    assert b.tokens(forty) == 240 and b.frames(forty) == 828
    assert b.tokens("word " * 1000) == 1400  # ceiling
    assert b.frames("word " * 1000) == math.floor(2.2 * 1400 + 300)
    assert b.hint(forty) == 240
    assert FrameBudget(tokens_hint=False).hint(forty) is None  # no hint; the same budget
    assert FrameBudget(tokens_hint=False).frames(forty) == 828
    assert frame_budget(forty, frames_per_word=4.2) == math.floor(2.2 * 168 + 300)
    assert frame_budget(forty, budget_scale=1.0, budget_offset=0) == 240
    assert frame_budget(forty, max_frames=50) == 50  # the budget's cap (CPU tests)
    assert frame_budget("No!", min_tokens=1, budget_scale=1, budget_offset=0, min_frames=25) == 25


def test_word_counting_and_pauses():
    assert count_words("Well -- I, uh... don't know!") == 5  # punctuation-only tokens skipped
    assert count_words("亲爱的你，愿你") == 6  # no-space scripts: one word per character
    assert count_words("Hi 你好") == 3
    # a [pause 2s] marker adds 2 s x 12.5 frames/s and is not a word
    assert FrameBudget(min_tokens=1).tokens("a [pause 2s] b") == 12 + 25


def test_budget_validation_and_options():
    with pytest.raises(ValueError):
        FrameBudget(frames_per_word=0)
    with pytest.raises(ValueError):
        FrameBudget(min_frames=100, max_frames=10)
    with pytest.raises(ValueError):
        FrameBudget(min_tokens=100, max_tokens=10)
    b = FrameBudget.from_options({"frames_per_word": 4.2, "min_frames": 10, "max_frames": 99})
    assert b.as_dict() == {
        "frames_per_word": 4.2, "min_tokens": 96, "max_tokens": 1400, "budget_scale": 2.2,
        "budget_offset": 300, "min_frames": 10, "max_frames": 99, "tokens_hint": True,
    }  # fmt: skip


def test_moss_fast_prompt_carries_the_hint():
    """moss-fast puts the dial's hint in the prompt's Tokens field (None with tokens_hint off)."""
    pytest.importorskip("torch")
    from bestofn.fakes.moss import build

    spec = GroupSpec("calm", "p1", " ".join(["word"] * 40), n_takes=1, language="en")

    def tokens_field(**opts) -> str:
        ids = build("cpu", size="tiny", **opts).prompt(spec)[:, 0].tolist()
        text = bytes(i for i in ids if i < 256).decode()  # the byte tokenizer's text
        return text.split("- Tokens:")[1].split("- Quality:")[0].strip()

    assert tokens_field() == "240"
    assert tokens_field(frames_per_word=3.0) == "120"
    assert tokens_field(tokens_hint=False) == "None"


# ---- per-take draws (pure) ---------------------------------------------------------------------


class _NoPenaltyModel:
    @staticmethod
    def _apply_repetition_penalty(scores, previous, penalty):
        return scores


def _draw_sequence(seeds, calls=26, n_vq=12, vocab=50):
    torch = pytest.importorskip("torch")
    draws = LocalDraws(_NoPenaltyModel(), seeds, n_vq=n_vq, device="cpu")
    logits = torch.zeros(len(seeds), vocab)  # uniform: the draw alone decides
    out = [
        draws(logits=logits, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
        for _ in range(calls)
    ]
    return torch.stack(out, dim=1)


def test_take_draws_depend_only_on_seed_and_position():
    torch = pytest.importorskip("torch")
    batch = _draw_sequence([11, 22, 33])
    alone = _draw_sequence([33])
    assert torch.equal(batch[2], alone[0])  # same take, other batch: same tokens
    assert not torch.equal(batch[0], batch[1])  # different seeds differ
    assert len(set(batch[0].tolist())) > 5


def test_torchaudio_standin_only_while_loading(tmp_path):
    torch = pytest.importorskip("torch")
    import soundfile as sf

    if moss_hf_common._torchaudio_works():
        pytest.skip("a working torchaudio is installed: the stand-in is not used")
    with moss_hf_common._torchaudio_importable():
        import torchaudio

        sf.write(tmp_path / "a.wav", np.zeros((2400, 2), np.float32), 24000)
        wav, sr = torchaudio.load(tmp_path / "a.wav")
        assert sr == 24000 and wav.shape == (2, 2400)
        up = torchaudio.functional.resample(torch.ones(2, 2400), 24000, 48000)
        assert up.shape == (2, 4800)
    assert not moss_hf_common._torchaudio_works()  # the rest of the worker still sees no torchaudio


# ---- checkpoint errors (no model needed) -------------------------------------------------------


def _fake_ckpt(d: Path, shards=("model.safetensors",), code=("modeling_x",)):
    d.mkdir(parents=True)
    auto = {"AutoModel": f"{code[0]}.Model"} if code else {}
    (d / "config.json").write_text(json.dumps({"auto_map": auto}))
    for c in code:
        (d / f"{c}.py").write_text("")
    (d / "tokenizer.json").write_text("{}")
    for s in shards:
        (d / s).write_bytes(b"")


def test_missing_checkpoint_files_are_named(tmp_path):
    codec = tmp_path / "codec"
    _fake_ckpt(codec)
    with pytest.raises(ValueError, match="model_dir is required"):
        moss_hf.MossHFGenerator(codec_dir=str(codec))
    with pytest.raises(FileNotFoundError, match=r"nowhere.*model_dir"):
        moss_hf.MossHFGenerator(model_dir=str(tmp_path / "nowhere"), codec_dir=str(codec))

    model = tmp_path / "model"
    _fake_ckpt(model, shards=())
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors.*model_dir"):
        moss_hf.MossHFGenerator(model_dir=str(model), codec_dir=str(codec))
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}})
    )
    with pytest.raises(FileNotFoundError, match="model-00001-of-00002.safetensors"):
        moss_hf.MossHFGenerator(model_dir=str(model), codec_dir=str(codec))
    (model / "model-00001-of-00002.safetensors").write_bytes(b"")
    (model / "modeling_x.py").unlink()
    with pytest.raises(FileNotFoundError, match=r"modeling_x\.py.*model_dir"):
        moss_hf.MossHFGenerator(model_dir=str(model), codec_dir=str(codec))

    (model / "modeling_x.py").write_text("")
    (codec / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.json.*codec_dir"):
        moss_hf.MossHFGenerator(model_dir=str(model), codec_dir=str(codec))
    with pytest.raises(TypeError, match="unknown options"):
        moss_hf.MossHFGenerator(model_dir=str(model), codec_dir=str(codec), temprature=1.0)


# ---- the full published path on a tiny random checkpoint ---------------------------------------

needs_ref = pytest.mark.skipif(
    not (REF_CODE / "modeling_moss_tts.py").is_file(),
    reason=f"reference remote code not found at {REF_CODE} (fetch OpenMOSS/MOSS-TTS)",
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny tensors: torch's intra-op threads cost ~50x more than they save on a 2-core box."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("moss")
    from bestofn.fakes.moss import write_random_checkpoint

    model_dir, codec_dir = write_random_checkpoint(root, REF_CODE, size="tiny")
    return root, model_dir, codec_dir


@pytest.fixture(scope="module")
def gen(tiny_ckpt):
    root, model_dir, codec_dir = tiny_ckpt
    return moss_hf.MossHFGenerator(
        model_dir=str(model_dir),
        codec_dir=str(codec_dir),
        cache_dir=str(root / "cache"),
        batch_size=3,
        min_frames=4,
        max_frames=12,
    )


SPEC = GroupSpec(emotion="angry", prompt_id="p7", text="Get out of my house, now.", n_takes=5)


@needs_ref
def test_takes_from_the_published_path(gen):
    takes = gen.generate(SPEC)
    assert [t.seed for t in takes] == SPEC.seeds()
    assert gen.sample_rate == 48000
    budget = takes[0].meta["frame_budget"]
    assert budget == 12  # 6 words x 6.0 = 36, clamped to max_frames
    for t in takes:
        n = t.meta["n_frames"]
        assert t.audio.dtype == np.float32 and t.audio.shape == (n * 3840, 2)
        assert t.meta["truncated"] == (n == budget)
        assert 0 <= n <= budget
    # the random checkpoint stops ~1 frame in 10: these seeds give both kinds of take
    assert any(t.meta["truncated"] for t in takes) and not all(t.meta["truncated"] for t in takes)
    prov = gen.provenance()
    assert prov["backend"] == "moss-hf" and len(prov["model_sha256"]) == 64
    assert prov["sampling"]["audio_temperature"] == 1.7
    assert prov["codec_kernels"] == "eager"  # the codec's decoder pieces that ran (CPU)


@needs_ref
def test_take_reproducible_whatever_the_batch(gen):
    torch = pytest.importorskip("torch")
    seeds = SPEC.seeds()
    gen.options["batch_size"] = 5
    together, _, _ = gen.generate_codes(SPEC, seeds)
    gen.options["batch_size"] = 2
    split, _, _ = gen.generate_codes(SPEC, seeds)
    alone, _, _ = gen.generate_codes(SPEC, [seeds[3]])
    gen.options["batch_size"] = 3
    assert all(torch.equal(a, b) for a, b in zip(together, split, strict=True))
    assert torch.equal(alone[0], together[3])
    other, _, _ = gen.generate_codes(SPEC, [seeds[3] + 1])
    assert not torch.equal(other[0], together[3])


@needs_ref
def test_draws_follow_the_reference_distribution(gen):
    """Our per-take draw samples the reference's filtered distribution (penalty, T, top-k/p)."""
    torch = pytest.importorskip("torch")
    n = 6000
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -3.0]]).repeat(n, 1)
    previous = torch.tensor([[0, 0, 2]]).repeat(n, 1)  # penalised codes
    draws = LocalDraws(gen.model, list(range(n)), gen.n_vq, "cpu")
    got = draws(logits=logits, do_sample=True, temperature=1.7, top_k=5, top_p=0.8,
                previous_token_ids=previous, repetition_penalty=1.3)  # fmt: skip
    m = gen.model
    scores = m._apply_repetition_penalty(logits[:1].clone(), previous[:1], 1.3)
    want = torch.softmax(m._filter_logits(scores / 1.7, top_k=5, top_p=0.8), dim=-1)[0]
    freq = torch.bincount(got, minlength=7).double() / n
    assert torch.all(freq[want == 0] == 0)
    assert torch.allclose(freq, want.double(), atol=4 * math.sqrt(0.25 / n))


@needs_ref
def test_reference_voice_encoded_once_and_used_as_codes(gen, tiny_ckpt, monkeypatch):
    torch = pytest.importorskip("torch")
    import soundfile as sf

    root = tiny_ckpt[0]
    wav = root / "voice.wav"
    rng = np.random.default_rng(0)
    sf.write(wav, (0.1 * rng.standard_normal(int(24000 * 1.0))).astype(np.float32), 24000)
    calls = []
    real = gen.codec.encode  # our v2 codec, as the processor would prepare the voice
    monkeypatch.setattr(gen.codec, "encode", lambda *a, **k: calls.append(1) or real(*a, **k))
    spec = GroupSpec(emotion="sad", prompt_id="p1", text="I miss you.", n_takes=2,
                     reference_audio=str(wav))  # fmt: skip
    ids_ref, _ = gen.prompt(spec)
    codes = gen.reference_codes(wav)
    assert codes.shape == (12, 12)  # 1 s at 48 kHz -> 48000 // 3840 whole frames (published)
    takes = gen.generate(spec)
    assert len(takes) == 2 and len(calls) == 1  # encoded once, reused after
    slot = gen.config.audio_user_slot_token_id
    rows = ids_ref[0][ids_ref[0, :, 0] == slot]
    assert torch.equal(rows[:, 1:], codes)  # the prompt carries the cached codes
    ids_plain, _ = gen.prompt(
        GroupSpec(emotion="sad", prompt_id="p1", text="I miss you.", n_takes=2)
    )
    assert not (ids_plain[0, :, 0] == slot).any()


@needs_ref
def test_lora_merged_at_load(tiny_ckpt):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import AutoConfig, AutoModel

    root, model_dir, codec_dir = tiny_ckpt
    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=True)
    config.attn_implementation = config.local_transformer_attn_implementation = "eager"
    base = AutoModel.from_pretrained(model_dir, config=config, trust_remote_code=True)
    lcfg = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "c_attn"])
    pm = peft.get_peft_model(base, lcfg)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    pm.save_pretrained(root / "adapter")
    params = dict(pm.named_parameters())
    key = "base_model.model.transformer.layers.1.self_attn.q_proj"
    a, b = params[f"{key}.lora_A.default.weight"], params[f"{key}.lora_B.default.weight"]
    expected = params[f"{key}.base_layer.weight"] + 2.0 * (b @ a)

    g = moss_hf.MossHFGenerator(model_dir=str(model_dir), codec_dir=str(codec_dir),
                                cache_dir=str(root / "cache"), lora=str(root / "adapter"),
                                max_frames=4, min_frames=2)  # fmt: skip
    got = g.model.transformer.layers[1].self_attn.q_proj.weight
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert g.load_dir != model_dir and g.provenance()["lora_sha256"]
    assert len(g.generate(GroupSpec(emotion="e", prompt_id="x", text="Hi.", n_takes=2))) == 2


@needs_ref
def test_batched_decode_matches_one_take_at_a_time(gen):
    # The processor is built without a codec: our v2 codec decodes (its parity with the
    # published v2 code: tests/moss/test_moss_codec_v2.py); a take's audio must not depend on the
    # takes decoded beside it, and is stereo, trimmed to its frames.
    codes, _, _ = gen.generate_codes(SPEC)
    codes = [c for c in codes if c.shape[0] > 0]
    batched = gen.decode(codes)
    assert gen.processor.audio_tokenizer is None
    for c, audio in zip(codes, batched, strict=True):
        (single,) = gen.decode([c])
        assert audio.shape == (c.shape[0] * 3840, 2)
        np.testing.assert_allclose(audio, single, rtol=0, atol=1e-5 * np.abs(single).max())


@needs_ref
def test_random_tiny_build(tmp_path):
    from bestofn.fakes.moss import build_hf

    g = build_hf("cpu", size="tiny", workdir=tmp_path, code_dir=REF_CODE,
                 max_frames=3, min_frames=1, hash_weights=False)  # fmt: skip
    takes = g.generate(GroupSpec(emotion="e", prompt_id="b", text="Bench.", n_takes=2))
    assert len(takes) == 2 and g.provenance()["backend"] == "moss-hf"
