"""Sidon's relative-key self-attention built once (bestofn.backends.sidon_attention) gives
transformers' values: the same encoder output with and without it, with padded takes, for both
of transformers' attention implementations; and the restorer routes every layer through it."""

import pytest
import torch

from bestofn.backends import sidon_attention
from bestofn.fakes import sidon


@pytest.fixture(autouse=True)
def default_mode():
    yield
    sidon_attention.set_attention("auto")


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_encoder_output_is_transformers_own(implementation):
    encoder, _ = sidon.build_modules(tiny=True, num_layers=2, seed=3)
    encoder.config._attn_implementation = implementation
    encoder.eval()
    assert sidon_attention.install(encoder) == 2
    torch.manual_seed(0)
    features = torch.randn(3, 90, encoder.config.feature_projection_input_dim)
    mask = torch.ones(3, 90, dtype=torch.long)
    mask[1, 61:] = 0  # padded takes: the bias is masked where transformers masks it
    mask[2, 17:] = 0
    outputs = {}
    for mode in ("transformers", "ours"):
        sidon_attention.set_attention(mode)
        with torch.inference_mode():
            outputs[mode] = encoder(input_features=features, attention_mask=mask).last_hidden_state
    valid = mask.bool()
    assert torch.allclose(outputs["ours"][valid], outputs["transformers"][valid], atol=2e-5), (
        (outputs["ours"] - outputs["transformers"])[valid].abs().max()
    )
    assert not torch.equal(outputs["ours"][0], outputs["ours"][1])  # inputs differ, outputs too


def test_bias_is_the_scaled_distance_embedding_product():
    encoder, _ = sidon.build_modules(tiny=True, num_layers=1, seed=4)
    attn = encoder.encoder.layers[0].self_attn
    query = torch.randn(2, attn.num_heads, 80, attn.head_size)
    bias = sidon_attention.relative_key_bias(attn, query, None)
    left, right = attn.left_max_position_embeddings, attn.right_max_position_embeddings
    for q, k in [(0, 0), (5, 2), (2, 5), (79, 0), (0, 79), (40, 40 + right + 3)]:
        d = max(-left, min(right, k - q)) + left  # clamped distance from query q to key k
        want = (query[:, :, q] @ attn.distance_embedding.weight[d]) * attn.scaling
        assert torch.allclose(bias[:, :, q, k], want, atol=1e-5), (q, k)
    keep = torch.zeros(2, 1, 1, 80, dtype=torch.bool)
    keep[..., :30] = True
    masked = sidon_attention.relative_key_bias(attn, query, keep)
    assert (masked[..., 30:] == torch.finfo(masked.dtype).min).all()
    assert torch.equal(masked[..., :30], bias[..., :30])


def test_restorer_installs_it_and_cpu_auto_keeps_transformers():
    restorer = sidon.build("cpu", "tiny")
    kind = "Wav2Vec2BertSelfAttention"
    layers = [m for m in restorer.encoder.modules() if type(m).__name__ == kind]
    assert layers and all("forward" in vars(m) for m in layers)
    assert not sidon_attention._use_ours(torch.zeros(1))  # auto: CUDA only
    with pytest.raises(ValueError, match="attention must be"):
        sidon_attention.set_attention("fast")
