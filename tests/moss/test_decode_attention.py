"""The decode attention of one new token per row (bestofn.moss.model.decode_attention): a
masked slot has no weight, the fused cache's strided views give the contiguous result, and the
Triton kernel equals SDPA with the same key mask, grouped-query shape included."""

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


def test_masked_slots_have_no_weight():
    q, k, v, bias, keep = _inputs(seed=1)
    before = model.decode_attention(q, k, v, bias, 0.25, "sdpa")
    v2 = v.clone()
    v2[~keep[:, None, :, None].expand_as(v)] = 1e6  # poison only the masked slots
    k2 = k.clone()
    k2[~keep[:, None, :, None].expand_as(k)] = 1e3
    torch.testing.assert_close(model.decode_attention(q, k2, v2, bias, 0.25, "sdpa"), before)


@pytest.mark.parametrize("mode", ["auto", "sdpa"])
def test_non_contiguous_kv_views(mode):
    # The fused cache keeps K and V side by side ([B, kv, L, 2, D]); attention reads views.
    q, k, v, bias, _ = _inputs(seed=2)
    kv = torch.stack([k, v], dim=3)
    got = model.decode_attention(q, kv[..., 0, :], kv[..., 1, :], bias, 0.25, mode)
    torch.testing.assert_close(got, model.decode_attention(q, k, v, bias, 0.25, mode))


def test_triton_path_needs_cuda_tensors_else_sdpa():
    """decode_attention: triton runs the Triton kernel on CUDA tensors only; on the CPU the
    same call gives SDPA's result (parity and the CPU tests go through there)."""
    q, k, v, bias, _ = _inputs(seed=3)
    got = model.decode_attention(q, k, v, bias, 0.25, "triton")
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.25)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


def test_triton_kernel_equals_sdpa_in_the_interpreter(triton_interpreter, monkeypatch):
    """The split-K kernel's maths (blocks of 64 keys, a whole block masked, the merge), run by
    Triton's CPU interpreter in float32 against SDPA. Needs the triton package (CPU torch
    wheels lack it, the `dev` extra brings it); the H200 runs check the same on the device
    (docs/PERFORMANCE.md)."""
    from bestofn.moss import decode_kernel

    monkeypatch.setattr(decode_kernel, "_KERNELS", {})  # built anew under the interpreter
    for B, kv, group, L, D in [(3, 2, 4, 150, 16), (2, 2, 4, 64, 32), (2, 1, 3, 200, 16)]:
        q, k, v, bias, _ = _inputs(B, kv, group, L, D, seed=4)
        bias[:, :, :, :70] = float("-inf")  # the first block (and part of the second) masked
        bias[:, :, :, -1] = 0.0
        bias[-1] = float("-inf")  # a row with every slot masked: SDPA gives 0 there
        cache = torch.stack([k, v], dim=3)  # the fused cache's strided views
        got = decode_kernel.decode_attention_triton(
            q, cache[..., 0, :], cache[..., 1, :], bias, 0.25
        )
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.25)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert torch.equal(got[-1], torch.zeros_like(got[-1]))


def test_provenance_names_the_attention_path(monkeypatch):
    from bestofn.moss import decode_kernel

    assert model.decode_attention_path("cpu", "auto") == "sdpa"
    monkeypatch.setattr(decode_kernel, "_KERNELS", {"partial": object(), "merge": object()})
    assert model.decode_attention_path("cuda:0", "auto").startswith("triton split-K")
    monkeypatch.setattr(decode_kernel, "_KERNELS", {"partial": None})  # Triton missing
    assert model.decode_attention_path("cuda:0", "auto") == "sdpa"
    assert model.decode_attention_path("cuda:0", "sdpa") == "sdpa"


def test_kernel_refuses_shapes_whose_offsets_pass_int32():
    # Triton multiplies row by stride in int32; a cache that big must go to SDPA (meta tensors:
    # shapes and strides only, no memory)
    from bestofn.moss import decode_kernel

    def qkv(batch, slots, kv=8, group=4, d=128):
        q = torch.empty(batch, kv, group, d, device="meta")
        cache = torch.empty(batch, kv, slots, 2, d, device="meta")  # the fused K/V layout
        return q, cache[..., 0, :], cache[..., 1, :]

    assert decode_kernel.supports(*qkv(64, 320))
    assert decode_kernel.supports(*qkv(512, 2048))  # 2**31 elements: the last offset fits
    assert not decode_kernel.supports(*qkv(640, 2048))  # 1.25 x 2**31: would wrap
    assert not decode_kernel.supports(*qkv(64, 320, d=80))  # head dim not a power of 2
