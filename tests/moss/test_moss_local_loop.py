"""The fused local loop (moss/local_loop.py) against the unfused per-piece loop, and the fused
backbone projections against separate q/k/v and gate/up matmuls (tiny random models, CPU fp32)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from bestofn.fakes.moss import random_state_dict, tiny_config
from bestofn.moss import local_loop
from bestofn.moss.checkpoint import model_from_state_dict
from bestofn.moss.engine import MossLocalEngine
from bestofn.moss.local_loop import local_position, rope_tables, swap_pairs
from bestofn.moss.model import _rotate_pairs
from bestofn.moss.sampling import (
    SamplingParams,
    sample_tokens,
    sample_tokens_fused,
    take_uniform,
)

CFG = tiny_config(vocab_size=264)
# learned positions, two local blocks, codebooks of different sizes (masked head logits)
CFG_ABS = dataclasses.replace(
    CFG,
    local_positions="absolute",
    local_layers=2,
    local_activation="gelu_new",
    audio_codebook_sizes=[16, 12, 16, 9],
)


def _model(cfg, seed=3):
    return model_from_state_dict(cfg, random_state_dict(cfg, seed), dtype=torch.float32)


def _prompt(cfg, batch, length=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((batch, length, 1 + cfg.n_vq), cfg.audio_pad_code)
    ids[..., 0] = torch.randint(0, 200, (batch, length), generator=g)
    ids[:, -1, 0] = cfg.audio_start_token_id
    return ids


def test_rope_tables_rotate_exactly_like_the_unfused_rotation():
    d = 8
    cos, sin = torch.randn(5, d), torch.randn(5, d)
    cos3, sin3 = rope_tables(cos, sin)
    x = torch.randn(3, 3, 4, d)  # [B, q/k/v, heads, D]
    for j in range(5):
        fused = x * cos3[j] + swap_pairs(x) * sin3[j]
        qk = x[:, :2]
        assert torch.equal(fused[:, :2], qk * cos[j] + _rotate_pairs(qk) * sin[j])
        assert torch.equal(fused[:, 2], x[:, 2])  # v passes through


@pytest.mark.parametrize("kind", ["normal", "ties", "wide"])
def test_fused_sampler_draws_exactly_what_the_unfused_one_draws(kind):
    g = torch.Generator().manual_seed(7)
    B, V = 512, 64
    logits = torch.randn(B, V, generator=g)
    if kind == "ties":  # many equal logits (as in bf16) and equal probabilities
        logits = (logits * 2).round()
    elif kind == "wide":  # probabilities that underflow to 0 (flat stretches in the CDF)
        logits = logits * 60
    logits[0] = float("-inf")
    logits[0, 3] = 1.0  # one finite candidate
    u = take_uniform(torch.arange(B), 5)
    differ = 0
    for top_k in (0, 1, 5, 25, V):
        for top_p in (1.0, 0.95, 0.8, 0.3, 1e-6):
            for temp in (0.3, 1.0, 1.7, torch.tensor(1.7)):
                kw = dict(temperature=temp, top_k=top_k, top_p=top_p)
                a = sample_tokens(logits, u, **kw)
                b = sample_tokens_fused(logits, u, **kw)
                assert torch.equal(a, b), (top_k, top_p, temp)
                differ += int((a != a[0]).any())
    assert differ > 0  # the draws do depend on the rows
    greedy = dict(temperature=1.0, top_k=5, top_p=0.8, do_sample=False)
    assert torch.equal(sample_tokens(logits, u, **greedy), sample_tokens_fused(logits, u, **greedy))


@pytest.mark.parametrize("cfg", [CFG, CFG_ABS], ids=["rope", "absolute-uneven"])
def test_local_positions_give_the_same_hidden_as_local_step(cfg):
    m = _model(cfg)
    B = 3
    old, new = m.new_local_cache(B), m.new_local_cache(B)
    cos3, sin3 = m.local_rope_tables(torch.float32, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    for j in range(cfg.n_vq):
        x = torch.randn(B, cfg.hidden_size, generator=g)
        a = m.local_step(x, j, old)
        b = local_position(m, x, j, new.kv, cos3, sin3, "sdpa")
        assert torch.equal(a, b), f"position {j}: max|diff| {(a - b).abs().max():.3e}"
        for k in range(cfg.n_vq):
            assert torch.equal(m.audio_logits(a, k), m.audio_logits(b, k))
        assert torch.equal(new.kv[:, :, j, 0], old.k[:, :, :, j])
        assert torch.equal(new.kv[:, :, j, 1], old.v[:, :, :, j])


@pytest.mark.parametrize("cfg", [CFG, CFG_ABS], ids=["rope", "absolute-uneven"])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(do_sample=False),
        SamplingParams(temperature=1.7, top_p=0.8, top_k=5, repetition_penalty=1.3),
        SamplingParams(temperature=1.0, top_p=0.5, top_k=0, text_top_k=2),
    ],
    ids=["greedy", "sampled-penalty", "sampled-no-top-k"],
)
def test_fused_frame_gives_the_unfused_loops_codes(cfg, params):
    m = _model(cfg)
    ids = _prompt(cfg, 4)
    seeds = [11, 12, 13, 14]
    outs = {}
    for fused in (False, True):
        m.set_fused(fused)  # a new engine: its caches are laid out for the mode
        engine = MossLocalEngine(m, use_cuda_graphs=False, compile=False)
        assert (engine._state_for(4, 8, 12).cache.kv is not None) == fused
        outs[fused] = engine.generate(ids, None, seeds, 12, params)
    for a, b in zip(outs[False].codes, outs[True].codes, strict=True):
        assert torch.equal(a, b)
    assert outs[False].stopped == outs[True].stopped
    assert sum(len(c) for c in outs[True].codes) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reduce_local_attention_matches_sdpa_on_the_cache_views(dtype):
    # the fused loop's K/V are strided views of one [B, L, 2, heads, D] cache
    g = torch.Generator().manual_seed(4)
    B, L, heads, D = 3, 7, 4, 16
    kv = torch.randn(B, L + 2, 2, heads, D, generator=g).to(dtype)
    keys, values = kv[:, :L, 0].transpose(1, 2), kv[:, :L, 1].transpose(1, 2)
    q = (3 * torch.randn(B, heads, 1, D, generator=g)).to(dtype)
    got = local_loop.local_attention(q, keys, values, "reduce")
    assert got.dtype == dtype and got.shape == (B, heads, 1, D)
    exact = F.scaled_dot_product_attention(q.double(), keys.double(), values.double())
    tol = 1e-6 if dtype == torch.float32 else 8e-3  # float32 maths, one rounding to bf16
    torch.testing.assert_close(got.double(), exact, rtol=tol, atol=tol)
    # only the last key sees a huge score: the output is that key's value
    q_one = torch.zeros_like(q)
    keys_one = torch.zeros_like(keys)
    keys_one[:, :, -1] = 1.0
    q_one[..., :] = 100.0
    torch.testing.assert_close(
        local_loop.local_attention(q_one, keys_one, values, "reduce"), values[:, :, -1:]
    )


def test_local_attention_path_defaults_to_sdpa_on_cpu_and_reduce_on_cuda():
    assert local_loop.local_attention_path("cpu", "auto") == "sdpa"
    assert local_loop.local_attention_path("cuda:0", "auto") == "reduce"
    assert local_loop.local_attention_path("cuda:0", "sdpa") == "sdpa"
    assert local_loop.local_attention_path("cpu", "reduce") == "reduce"


@pytest.mark.parametrize(
    "params",
    [SamplingParams(do_sample=False), SamplingParams(temperature=1.7, top_p=0.8, top_k=5)],
    ids=["greedy", "sampled"],
)
def test_fused_frame_with_reduce_attention_draws_the_sdpa_codes(params):
    # float32 on the CPU: the two attentions differ by rounding only, far below what moves a
    # draw of these tiny models; a wrong scale or softmax axis changes the codes
    m = _model(CFG)
    m.set_fused(True)
    ids, seeds = _prompt(CFG, 4), [21, 22, 23, 24]
    outs = {}
    for path in ("sdpa", "reduce"):
        m.set_paths(local_attention=path)  # moss-fast's runtime option local_attention
        engine = MossLocalEngine(m, use_cuda_graphs=False, compile=False)
        outs[path] = engine.generate(ids, None, seeds, 12, params)
    for a, b in zip(outs["sdpa"].codes, outs["reduce"].codes, strict=True):
        assert torch.equal(a, b)
    assert sum(len(c) for c in outs["reduce"].codes) > 0


@pytest.mark.parametrize("padded", [False, True])
def test_fused_backbone_step_gives_the_unfused_hidden(padded):
    """K+V in one write and residual+next norm fused: same hidden, same cache, bit for bit."""
    m = _model(CFG)
    ids = _prompt(CFG, 3, length=6)
    mask = torch.ones(3, 6, dtype=torch.bool)
    if padded:
        mask[0, :2] = False
    alive = torch.tensor([True, False, True])
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(3, CFG.hidden_size, generator=g) for _ in range(5)]
    out = {}
    for fused in (False, True):
        m.set_fused(fused)
        cache = m.new_backbone_cache(3, 64)
        hs = [m.prefill(ids, mask, cache)]
        hs += [
            m.backbone_step(x, alive, cache, kv_len=64 if i % 2 else None) for i, x in enumerate(xs)
        ]
        out[fused] = (hs, cache)
    for a, b in zip(out[False][0], out[True][0], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(out[False][1].k, out[True][1].k)
    assert torch.equal(out[False][1].v, out[True][1].v)
    assert out[True][1].kv is not None and out[False][1].kv is None


def test_fused_backbone_projections_equal_separate_ones():
    """Loading concatenates q/k/v and gate/up once; the fused matmuls must give the logits the
    separate published projections give (a plain per-layer reimplementation from the state
    dict, no cache)."""
    cfg = CFG
    sd = random_state_dict(cfg, 5)
    m = model_from_state_dict(cfg, sd, dtype=torch.float32)
    ids = _prompt(cfg, 2, length=6)
    cache = m.new_backbone_cache(2, 16)
    fused_hidden = m.prefill(ids, torch.ones(2, 6, dtype=torch.bool), cache)

    def w(name):
        return sd[name].float()

    keys = list(sd)
    prefix = next(k for k in keys if k.endswith("layers.0.self_attn.q_proj.weight"))
    prefix = prefix[: -len("layers.0.self_attn.q_proj.weight")]
    eps, D = cfg.rms_norm_eps, cfg.head_dim
    x = m.embed_rows(ids).float()
    T = ids.shape[1]
    pos = torch.arange(T)
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2).float() / D))
    ang = torch.cat([pos[:, None] * inv] * 2, -1)
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]

    def rms(t, wt):
        return wt * F.rms_norm(t, (t.shape[-1],), None, eps)

    def rot(t):
        a, b = t.chunk(2, -1)
        return torch.cat((-b, a), -1)

    for i in range(cfg.num_layers):
        p = f"{prefix}layers.{i}."
        h = rms(x, w(p + "input_layernorm.weight"))
        q = F.linear(h, w(p + "self_attn.q_proj.weight")).unflatten(-1, (cfg.num_heads, D))
        k = F.linear(h, w(p + "self_attn.k_proj.weight")).unflatten(-1, (cfg.num_kv_heads, D))
        v = F.linear(h, w(p + "self_attn.v_proj.weight")).unflatten(-1, (cfg.num_kv_heads, D))
        q, k = rms(q, w(p + "self_attn.q_norm.weight")), rms(k, w(p + "self_attn.k_norm.weight"))
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        rep = cfg.num_heads // cfg.num_kv_heads
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2).repeat_interleave(rep, 1),
            v.transpose(1, 2).repeat_interleave(rep, 1),
            is_causal=True,
            scale=D**-0.5,
        )
        x = x + F.linear(att.transpose(1, 2).flatten(-2), w(p + "self_attn.o_proj.weight"))
        h = rms(x, w(p + "post_attention_layernorm.weight"))
        gate = F.linear(h, w(p + "mlp.gate_proj.weight"))
        up = F.linear(h, w(p + "mlp.up_proj.weight"))
        x = x + F.linear(F.silu(gate) * up, w(p + "mlp.down_proj.weight"))
    sep_hidden = rms(x, w(f"{prefix}norm.weight"))
    torch.testing.assert_close(fused_hidden, sep_hidden, rtol=1e-5, atol=1e-5)
    # and the heads on top: stop and codebook logits of the last position
    sep_local = m.local_step(sep_hidden[:, -1], 0, m.new_local_cache(2))
    fused_local = m.local_step(fused_hidden[:, -1], 0, m.new_local_cache(2))
    torch.testing.assert_close(m.stop_logits(fused_local), m.stop_logits(sep_local))
    torch.testing.assert_close(m.audio_logits(fused_local, 0), m.audio_logits(sep_local, 0))


def test_opcount_sees_fewer_kernels_per_frame_when_fused():
    """The CPU proxy of the bench (moss/opcount.py): the fused paths run fewer kernel-like ops
    per frame and per local loop (counts, not timings)."""
    from lab.opcount import build, frame_counts

    model, ids = build(CFG, 2, 8, 8)
    params = SamplingParams()
    unfused = frame_counts(model, ids, params, fused=False, compiled=False)
    fused = frame_counts(model, ids, params, fused=True, compiled=False)
    assert model.fused_local and model.fused_backbone  # restored
    for part in ("frame", "local_loop"):
        assert 0 < fused[part]["kernels"] < unfused[part]["kernels"]
    # at least: one K+V write per local position instead of two. (Eager, the backbone saves
    # nothing: its K/V stack costs what the second write did; its gains need torch.compile.)
    assert fused["local_loop"]["kernels"] <= unfused["local_loop"]["kernels"] - CFG.n_vq


@pytest.mark.parametrize("fused", [False, True])
def test_packed_prefill_gives_each_length_group_what_its_own_prefill_gives(fused):
    """A burst of prompts of several lengths prefilled end to end in one pass (the continuous
    decoder's joins): each group's last hidden and K/V equal ``prefill`` of that group alone,
    unpadded (fp32 on the CPU: bit for bit). It fails if a prompt attended to its neighbour's
    rows, or if RoPE positions ran on across prompts."""
    m = _model(CFG)
    m.set_fused(fused)
    groups = [_prompt(CFG, 2, length=5, seed=1), _prompt(CFG, 1, length=9, seed=2),
              _prompt(CFG, 3, length=3, seed=3)]  # fmt: skip
    got_kv = {}

    def write(layer, g, k, v):
        got_kv[layer, g] = (k.clone(), v.clone())

    packed = m.prefill_packed(groups, write)
    for g, ids in enumerate(groups):
        n, T = ids.shape[:2]
        cache = m.new_backbone_cache(n, T)
        alone = m.prefill(ids, torch.ones(n, T, dtype=torch.bool), cache)
        assert torch.equal(packed[g], alone[:, -1])
        for layer in range(CFG.num_layers):
            k, v = got_kv[layer, g]
            assert torch.equal(k, cache.k[layer]) and torch.equal(v, cache.v[layer])
