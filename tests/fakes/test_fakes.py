"""bestofn.fakes: the layouts `bestofn fake-weights` writes beyond what the CPU workflow test
(test_production_workflow.py) loads: sharded MOSS weights, the moss-hf remote-code check, the
tuned stop probability, and the refusals before anything is written."""

import json
from collections import namedtuple

import pytest
import torch

pytest.importorskip("transformers")

from bestofn.backends.moss_hf_common import check_checkpoint  # noqa: E402
from bestofn.fakes import moss  # noqa: E402
from bestofn.moss.checkpoint import load_model, weight_files  # noqa: E402


def test_sharded_weights_load_like_one_file(tmp_path):
    one = moss.write_model(tmp_path / "one", "tiny", seed=3)
    sharded = moss.write_model(tmp_path / "sharded", "tiny", seed=3, shard_bytes=64_000)
    assert [p.name for p in weight_files(one)] == ["model.safetensors"]
    files = weight_files(sharded)
    n = len(files)
    assert n > 1 and [p.name for p in files] == [
        f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)
    ]
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    a, b = load_model(one), load_model(sharded)
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in _published_tensors(sharded, index)
    )
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def _published_tensors(ckpt, index):
    from safetensors import safe_open

    for f in sorted(set(index["weight_map"].values())):
        with safe_open(str(ckpt / f), framework="pt") as sf:
            yield from (sf.get_tensor(k) for k in sf.keys())


def test_moss_hf_needs_the_remote_code_and_finds_it_once_copied(tmp_path):
    model_dir = moss.write_model(tmp_path / "model", "tiny")
    with pytest.raises(FileNotFoundError, match="configuration_moss_tts.py"):
        check_checkpoint(model_dir, "model_dir", tokenizer=True)
    code = tmp_path / "code"
    code.mkdir()
    for name in moss.REMOTE_CODE_FILES[:-1]:
        (code / name).write_text("# stand-in for the published file\n")
    with pytest.raises(FileNotFoundError, match=moss.REMOTE_CODE_FILES[-1]):
        moss.add_remote_code(model_dir, code)
    (code / moss.REMOTE_CODE_FILES[-1]).write_text("\n")
    moss.add_remote_code(model_dir, code)
    assert check_checkpoint(model_dir, "model_dir", tokenizer=True) == [
        model_dir / "model.safetensors"
    ]


def test_stop_head_stops_with_the_asked_probability(tmp_path):
    """Per frame, "stop" comes out with probability p_stop (estimated over every frame at risk:
    stops / (stops + frames that continued))."""
    from bestofn.backends.moss_fast import MossFastGenerator
    from bestofn.util.spec import GroupSpec

    p_stop = 0.25
    model_dir = moss.write_model(tmp_path / "model", "tiny", seed=1, p_stop=p_stop)
    gen = MossFastGenerator(model_dir=str(model_dir), min_frames=6, max_frames=6)
    spec = GroupSpec(emotion="calm", prompt_id="p", text="A b c.", n_takes=200)
    codes, stopped, budget = gen.generate_codes(spec)
    assert budget == 6
    stops = sum(stopped)
    continued = sum(int(c.shape[0]) for c in codes)
    estimate = stops / (stops + continued)  # ~650 frames at risk: sd ~0.017
    assert abs(estimate - p_stop) < 0.07, (estimate, stops, continued)
    assert 0 < sum(c.shape[0] == 0 for c in codes) < len(codes)  # some takes stop at once


def test_refusals_come_before_anything_is_written(tmp_path, monkeypatch, capsys):
    from bestofn.cli import main
    from bestofn.fakes import weights

    out = tmp_path / "w"
    assert main(["fake-weights", str(out), "--moss-code", str(tmp_path / "nowhere")]) == 2
    assert "has no modeling_moss_tts.py" in capsys.readouterr().out
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(weights.shutil, "disk_usage", lambda _: usage(2**40, 2**40, 2**20))
    assert main(["fake-weights", str(out), "--size", "real"]) == 2
    need = (weights.NEED_BYTES["real"] + weights.DELAY_BYTES["real"]) / 2**30
    assert f"needs about {need:.1f} GiB free" in capsys.readouterr().out
    assert not out.exists()


def test_every_published_checkpoint_has_a_fake_writer():
    """A fake module declares the backend it writes (``FAKE_WEIGHTS``) and `bestofn
    fake-weights` finds it: every backend with published weights has one (the generator's are
    the MOSS writers, shaped by the command's own options)."""
    from bestofn.backends import registry
    from bestofn.fakes import weights

    with_weights = {backend for backend, _ in registry.published_weights()}
    assert set(weights.fake_modules()) == with_weights - {"moss-fast"}
    assert set(weights.fake_modules()) <= set(registry.declared())
    assert weights.writers()[: len(weights.MOSS_WRITERS)] == weights.MOSS_WRITERS


def test_the_real_size_tokenizer_gives_prompts_of_a_bpe_length_with_the_published_specials(
    tmp_path,
):
    """The real-size stand-in tokenizer (GPT-2's BPE): a bench prompt is about 90 rows, not a
    row a byte (the serve figures' prefill scales with it), the MOSS specials sit at their
    published ids, text round-trips, and the written tokenizer.json reads back the same."""
    from bestofn.moss.config import MossLocalConfig
    from bestofn.moss.prompt import PromptBuilder

    text = "The train leaves at nine, so please be on time and bring the tickets with you."
    published = MossLocalConfig()
    cfg = MossLocalConfig.from_hf_dict(moss.published_config("real"))
    assert cfg.im_start_token_id == published.im_start_token_id == 151644
    assert cfg.audio_start_token_id == published.audio_start_token_id
    built = moss.text_prompt_builder(cfg, "real").rows(text)
    byte_rows = moss.text_prompt_builder(moss.tiny_config(vocab_size=264), "tiny").rows(text)
    assert 80 <= built.shape[0] <= 100 and byte_rows.shape[0] > 250
    assert built[0, 0] == 151644 and built[-1, 0] == published.audio_start_token_id
    assert int(built[:, 0].max()) < cfg.vocab_size
    tok = moss.text_tokenizer("real")
    ids = tok.encode("héllo wörld 日本", add_special_tokens=False).ids
    assert tok.decode(ids) == "héllo wörld 日本"
    moss.write_tokenizer(tmp_path, "real")
    read = PromptBuilder.from_tokenizer_json(tmp_path / "tokenizer.json", cfg).rows(text)
    assert torch.equal(read, built)


def test_the_real_size_delay_tokenizer_is_the_same_bpe_with_its_published_specials(tmp_path):
    from tokenizers import Tokenizer

    from bestofn.fakes import moss_delay

    cfg = moss_delay.size_config("real")
    moss_delay.write_tokenizer(tmp_path, cfg, "real")
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "The train leaves at nine, so please be on time and bring the tickets with you."
    ids = tok.encode(f"<|im_start|>{text}<|im_end|>", add_special_tokens=False).ids
    assert ids[0] == cfg.im_start_token_id == 151644 and ids[-1] == cfg.im_end_token_id
    assert ids[1:-1] == moss.text_tokenizer("real").encode(text, add_special_tokens=False).ids
    assert 12 <= len(ids) - 2 <= 25  # words, not bytes
