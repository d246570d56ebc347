"""moss-fast `weights: int8`: int8 weight-only backbone Linear weights (bestofn.moss.int8)."""

from __future__ import annotations

import pytest
import torch

from bestofn.fakes.moss import build, random_state_dict, tiny_config
from bestofn.moss.checkpoint import model_from_state_dict
from bestofn.moss.int8 import (
    BACKBONE_LINEARS,
    Int8Linear,
    is_quantized,
    linear_bytes,
    quantize_backbone_,
    quantize_per_channel,
)
from bestofn.util.spec import GroupSpec

CFG = tiny_config(vocab_size=264)


def tiny_model(dtype=torch.float32):
    return model_from_state_dict(CFG, random_state_dict(CFG, seed=3), "cpu", dtype)


def logits(model, ids):
    cache = model.new_backbone_cache(ids.shape[0], ids.shape[1] + 4)
    h = model.prefill(ids, torch.ones(ids.shape[:2], dtype=torch.bool), cache)
    return torch.cat([model.stop_logits(h), model.audio_logits(h, 0)], -1)


def test_per_channel_quantization_is_symmetric_and_round_trips():
    w = torch.randn(24, 40) * torch.linspace(0.01, 3.0, 24)[:, None]  # rows of other ranges
    q, scale = quantize_per_channel(w)
    assert q.dtype == torch.int8 and scale.shape == (24,)
    assert int(q.abs().amax(dim=1).min()) == 127  # every row uses its whole range
    err = (q.float() * scale[:, None] - w).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-6).all())  # at most half a step per element


def test_int8_logits_stay_close_to_float():
    ref = tiny_model()
    quant = quantize_backbone_(tiny_model())
    assert is_quantized(quant) and not is_quantized(ref)
    for layer in quant.layers:
        assert all(isinstance(getattr(layer, n), Int8Linear) for n in BACKBONE_LINEARS)
    ids = torch.randint(0, 256, (2, 12, 1 + CFG.n_vq))
    ids[..., 1:] = torch.randint(0, 16, (2, 12, CFG.n_vq))
    with torch.no_grad():
        a, b = logits(ref, ids), logits(quant, ids)
    rel = float((a - b).norm() / a.norm())
    assert 0 < rel < 0.03, rel  # changed (it is quantized), but by little


def test_int8_linear_forward_matches_its_dequantized_weight():
    lin = torch.nn.Linear(32, 16, bias=False)
    q = Int8Linear.from_linear(lin)
    x = torch.randn(3, 32)
    torch.testing.assert_close(q(x), x @ q.weight.t(), rtol=1e-5, atol=1e-5)


def test_quantized_linear_weights_take_about_half_of_bf16():
    model = tiny_model(torch.bfloat16)
    full = linear_bytes(model)
    quantize_backbone_(model)
    held = linear_bytes(model)
    # int8 matrix + one bf16 scale per output channel: 0.5 + 1 / in_features of bf16's bytes
    smallest_in = min(CFG.hidden_size, CFG.intermediate_size, CFG.num_heads * CFG.head_dim)
    assert 0.5 < held / full <= 0.5 + 1 / smallest_in
    # no full-precision copy of the backbone Linear weights stays behind
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.endswith(tuple(f"{x}.weight" for x in BACKBONE_LINEARS)) for n in names)


def test_real_size_backbone_linear_bytes_halve():
    from bestofn.moss.config import local_v15_config
    from bestofn.moss.model import MossLocalModel

    with torch.device("meta"):  # shapes only: the 4B model's sizes without allocating it
        model = MossLocalModel(local_v15_config()).to(torch.bfloat16)
        full = linear_bytes(model)
        quantize_backbone_(model)
    ratio = linear_bytes(model) / full
    assert 0.5 < ratio < 0.501, ratio
    assert full > 5e9  # the 4B backbone's Linear weights in bf16


def test_generator_option_quantizes_and_is_in_provenance():
    spec = GroupSpec("e", "p", "a b", n_takes=2)
    gen = build("cpu", size="tiny", max_frames=6, min_frames=2, weights="int8")
    assert is_quantized(gen.model)
    assert gen.provenance()["settings"]["weights"] == "int8"
    codes, _, budget = gen.generate_codes(spec)
    assert budget == 6 and len(codes) == 2 and all(c.shape[1] == gen.config.n_vq for c in codes)
    again, _, _ = gen.generate_codes(spec)
    assert all(torch.equal(x, y) for x, y in zip(codes, again, strict=True))  # seeded
    plain = build("cpu", size="tiny", max_frames=6, min_frames=2)
    assert not is_quantized(plain.model) and plain.provenance()["settings"]["weights"] == "dtype"


def test_unknown_weights_value_is_refused():
    with pytest.raises(ValueError, match="option weights is 'int4'; known: dtype, int8"):
        build("cpu", size="tiny", weights="int4")
