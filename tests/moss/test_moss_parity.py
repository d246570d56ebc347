"""moss-fast vs the published reference code (skipped when the reference copy is absent)."""

from __future__ import annotations

import importlib.util

import pytest
from helpers import REPO

from bestofn.parity.local import parity_main

REF = REPO / ".ref" / "moss_tts_local_v1.5"


def test_without_reference_code_it_says_skipped(capsys):
    assert parity_main([]) == 0
    assert "SKIPPED" in capsys.readouterr().out


@pytest.mark.skipif(
    not (REF / "modeling_moss_tts.py").exists(), reason=f"no reference copy at {REF}"
)
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_tiny_random_checkpoint_matches_reference(capsys):
    code = parity_main(["--reference-code", str(REF), "--frames", "16"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "parity: PASS" in out
    assert "identical" in out


@pytest.mark.skipif(not (REF / "processing_moss_tts.py").exists(), reason=f"no reference at {REF}")
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_prompt_matches_reference_processor(tmp_path, monkeypatch):
    """Our tokenizer.json-based prompt == the reference processor's input_ids, token for token
    (direct TTS and voice clone)."""
    import sys
    import types

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from bestofn.fakes.moss import tiny_config
    from bestofn.moss.prompt import PromptBuilder
    from bestofn.parity.reference_code import load_reference_class

    cfg = tiny_config(vocab_size=264)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([f"<|special_{i}|>" for i in range(8)])  # ids 256..263
    tok.save(str(tmp_path / "tokenizer.json"))

    # the processor module imports torchaudio at the top; it is not used on this path
    audio = types.ModuleType("torchaudio")
    audio.functional = types.SimpleNamespace(resample=None)
    monkeypatch.setitem(sys.modules, "torchaudio", audio)
    load_reference_class(REF)  # registers the reference package
    pkg = next(n for n in sys.modules if n.startswith("_moss_local_reference_"))
    proc_mod = __import__(f"{pkg}.processing_moss_tts", fromlist=["x"])
    conf_mod = __import__(f"{pkg}.configuration_moss_tts", fromlist=["x"])
    ref_cfg = conf_mod.MossTTSLocalConfig(**cfg.to_hf_dict())
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    proc = proc_mod.MossTTSLocalProcessor(tokenizer=hf_tok, model_config=ref_cfg)
    ours = PromptBuilder.from_tokenizer_json(tmp_path / "tokenizer.json", cfg)

    text = "Well, I never said that! [pause 0.5s] Did I?"
    ref_codes = torch.randint(0, 16, (6, cfg.n_vq))
    # the pacing dial's hint (the processor's tokens input), alone and with every other field
    hinted = {"language": "English", "instruction": "angry", "tokens": 511}
    cases = ({"language": "English"}, {"instruction": "angry"}, {"reference": [ref_codes]},
             {"tokens": 96}, {**hinted, "reference": [ref_codes]})  # fmt: skip
    for kwargs in cases:
        msg = proc.build_user_message(text=text, **kwargs)
        want = proc([[msg]], mode="generation")["input_ids"][0]
        refs = kwargs.pop("reference", None)
        got = ours.rows(text, references=refs, **kwargs)
        assert torch.equal(got, want), kwargs


@pytest.mark.skipif(not (REF / "modeling_moss_tts.py").exists(), reason=f"no reference at {REF}")
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_moss_fast_and_moss_hf_make_the_same_takes(tmp_path):
    """Same checkpoint, same group, same seeds, model-card sampling: identical codes from both
    engines (they share the per-take random numbers), so a take does not depend on the engine."""
    import torch

    moss_hf = pytest.importorskip("bestofn.backends.moss_hf")
    from bestofn.backends.moss_fast import MossFastGenerator
    from bestofn.fakes.moss import write_random_checkpoint
    from bestofn.util.spec import GroupSpec

    model_dir, codec_dir = write_random_checkpoint(tmp_path, REF, size="tiny")
    opts = dict(model_dir=str(model_dir), codec_dir=str(codec_dir), max_frames=16, min_frames=3)
    spec = GroupSpec("calm", "p7", "Hello there, how are you today?", n_takes=4, language="en")
    hf_codes, _, _ = moss_hf.MossHFGenerator(cache_dir=str(tmp_path / "c"), **opts).generate_codes(
        spec
    )
    fast_codes, _, _ = MossFastGenerator(**opts).generate_codes(spec)
    assert [len(c) for c in hf_codes] == [len(c) for c in fast_codes]
    assert all(torch.equal(a, b) for a, b in zip(hf_codes, fast_codes, strict=True))
