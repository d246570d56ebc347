"""MOSS-Audio-Tokenizer-v2 (the 48 kHz stereo codec of MOSS-TTS-Local) through our own code
(bestofn.moss.codec.tokenizer) on tiny random checkpoints in the published v2 layout
(bestofn.fakes.moss_codec): parity with vLLM-Omni's vendored v2 code when its copy is in
.ref/moss_audio_tokenizer_v2, the sliding window, batching, stereo, and bad checkpoints."""

from __future__ import annotations

import json

import codec_v2
import numpy as np
import pytest
import torch
from helpers import REPO
from safetensors.torch import load_file, save_file

from bestofn.fakes import moss_codec
from bestofn.moss.codec.config import AudioTokenizerConfig
from bestofn.moss.codec.layers import sliding_window_attention, window_pad
from bestofn.moss.codec.tokenizer import AudioTokenizerError, MossAudioTokenizer

REF = REPO / ".ref" / "moss_audio_tokenizer_v2"


# ---- the layout and the module list ---------------------------------------------------------


def test_real_size_is_the_published_v2_architecture():
    cfg = moss_codec.config("real")
    c = AudioTokenizerConfig.from_dict(cfg)
    assert (c.version, c.channels, c.interleave, c.sampling_rate, c.downsample_rate) == (
        "v2", 2, 2, 48000, 3840,
    )  # fmt: skip
    dec = [s for s in c.decoder if s.kind == "transformer"]
    enc = [s for s in c.encoder if s.kind == "transformer"]
    assert [s.context for s in dec] == [125, 250, 400, 400, 400, 400]
    assert [s.context for s in enc] == [400, 400, 400, 400, 250, 125]
    assert [s.patch for s in c.decoder if s.kind == "patch"] == [2, 2, 2, 2, 2, 240]
    assert [(s.d_model, s.layers) for s in dec] == [(1280, 32)] + [(768, 12)] * 5

    def params(stages):
        return sum(
            s.layers * (4 * s.d_model**2 + 2 * s.d_model * s.ff + 6 * s.d_model)
            + s.d_model * (s.input_dim + s.output_dim)
            for s in stages
        )

    assert 1.05e9 < params(dec) < 1.07e9  # "1.06 B of them in the decoder"
    assert 2.1e9 < params(dec) + params(enc) < 2.13e9
    assert (c.num_quantizers, c.codebook_size, c.codebook_dim) == (32, 1024, 8)


def test_tiny_checkpoint_has_the_published_v2_key_names(ckpt):
    keys = set(load_file(str(ckpt / "model.safetensors")))
    layer = "decoder.0.transformer.layers.0"
    for name in ("self_attn.in_proj", "self_attn.out_proj", "ffn.0", "ffn.2"):
        assert f"{layer}.{name}.weight" in keys
    assert {f"{layer}.layer_scale_1.scale", f"{layer}.norm1.bias"} <= keys
    # v2: both projections in every stage, even where the width equals d_model
    assert {"decoder.2.input_proj.weight", "decoder.2.output_proj.weight"} <= keys
    assert "quantizer.quantizers.0.in_proj.parametrizations.weight.original0" in keys
    assert not any("linear1" in k or "in_projs" in k for k in keys)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["number_channels"] == 2 and "stand" not in json.dumps(cfg).lower()


# ---- parity with the vendored published code --------------------------------------------------


def test_decode_and_encode_match_the_vendored_v2_code(ckpt):
    if not (REF / "audio_tokenizer_v2.py").is_file():
        pytest.skip(
            f"vLLM-Omni's v2 codec code not in {REF} (copy audio_tokenizer_v2.py and "
            "configuration_moss_audio_tokenizer_v2.py of zzehli/vllm-omni@10906e3 "
            "vllm_omni/model_executor/models/moss_tts/ there to run the parity test)"
        )
    pytest.importorskip("transformers")
    from bestofn.parity.codec import run_codec_parity

    ok, lines = run_codec_parity(ckpt, REF)
    assert ok, "\n".join(lines)
    assert any(line.startswith("decode fp32") and line.endswith("ok") for line in lines)
    assert any("codes identical" in line for line in lines)


def test_parity_command_recognises_the_v2_code(capsys, tmp_path):
    from bestofn.parity.codec import is_v2_codec_code

    assert not is_v2_codec_code(tmp_path)
    if not is_v2_codec_code(REF):
        pytest.skip(f"vLLM-Omni's v2 codec code not in {REF}")
    from bestofn.parity.local import parity_main

    assert parity_main(["--reference-code", str(REF)]) == 0
    out = capsys.readouterr().out
    assert "parity: PASS (MOSS-Audio-Tokenizer-v2" in out


# ---- the kernel: sliding window, batching, stereo ------------------------------------------


@pytest.mark.parametrize("T,window", [(7, 16), (16, 16), (17, 16), (45, 10), (40, 5), (9, 1)])
def test_sliding_window_attention_equals_the_dense_window_mask(T, window):
    g = torch.Generator().manual_seed(T * 100 + window)
    q, k, v = (torch.randn(2, 3, T, 8, generator=g) for _ in range(3))
    i = torch.arange(T)
    delta = i[:, None] - i[None, :]
    dense = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=(delta >= 0) & (delta < window)
    )
    dense = dense.transpose(1, 2).reshape(2, T, 3 * 8)  # heads merged, as the layers take it
    ours = sliding_window_attention(q, k, v, window, {})
    torch.testing.assert_close(ours, dense, rtol=1e-5, atol=1e-6)
    # q, k, v padded to whole blocks by the caller (heads_with_rope): the same
    pad = window_pad(T, window)
    padded = [torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v)]
    torch.testing.assert_close(
        sliding_window_attention(*padded, window, {}, T), dense, rtol=1e-5, atol=1e-6
    )


def test_the_fused_layer_pieces_compute_rope_and_the_residual_norm():
    from bestofn.moss.codec.layers import heads_with_rope, residual_norm

    g = torch.Generator().manual_seed(5)
    B, T, H, dh = 2, 6, 3, 8
    qkv = torch.randn(B, T, 3 * H * dh, generator=g)
    ang = torch.rand(T, dh // 2, generator=g, dtype=torch.float64) * 6
    q, k, v = heads_with_rope(qkv, ang.cos().float(), ang.sin().float(), H)
    padded = heads_with_rope(qkv, ang.cos().float(), ang.sin().float(), H, window=4)
    assert [t.shape[2] for t in padded] == [8, 8, 8]  # 6 steps fill two blocks of 4
    assert torch.equal(padded[0][:, :, :T], q) and not padded[2][:, :, T:].any()
    parts = qkv.double().view(B, T, 3, H, dh).permute(2, 0, 3, 1, 4)
    # RoPE on interleaved pairs is a complex rotation of (x[2j] + i x[2j+1]) by angle[t, j]
    rot = torch.polar(torch.ones_like(ang), ang)
    for got, want in ((q, parts[0]), (k, parts[1])):
        z = torch.view_as_complex(want.unflatten(-1, (-1, 2)).contiguous()) * rot
        torch.testing.assert_close(got.double(), torch.view_as_real(z).flatten(-2))
    assert torch.equal(v, parts[2].float()) and q.is_contiguous() and v.is_contiguous()
    x, u, scale = (torch.randn(B, T, 16, generator=g) for _ in range(3))
    w, b = torch.randn(16, generator=g), torch.randn(16, generator=g)
    new_x, normed = residual_norm(x, u, scale[0, 0], w, b, 1e-5)
    torch.testing.assert_close(new_x, x + scale[0, 0] * u)
    mean, var = new_x.mean(-1, keepdim=True), new_x.var(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(normed, (new_x - mean) / torch.sqrt(var + 1e-5) * w + b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_heads_kernel_computes_what_the_eager_piece_does(interpreted_kernels, dtype):
    """The hand-written kernel of the compiled path, through Triton's CPU interpreter: the same
    q, k, v as the eager piece (RoPE'd, padded with zeros to whole window blocks), also for a
    stage without RoPE and a head width whose half is not a power of two."""
    from bestofn.moss.codec.layers import heads_with_rope, window_pad

    kernels, heads, _, _ = interpreted_kernels
    BLOCK_T, heads_rope = kernels.BLOCK_T, kernels.heads_rope
    g = torch.Generator().manual_seed(11)
    for B, T, H, dh, window, rope in ((2, 45, 3, 8, 20, True), (1, 7, 2, 12, None, True),
                                      (2, 2 * BLOCK_T + 3, 1, 4, 40, False)):  # fmt: skip
        qkv = torch.randn(B, T, 3 * H * dh, generator=g).to(dtype)
        ang = torch.rand(T, dh // 2, generator=g) * 6
        cos, sin = (ang.cos(), ang.sin()) if rope else (None, None)
        want = heads_with_rope(qkv, cos, sin, H, window)
        got = heads_rope(qkv, cos, sin, H, T + window_pad(T, window))
        for w, o in zip(want, got, strict=True):
            assert o.shape == w.shape and o.dtype == dtype and o.is_contiguous()
            # float32 throughout, as eager; the kernel may fuse a multiply-add (one rounding)
            torch.testing.assert_close(o, w, rtol=1e-6 if dtype == torch.float32 else 8e-3,
                                       atol=1e-6 if dtype == torch.float32 else 8e-3)  # fmt: skip
        assert torch.equal(got[2], want[2])  # v is a plain copy
        assert not got[0][:, :, T:].any() and not got[2][:, :, T:].any()
        # what the layers call on the compiled path: the kernel, not padded (the attention
        # kernel needs no whole window blocks)
        unpadded = heads(qkv, cos, sin, H, window)
        assert all(torch.equal(o, w[:, :, :T]) for o, w in zip(unpadded, got, strict=True))
        assert all(o.shape[2] == T and o.is_contiguous() for o in unpadded)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_window_attention_kernel_computes_what_the_eager_attention_does(
    interpreted_kernels, dtype
):
    """The compiled path's sliding-window attention, through Triton's CPU interpreter, against
    the eager blocks of SDPA: windows shorter and longer than a program's queries and key tiles,
    no window, steps that fill part of the last program, heads narrower than a dot's 16 and not
    a power of two, inputs padded past T (the fallback heads' layout), and what the layers call."""
    kernels, _, attend, _ = interpreted_kernels
    BM, BN = kernels.ATTN_BLOCK_M, kernels.ATTN_BLOCK_N
    g = torch.Generator().manual_seed(17)
    fp32 = dtype == torch.float32
    cases = ((2, 3, 2 * BM + 5, 16, 20), (1, 2, BM + BN + 3, 12, BN + 7),  # window > a tile
             (1, 1, 3 * BM, 8, 2 * BM + 1), (2, 2, 9, 16, None), (1, 2, 40, 16, 1),
             (1, 1, BM - 3, 16, 500))  # fmt: skip
    for B, H, T, dh, window in cases:
        q, k, v = (torch.randn(B, H, T, dh, generator=g).to(dtype) for _ in range(3))
        i = torch.arange(T)
        delta = i[:, None] - i[None, :]
        seen = (delta >= 0) & (delta < (window or T))
        want = torch.nn.functional.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), attn_mask=seen
        )
        want = want.transpose(1, 2).reshape(B, T, H * dh)
        got = kernels.window_attention(q, k, v, window)
        assert got.shape == (B, T, H * dh) and got.dtype == dtype and got.is_contiguous()
        tol = dict(rtol=1e-5, atol=1e-5) if fp32 else dict(rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(got.double(), want, **tol)
        eager = sliding_window_attention(q, k, v, window, {})
        torch.testing.assert_close(got.double(), eager.double(), **tol)
        # padded past T (as the eager heads pad): the padding is never read as keys
        pad = 5
        padded = [torch.nn.functional.pad(t, (0, 0, 0, pad), value=7.0) for t in (q, k, v)]
        assert torch.equal(kernels.window_attention(*padded, window, T), got)
        # what the layers call on the compiled path: the kernel
        assert torch.equal(attend(q, k, v, window, {}, T), got)
    # heads wider than the kernel takes: the eager blocks stand in
    wide = torch.randn(1, 1, 6, kernels.ATTN_MAX_DH + 2, generator=g).to(dtype)
    assert not kernels.window_attention_fits(wide)
    torch.testing.assert_close(
        attend(wide, wide, wide, 4, {}, 6), sliding_window_attention(wide, wide, wide, 4, {})
    )


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_a_whole_decode_on_the_compiled_pieces_is_the_eager_decode(
    interpreted_kernels, ckpt, compute
):
    """The tiny v2 codec's whole decode with every decoder stage on the compiled pieces (the
    three kernels, through Triton's interpreter: how the layers wire them, heads unpadded into
    the window attention) against its eager decode, for clips whose stages span several windows
    and one clip shorter than a window."""
    from bestofn.moss.codec.layers import Transformer

    eager = MossAudioTokenizer(ckpt, compute_dtype=compute, n_vq=12)
    compiled = MossAudioTokenizer(ckpt, compute_dtype=compute, n_vq=12)
    stages = [s for s in compiled.decoder if isinstance(s, Transformer)]
    assert stages and all(s.kernels == "eager" for s in stages)  # CPU: auto resolves eager
    for s in stages:
        s.kernels = "compiled"
    clips = codec_v2.clips([33, 4, 21], seed=23)
    for want, got in zip(eager.decode(clips), compiled.decode(clips), strict=True):
        assert got.shape == want.shape
        peak = np.abs(want).max()
        # float32: the same sums in another order; bf16: each kernel rounds once where eager
        # rounds every op, so the two drift apart a little over the stages
        tol = 1e-5 if compute == "fp32" else 0.1
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * peak)
        if compute == "bf16":
            err = np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2))
            assert err < 0.05, f"relative RMS {err:.3f}"


def _bf16_ulp(t):
    """The spacing of bfloat16 numbers at each element of ``t`` (8 significant bits)."""
    return 2.0 ** (torch.frexp(t.float()).exponent - 8).float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_residual_norm_kernel_computes_what_the_eager_piece_does(
    interpreted_kernels, dtype
):
    """The compiled path's residual + LayerNorm kernel, through Triton's CPU interpreter, against
    the eager piece: with and without a layer scale, widths that are not powers of two, rows
    that fill several programs and part of the last one, and what ``layer_pieces`` calls."""
    from bestofn.moss.codec.layers import residual_norm

    kernels, _, _, add_norm = interpreted_kernels
    TILE, residual_layer_norm = kernels.TILE, kernels.residual_layer_norm
    ln = torch.nn.functional.layer_norm
    g = torch.Generator().manual_seed(13)
    fp32 = dtype == torch.float32
    for B, T, D, scale_kind in ((3, 13, 96, "vector"), (2, 20, 200, None),
                                (1, 9, 768, "vector"), (2, 11, 200, "power of two")):  # fmt: skip
        assert B * T > TILE // (1 << (D - 1).bit_length())  # more rows than a program's
        x, u = (torch.randn(B, T, D, generator=g).to(dtype) for _ in range(2))
        w, b = (torch.randn(D, generator=g).to(dtype) for _ in range(2))
        scale = None
        if scale_kind == "vector":
            scale = torch.randn(D, generator=g).to(dtype)
        elif scale_kind == "power of two":  # scale * u is exact: eager rounds once too
            sign = torch.randint(0, 2, (D,), generator=g) * 2 - 1
            scale = (sign * 2.0 ** torch.randint(-6, 2, (D,), generator=g)).to(dtype)
        want_x, want = residual_norm(x, u, scale, w, b, 1e-5)
        got_x, got = residual_layer_norm(x, u, scale, w, b, 1e-5)
        for o in (got_x, got):
            assert o.shape == x.shape and o.dtype == dtype and o.is_contiguous()
        if fp32:  # float32 throughout, as eager; the kernel may fuse a multiply-add
            torch.testing.assert_close(got_x, want_x, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        else:
            # the sum in float32, rounded once: bit for bit (a product of two bf16 is exact)
            us = u.float() * scale.float() if scale is not None else u.float()
            assert torch.equal(got_x, (x.float() + us).to(dtype))
            if scale_kind != "vector":  # eager's sum is the same one
                assert torch.equal(got_x, want_x)
            else:  # eager rounds scale * u first: up to half its ulp apart, plus the sum's
                bound = _bf16_ulp(us) / 2 + _bf16_ulp(want_x)
                assert ((got_x.float() - want_x.float()).abs() <= bound).all()
            # the norm of the (rounded) sum, as eager's layer_norm of it: a bf16 ulp apart
            same = ln(got_x, (D,), w, b, 1e-5)
            torch.testing.assert_close(got, same, rtol=2**-7, atol=1e-5)
            if scale_kind != "vector":
                torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-5)
        # what the layers call on the compiled path: the kernel
        assert all(map(torch.equal, add_norm(x, u, scale, w, b, 1e-5), (got_x, got)))
    # no steps: the eager piece; one step: the kernel
    x, u = (torch.randn(2, 0, 96, generator=g).to(dtype) for _ in range(2))
    assert add_norm(x, u, None, w[:96], b[:96], 1e-5)[1].shape == (2, 0, 96)
    x, u = x.new_ones(2, 1, 96), x.new_zeros(2, 1, 96)
    torch.testing.assert_close(
        add_norm(x, u, None, w[:96], b[:96], 1e-5)[1], b[:96].expand(2, 1, 96)
    )


def test_compiled_codec_kernels_resolve_per_device_and_are_refused_off_cuda(ckpt):
    from bestofn.moss.codec.layers import resolve_kernels

    assert resolve_kernels("auto", "cpu") == "eager"
    assert resolve_kernels("eager", "cpu") == "eager"
    with pytest.raises(ValueError, match="codec_kernels is 'fast'"):
        resolve_kernels("fast", "cpu")
    with pytest.raises(AudioTokenizerError, match="codec_kernels: compiled needs a CUDA GPU"):
        MossAudioTokenizer(ckpt, compute_dtype="bf16", kernels="compiled")
    assert MossAudioTokenizer(ckpt, compute_dtype="fp32").kernels == "eager"


def test_batched_decode_is_stereo_trimmed_and_batch_independent(codec):
    lengths = [30, 7, 19, 1]
    clips = codec_v2.clips(lengths, seed=5)
    batched = codec.decode(clips)
    for clip, n, audio in zip(clips, lengths, batched, strict=True):
        assert audio.shape == (n * 3840, 2) and audio.dtype == np.float32
        alone = codec.decode([clip])[0]
        np.testing.assert_allclose(audio, alone, rtol=0, atol=1e-5 * np.abs(alone).max())
    assert not np.allclose(batched[0][:, 0], batched[0][:, 1])  # two channels, not one copied
    assert codec.decode([torch.zeros(0, 12, dtype=torch.long)])[0].shape == (0, 2)


def test_the_window_bounds_what_a_frame_hears(codec):
    # Frame t's audio depends on frames <= t only (causal), and through the stage windows on
    # a bounded past: a change at frame 0 reaches frame 1 but, 40 frames later, much less.
    a = codec_v2.clips([60], seed=7)[0]
    b = a.clone()
    b[0] = (b[0] + 1) % codec_v2.CODEBOOK
    x, y = codec.decode([a, b])
    hop = codec.hop
    assert np.abs(x[:hop] - y[:hop]).max() > 0
    np.testing.assert_array_equal(x[0:0], y[0:0])
    near = np.abs(x[hop : 2 * hop] - y[hop : 2 * hop]).max()
    far = np.abs(x[50 * hop :] - y[50 * hop :]).max()
    assert far < near


def test_encode_round_trip_shapes_and_mono_reference(codec):
    g = np.random.default_rng(0)
    stereo = (0.1 * g.standard_normal((5 * 3840 + 11, 2))).astype(np.float32)
    codes = codec.encode(stereo, 48000)
    assert codes.shape == (5, 12) and codes.dtype == torch.long
    assert int(codes.min()) >= 0 and int(codes.max()) < codec_v2.CODEBOOK
    mono = codec.encode(stereo[:, 0], 48000)  # a mono voice goes on both channels
    both = codec.encode(np.repeat(stereo[:, :1], 2, axis=1), 48000)
    assert torch.equal(mono, both)
    at_24k = codec.encode(stereo[::2], 24000)  # resampled to 48 kHz first
    assert at_24k.shape[1] == 12 and abs(at_24k.shape[0] - 5) <= 1


def test_bf16_decode_stays_close_to_fp32(ckpt, codec):
    bf16 = MossAudioTokenizer(ckpt, compute_dtype="bf16", n_vq=12)
    if bf16.dtype != torch.bfloat16:
        pytest.skip("bf16 ops do not run on this CPU (bestofn.util.dtypes fell back to float32)")
    clips = codec_v2.clips([25, 12], seed=9)
    for ref, x in zip(codec.decode(clips), bf16.decode(clips), strict=True):
        snr = 10 * np.log10((ref**2).sum() / ((ref - x) ** 2).sum())
        assert 25 < snr < 80


# ---- bad checkpoints ------------------------------------------------------------------------


def test_missing_tensor_and_bad_config_are_named(ckpt, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((ckpt / "config.json").read_text())
    tensors = load_file(str(ckpt / "model.safetensors"))
    del tensors["decoder.4.transformer.layers.0.ffn.0.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(AudioTokenizerError, match=r"decoder\.4\.transformer\.layers\.0\.ffn\.0"):
        MossAudioTokenizer(broken, compute_dtype="fp32")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["decoder_kwargs"][-1]["patch_size"] = 120
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(AudioTokenizerError, match=r"broken/config.json: the encoder|decoder"):
        MossAudioTokenizer(broken, compute_dtype="fp32")
    cfg["decoder_kwargs"][-1]["patch_size"] = 240
    cfg["decoder_kwargs"][0]["context_duration"] = 0.01
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(AudioTokenizerError, match=r"decoder_kwargs\[0\].*under one step"):
        MossAudioTokenizer(broken, compute_dtype="fp32")


# ---- the benchmark's CPU mode ---------------------------------------------------------------


@pytest.mark.slow
def test_v2_codec_bench_runs_every_row_on_a_cpu(tmp_path):
    from lab.bench.codec import main

    out = tmp_path / "codec.json"
    args = ["--version", "v2", "--size", "tiny", "--device", "cpu", "--batch", "2"]
    args += ["--seconds", "0.8", "--dtypes", "fp32,bf16", "--one-clip-n", "1", "--repeats", "1"]
    args += ["--kernels", "eager", "--decode-batches", "2,1", "--profile"]
    if (REF / "audio_tokenizer_v2.py").is_file():
        args += ["--reference-code", str(REF)]
    assert main([*args, "--work", str(tmp_path), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {(r["path"], r["dtype"], r["batch"]): r for r in result["rows"]}
    assert result["meta"]["frames_per_clip"] == 10 and result["meta"]["n_vq"] == 12
    assert result["meta"]["version"] == "v2"
    assert result["meta"]["random_weights"] is True  # the bench wrote its codec: random
    assert rows[("ours batched (eager)", "fp32", 2)]["s_per_clip"] > 0
    # the same clips in calls of 2 and of 1: the same audio (the calls pad nothing here)
    in_twos, in_ones = (
        rows[("ours batched (eager)", "bf16", 2)],
        rows[("ours batched (eager)", "bf16", 1)],
    )
    assert in_twos["snr_db"] > 20 and in_ones["snr_vs_eager_bf16_db"] > 90
    assert any("aten::" in line for line in in_ones["profile"])  # where the call's time went
    rows = {(path, dtype): r for (path, dtype, _), r in rows.items()}
    exact = rows[("ours serve stream (exact)", "fp32")]
    window = rows[("ours overlap-window chunks", "fp32")]
    assert exact["snr_db"] > 90 and window["max_abs_diff"] >= 0
    if (REF / "audio_tokenizer_v2.py").is_file():
        # the vendored code's one-shot batched decode is ours in fp32 (CPU: no autocast)
        assert rows[("published one-shot batched", "fp32")]["snr_db"] > 80
        assert rows[("published processor path", "fp32")]["s_per_clip"] > 0
