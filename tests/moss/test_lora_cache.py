"""LoRA merge cache: real peft adapters on a tiny random Qwen3, checked against peft itself."""

from __future__ import annotations

import importlib.util
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from bestofn.moss import lora  # noqa: E402

RANK, ALPHA = 4, 8
pytestmark = [
    pytest.mark.filterwarnings("ignore:Setting `save_embedding_layers`:UserWarning"),
    # whether peft is installed, not imported: importing it took ~3 s of every pytest-xdist
    # worker's collection (the tests import it where they run, _make_adapter)
    pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="peft not installed"),
]


def _tiny_qwen3():
    config = transformers.Qwen3Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(config).eval()


def _merged_state(path):
    state = {}
    for shard in sorted(path.glob("*.safetensors")):
        state.update(load_file(str(shard)))
    return state


def _make_adapter(base_model, out_dir, seed):
    """A peft LoRA with non-zero A and B (peft inits B to zero, which would merge to nothing)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=RANK,
        lora_alpha=ALPHA,
        target_modules=["q_proj", "v_proj", "down_proj", "embed_tokens"],
        alpha_pattern={"down_proj": 2},  # per-module scale must be honoured
    )
    peft_model = get_peft_model(base_model, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    peft_model.save_pretrained(out_dir)
    return peft_model


@pytest.fixture()
def setup(tmp_path):
    base_dir, adapter_dir, cache_dir = tmp_path / "base", tmp_path / "adapter", tmp_path / "cache"
    _tiny_qwen3().save_pretrained(base_dir)
    peft_model = _make_adapter(_tiny_qwen3(), adapter_dir, seed=1)
    return base_dir, adapter_dir, cache_dir, peft_model


def test_merge_equals_base_plus_scaled_BA_and_peft_merge(setup):
    base_dir, adapter_dir, cache_dir, peft_model = setup
    merged_dir = lora.merged_weights_dir(base_dir, adapter_dir, cache_dir)
    merged = _merged_state(merged_dir)
    base = _merged_state(base_dir)
    params = dict(peft_model.named_parameters())

    # explicit formula on one linear layer per scale
    prefix = "base_model.model.model.layers.0."
    for module, scale in [("self_attn.q_proj", ALPHA / RANK), ("mlp.down_proj", 2 / RANK)]:
        a = params[f"{prefix}{module}.lora_A.default.weight"]
        b = params[f"{prefix}{module}.lora_B.default.weight"]
        key = f"model.layers.0.{module}.weight"
        expected = base[key] + scale * (b @ a)
        assert not torch.allclose(merged[key], base[key])
        torch.testing.assert_close(merged[key], expected, rtol=1e-5, atol=1e-6)
    # embedding LoRA: W += scale * (B @ A).T
    a = params["base_model.model.model.embed_tokens.lora_embedding_A.default"]
    b = params["base_model.model.model.embed_tokens.lora_embedding_B.default"]
    key = "model.embed_tokens.weight"
    torch.testing.assert_close(merged[key], base[key] + ALPHA / RANK * (b @ a).T)

    # every tensor equals peft's own merge, and the merged dir loads and runs like the adapter
    ids = torch.tensor([[1, 5, 7, 9, 2]])
    with torch.no_grad():
        want_logits = peft_model(input_ids=ids).logits
    reference = peft_model.merge_and_unload().state_dict()
    assert set(merged) == set(base)
    for key, value in merged.items():
        torch.testing.assert_close(value, reference[key], rtol=1e-5, atol=1e-6, msg=key)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(input_ids=ids).logits, want_logits, rtol=1e-4, atol=1e-5
        )
    info = lora.merge_info(merged_dir)
    assert info["n_lora_merged"] == 2 * 3 + 1 and info["adapter_dir"] == str(adapter_dir)


def test_second_call_is_a_cache_hit(setup, monkeypatch):
    base_dir, adapter_dir, cache_dir, _ = setup
    first = lora.merged_weights_dir(base_dir, adapter_dir, cache_dir)
    stamp = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}

    def no_merge(*args, **kwargs):
        raise AssertionError("re-merged on a cache hit")

    monkeypatch.setattr(lora, "_merge_into", no_merge)
    second = lora.merged_weights_dir(base_dir, adapter_dir, cache_dir)
    assert second == first
    assert {p.name: p.stat().st_mtime_ns for p in second.iterdir()} == stamp


def test_changed_adapter_invalidates_cache(setup):
    base_dir, adapter_dir, cache_dir, _ = setup
    first = lora.merged_weights_dir(base_dir, adapter_dir, cache_dir)
    _make_adapter(_tiny_qwen3(), adapter_dir, seed=2)  # retrained adapter, same directory
    second = lora.merged_weights_dir(base_dir, adapter_dir, cache_dir)
    assert second != first and first.is_dir()
    key = "model.layers.1.self_attn.v_proj.weight"
    assert not torch.allclose(_merged_state(first)[key], _merged_state(second)[key])

    # and the new merge reflects the new adapter
    adapter = load_file(str(adapter_dir / "adapter_model.safetensors"))
    a = adapter["base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"]
    b = adapter["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"]
    expected = _merged_state(base_dir)[key] + ALPHA / RANK * (b @ a)
    torch.testing.assert_close(_merged_state(second)[key], expected, rtol=1e-5, atol=1e-6)


def test_clear_errors(setup, tmp_path):
    base_dir, adapter_dir, cache_dir, _ = setup
    with pytest.raises(FileNotFoundError, match="nope"):
        lora.merged_weights_dir(base_dir, tmp_path / "nope", cache_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    config["use_dora"] = True
    (adapter_dir / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(lora.LoraMergeError, match="use_dora"):
        lora.merged_weights_dir(base_dir, adapter_dir, cache_dir)
    assert not list(cache_dir.glob("merged-*/"))  # nothing half-written left behind
