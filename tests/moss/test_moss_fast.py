"""moss-fast engine logic on a tiny random checkpoint (CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bestofn.fakes.moss import random_state_dict, save_checkpoint, tiny_config
from bestofn.moss.checkpoint import CheckpointError, load_model
from bestofn.moss.config import MossLocalConfig, local_v15_config
from bestofn.moss.engine import MossLocalEngine
from bestofn.moss.sampling import (
    SamplingParams,
    apply_repetition_penalty,
    sample_tokens,
    take_uniform,
)

CFG = tiny_config(vocab_size=264)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("moss") / "tiny", CFG, random_state_dict(CFG, 3))


@pytest.fixture(scope="module")
def engine(ckpt):
    return MossLocalEngine(load_model(ckpt), use_cuda_graphs=False)


def prompt(batch: int, length: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((batch, length, 1 + CFG.n_vq), CFG.audio_pad_code)
    ids[..., 0] = torch.randint(0, 200, (length,), generator=g)  # same prompt on every row
    ids[:, -1, 0] = CFG.audio_start_token_id
    return ids


def test_config_roundtrips_through_published_layout():
    for cfg in (CFG, local_v15_config()):
        assert MossLocalConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    real = local_v15_config()
    assert (real.local_head_dim, real.num_heads // real.num_kv_heads) == (80, 4)


def test_missing_and_mismatched_checkpoints_fail_clearly(tmp_path, ckpt):
    with pytest.raises(CheckpointError, match="config.json"):
        load_model(tmp_path / "nowhere")
    sd = random_state_dict(CFG, 0)
    sd["local_transformer.h.0.attn.c_attn.weight"] = torch.zeros(3, 3)
    bad = save_checkpoint(tmp_path / "bad", CFG, sd)
    with pytest.raises(CheckpointError, match="c_attn"):
        load_model(bad)
    sd = random_state_dict(CFG, 0)
    sd["surprise.weight"] = torch.zeros(2)
    with pytest.raises(CheckpointError, match="unexpected"):
        load_model(save_checkpoint(tmp_path / "extra", CFG, sd))


def test_tied_heads_may_be_stored_instead_of_embeddings(tmp_path, ckpt):
    sd = random_state_dict(CFG, 3)
    for k in range(CFG.n_vq):
        sd[f"audio_lm_heads.{k}.weight"] = sd.pop(f"audio_embeddings.{k}.weight")
    alt = load_model(save_checkpoint(tmp_path / "tied", CFG, sd))
    assert torch.equal(alt.audio_embed, load_model(ckpt).audio_embed)


def test_take_is_reproducible_whatever_the_batch(engine):
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=8, text_temperature=0.3)
    seeds = [11, 22, 33, 44]
    full = engine.generate(prompt(4), None, seeds, 16, p)
    alone = engine.generate(prompt(1), None, [33], 16, p)
    swapped = engine.generate(prompt(2), None, [44, 11], 16, p)
    assert any(len(c) > 2 for c in full.codes), "decode should run a few frames"
    assert torch.equal(full.codes[2], alone.codes[0])
    assert torch.equal(full.codes[3], swapped.codes[0])
    assert torch.equal(full.codes[0], swapped.codes[1])
    assert not torch.equal(full.codes[0][:2], full.codes[1][:2]), "different seeds, same codes"


def test_finished_rows_are_masked(engine):
    p = SamplingParams(do_sample=False)
    ids = prompt(3)
    ids[1, :-1, 0] = torch.arange(7) + 40  # a different prompt -> a different stop frame
    ids[2, :-1, 0] = torch.arange(7) + 90
    out = engine.generate(ids, None, [0, 1, 2], 24, p)
    lengths = [len(c) for c in out.codes]
    state = engine._state_for(3, ids.shape[1], 24)
    for b, n in enumerate(lengths):
        assert (state.history[b, :n] < CFG.audio_pad_code).all()
        assert (state.history[b, n:] == CFG.audio_pad_code).all()  # nothing after the stop
        assert out.stopped[b] == (n < 24)
    # a row's codes do not depend on whether its neighbours stopped earlier
    for b in range(3):
        solo = engine.generate(ids[b : b + 1], None, [b], 24, p)
        assert torch.equal(solo.codes[0], out.codes[b])


def test_decode_writes_in_place_and_never_grows(engine):
    ids = prompt(2)
    engine.generate(ids, None, [1, 2], 10, SamplingParams())
    state = engine._state_for(2, ids.shape[1], 10)
    before = [(t.data_ptr(), tuple(t.shape)) for t in state.buffers()]
    seen = []
    real = engine._frame_step

    def checked(s, p, kv_len=None):
        real(s, p, kv_len)
        seen.append([(t.data_ptr(), tuple(t.shape)) for t in s.buffers()] == before)

    engine._frame_step = checked
    try:
        engine.generate(
            ids, None, [3, 4], 10, SamplingParams(temperature=1.0, text_temperature=0.2)
        )
    finally:
        del engine._frame_step
    assert seen and all(seen)
    assert engine._state_for(2, ids.shape[1], 10) is state


def test_uniforms_are_a_pure_function_of_seed_and_counter():
    seeds = torch.tensor([0, 1, 2**62 + 5, 7])
    a = take_uniform(seeds, 130)
    assert torch.equal(a, take_uniform(seeds, 130))
    assert torch.equal(a[2:3], take_uniform(seeds[2:3], 130))
    assert not torch.equal(a, take_uniform(seeds, 131))
    many = take_uniform(torch.arange(20000), 3).numpy()
    assert 0 < many.min() and many.max() < 1 and abs(many.mean() - 0.5) < 0.01


def test_sampler_matches_filtered_softmax():
    logits = torch.tensor([[3.0, 2.5, 2.0, 1.0, 0.5, -1.0]])
    n = 20000
    u = take_uniform(torch.arange(n), 9)
    draws = sample_tokens(logits.expand(n, -1), u, temperature=1.5, top_k=4, top_p=0.9)
    freq = np.bincount(draws.numpy(), minlength=6) / n
    expect = torch.softmax(logits[0, :4] / 1.5, -1)
    keep = (expect.cumsum(0) - expect) <= 0.9  # top-p inside top-k
    expect = torch.where(keep, expect, 0.0)
    expect = torch.cat([expect / expect.sum(), torch.zeros(2)]).numpy()
    assert np.abs(freq - expect).max() < 0.015
    greedy = sample_tokens(logits, u[:1], temperature=1.0, top_k=0, top_p=1.0, do_sample=False)
    assert greedy.item() == 0
    assert sample_tokens(logits, u[:1], temperature=1.0, top_k=1, top_p=1.0).item() == 0


def test_repetition_penalty_follows_reference_rule():
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, True, False]])
    out = apply_repetition_penalty(logits, seen, 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_config_json_from_disk(tmp_path):
    path = tmp_path / "config.json"
    raw = local_v15_config().to_hf_dict()
    raw["gpt2_config"].pop("position_embedding_type")  # absent -> GPT-2 default: learned
    path.write_text(json.dumps(raw))
    assert MossLocalConfig.from_json(path).local_positions == "absolute"


# ---- the moss-fast backend ------------------------------------------------------------------


def _write_byte_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path))


@pytest.fixture(scope="module")
def model_dir(ckpt):
    _write_byte_tokenizer(ckpt / "tokenizer.json")
    return ckpt


def test_backend_names_missing_paths(tmp_path, model_dir):
    from bestofn.backends.moss_fast import MossFastGenerator

    with pytest.raises(FileNotFoundError, match=r"config\.json.*model_dir"):
        MossFastGenerator(model_dir=str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="codec_dir"):
        MossFastGenerator(model_dir=str(model_dir), codec_dir=str(tmp_path / "nocodec"))
    with pytest.raises(TypeError, match="unknown options"):
        MossFastGenerator(model_dir=str(model_dir), temperature=1.0)


def test_prompt_follows_the_v15_template(model_dir):
    from bestofn.moss.prompt import PromptBuilder, left_pad

    pb = PromptBuilder.from_tokenizer_json(model_dir / "tokenizer.json", CFG)
    rows = pb.rows("Hi there.", language="English")
    text = rows[:, 0].tolist()
    assert text[0] == CFG.im_start_token_id and text[-1] == CFG.audio_start_token_id
    assert (rows[:, 1:] == CFG.audio_pad_code).all()
    from tokenizers import Tokenizer

    body = Tokenizer.from_file(str(model_dir / "tokenizer.json")).decode(
        [t for t in text if t < 256]
    )
    assert body.startswith("user\n<user_inst>\n- Reference(s):\nNone\n- Instruction:\nNone\n")
    assert "- Language:\nEnglish\n- Text:\nHi there.\n</user_inst>\nassistant\n" in body
    ref = torch.randint(0, CFG.audio_codebook_sizes[0], (5, CFG.n_vq))
    cloned = pb.rows("Hi there.", references=[ref])
    slot = cloned[:, 0] == CFG.audio_user_slot_token_id
    assert slot.sum() == 5 and torch.equal(cloned[slot, 1:], ref)
    ids, mask = left_pad([rows, cloned], CFG)
    assert ids.shape[1] == cloned.shape[0] and (~mask[0]).sum() == cloned.shape[0] - rows.shape[0]


def test_backend_generates_reproducible_takes(tmp_path, model_dir):
    pytest.importorskip("transformers")
    from bestofn.backends.moss_fast import MossFastGenerator
    from bestofn.fakes import moss_codec
    from bestofn.util.spec import GroupSpec

    codec_dir = moss_codec.write(tmp_path / "codec", "tiny")
    gen = MossFastGenerator(
        model_dir=str(model_dir),
        codec_dir=str(codec_dir),
        min_frames=4,
        max_frames=12,
        text_temperature=0.3,
        hash_weights=True,
    )
    spec = GroupSpec(emotion="calm", prompt_id="p1", text="Hello world again.", n_takes=3)
    assert gen.decode_s == 0.0
    takes = gen.generate(spec)
    assert gen.decode_s > 0.0  # the codec decode is timed (bestofn ab's decode row)
    assert [t.seed for t in takes] == spec.seeds()
    for t in takes:
        assert t.audio.dtype == np.float32 and t.audio.ndim == 2 and t.audio.shape[1] == 2
        assert t.audio.shape[0] == t.meta["n_frames"] * 3840
    two = GroupSpec(emotion="calm", prompt_id="p1", text="Hello world again.", n_takes=2)
    again, _, _ = gen.generate_codes(two)
    first, _, _ = gen.generate_codes(spec)
    assert all(torch.equal(a, b) for a, b in zip(again, first[:2], strict=True))
    prov = gen.provenance()
    assert prov["backend"] == "moss-fast" and any(
        k.endswith("model.safetensors") for k in prov["weights_sha256"]
    )
    # runtime codec_kernels: auto asked for, the eager pieces ran (no CUDA here)
    assert prov["settings"]["codec_kernels"] == "auto" and prov["codec_kernels"] == "eager"


def test_random_tiny_build_runs():
    from bestofn.fakes.moss import build
    from bestofn.util.spec import GroupSpec

    gen = build("cpu", size="tiny", max_frames=6, min_frames=2)
    codes, stopped, budget = gen.generate_codes(GroupSpec("e", "p", "a b", n_takes=2))
    assert budget == 6 and len(codes) == 2 and all(c.shape[1] == CFG.n_vq for c in codes)


# ---- kernel paths: moss-fast runtime options, not environment variables ------------------------


def test_kernel_paths_are_schema_options_checked_with_their_field():
    import jsonschema

    from bestofn.moss.local_loop import LOCAL_ATTENTION_MODES
    from bestofn.moss.model import DECODE_ATTENTION_MODES
    from bestofn.moss.options import engine_defaults
    from bestofn.schemas import schema

    sch = schema("config")
    props = sch["$defs"]["moss_fast_runtime"]["properties"]
    assert tuple(props["decode_attention"]["enum"]) == DECODE_ATTENTION_MODES
    assert tuple(props["local_attention"]["enum"]) == LOCAL_ATTENTION_MODES
    from bestofn.moss.codec.stream import MODES as STREAM_MODES

    assert set(props["stream_decode"]["enum"]) - {"auto"} <= set(STREAM_MODES)
    assert engine_defaults() == {
        "fused": True, "decode_attention": "auto", "local_attention": "auto", "compile_mode": None,
        "codec_kernels": "auto", "stream_decode": "auto", "speech_admit_tokens": None,
        "pair_groups": False,
    }  # fmt: skip

    def errors(runtime, backend="moss-fast"):
        cfg = {"emotions": "e.tsv", "prompts": "p.tsv", "takes": 2,
               "models": {"generator": {"backend": backend, "runtime": runtime}},
               "selection": {"filter": "true", "score": "1"}}  # fmt: skip
        return [
            (".".join(map(str, e.absolute_path)), e.message)
            for e in jsonschema.Draft202012Validator(sch).iter_errors(cfg)
        ]

    assert errors({"decode_attention": "sdpa", "fused": False, "batch_size": 8}) == []
    [(where, message)] = errors({"local_attention": "fast"})
    assert where == "models.generator.runtime.local_attention" and "'fast'" in message
    assert errors({"compile_mode": "max-autotune"})  # its CUDA graphs would nest in ours
    assert errors({"speech_admit_tokens": 0}) and not errors({"speech_admit_tokens": None})
    from bestofn.moss.options import check_engine_options

    for bad in (0, 2.5, True, "64"):  # built without a config: refused by the backend too
        with pytest.raises(ValueError, match="runtime.speech_admit_tokens must be an integer"):
            check_engine_options({"speech_admit_tokens": bad}, "moss-fast")
    check_engine_options({"speech_admit_tokens": None, "fused": True}, "moss-fast")
    assert errors({"local_attention": "fast"}, backend="piper") == []  # moss-fast's only


def test_backend_sets_the_kernel_paths_on_its_model_and_names_them():
    from bestofn.fakes.moss import build

    paths = dict(fused=False, decode_attention="sdpa", local_attention="reduce")
    gen = build("cpu", size="tiny", **paths)
    m = gen.model
    assert not m.fused_local and not m.fused_backbone
    assert m.local_attention == "reduce" and {layer.attention for layer in m.layers} == {"sdpa"}
    prov = gen.provenance()
    assert prov["decode_attention"] == "sdpa" and prov["local_attention"] == "reduce"
    assert prov["settings"]["fused"] is False and prov["settings"]["compile_mode"] is None
    other = build("cpu", size="tiny")  # the same process: the defaults, not the first's paths
    assert other.model.fused_local and other.model.layers[0].attention == "auto"
    with pytest.raises(ValueError, match="runtime.decode_attention is 'fast'"):
        build("cpu", size="tiny", decode_attention="fast")
