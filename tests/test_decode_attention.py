"""The decode attention of one new token per row (bestofn.moss.model.decode_attention): the
matmul option equals SDPA (the default) with the same key mask, grouped-query shape included,
and a masked slot has no weight."""

import pytest
import torch
import torch.nn.functional as F

from bestofn.moss import model


def _inputs(B=3, kv=2, group=4, L=37, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, kv, group, D, generator=g)
    k = torch.randn(B, kv, L, D, generator=g)
    v = torch.randn(B, kv, L, D, generator=g)
    keep = torch.rand(B, L, generator=g) < 0.7
    keep[:, 0] = True  # every row attends to at least one slot
    bias = torch.zeros(B, 1, 1, L).masked_fill(~keep[:, None, None, :], float("-inf"))
    return q, k, v, bias, keep


def test_matmul_path_equals_sdpa(monkeypatch):
    q, k, v, bias, _ = _inputs()
    monkeypatch.setattr(model, "DECODE_ATTENTION", "matmul")
    ours = model.decode_attention(q, k, v, bias, 0.25)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.25)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_masked_slots_have_no_weight(monkeypatch):
    q, k, v, bias, keep = _inputs(seed=1)
    monkeypatch.setattr(model, "DECODE_ATTENTION", "matmul")
    before = model.decode_attention(q, k, v, bias, 0.25)
    v2 = v.clone()
    v2[~keep[:, None, :, None].expand_as(v)] = 1e6  # poison only the masked slots
    k2 = k.clone()
    k2[~keep[:, None, :, None].expand_as(k)] = 1e3
    torch.testing.assert_close(model.decode_attention(q, k2, v2, bias, 0.25), before)


@pytest.mark.parametrize("mode", ["matmul", "sdpa"])
def test_non_contiguous_kv_views(monkeypatch, mode):
    # The fused cache keeps K and V side by side ([B, kv, L, 2, D]); attention reads views.
    q, k, v, bias, _ = _inputs(seed=2)
    kv = torch.stack([k, v], dim=3)
    monkeypatch.setattr(model, "DECODE_ATTENTION", mode)
    got = model.decode_attention(q, kv[..., 0, :], kv[..., 1, :], bias, 0.25)
    torch.testing.assert_close(got, model.decode_attention(q, k, v, bias, 0.25))
