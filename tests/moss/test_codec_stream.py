"""The speech service's exact streaming decode of MOSS-Audio-Tokenizer-v2
(bestofn.moss.codec.stream) on the tiny random checkpoint: chunks of each request, in any slot,
padded as the CUDA graphs pad, decoded in pieces, on the eager and the compiled (Triton,
interpreted here) pieces, join to the one-shot decode; through the serve stream, the workflow's
take."""

from __future__ import annotations

import codec_v2
import numpy as np
import pytest
import torch

from bestofn.moss.codec.tokenizer import MossAudioTokenizer


def _next_chunks(clips: dict, done: dict, step: int) -> dict:
    """Up to ``step`` more frames of each slot's clip ({slot: clip}), past ``done`` (updated)."""
    new = {}
    for slot, clip in clips.items():
        end = min(len(clip), done[slot] + step)
        if end > done[slot]:
            new[slot], done[slot] = clip[done[slot] : end], end
    return new


def test_stream_decoder_joins_to_the_one_shot_decode(codec):
    # Two requests in interleaved slots, chunks of serve's sizes and odd ones, one slot
    # reused after a reset: every chunk continues its own request's past exactly.
    a, b = codec_v2.clips([45, 30], seed=11)
    one = codec.decode([a, b])
    sd = codec.stream_decoder(3)
    assert codec.stream_decoder(2) is sd  # kept, caches reused
    parts, done = {2: [], 0: []}, {2: 0, 0: 0}
    for step in (4, 16, 7, 16, 16):
        for slot, audio in sd.decode(_next_chunks({2: a, 0: b}, done, step)).items():
            parts[slot].append(audio)
    for slot, ref in ((2, one[0]), (0, one[1])):
        got = np.concatenate(parts[slot])
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    sd.reset(2)  # a new request in a used slot: no trace of the old one
    again = sd.decode({2: b[:9]})[2]
    np.testing.assert_allclose(again, one[1][: 9 * 3840], rtol=0, atol=1e-5 * np.abs(again).max())


def test_padded_stream_decode_is_the_eager_one(codec):
    # The CUDA-graph path's padding (3 requests -> a bucket of 4 rows; 7 and 5 new frames -> 8)
    # on CPU: the scratch row and the padded frames leave every request's audio and its cache
    # as the unpadded call leaves them, chunk after chunk.
    from bestofn.moss.codec.stream import StreamDecoder

    clips = codec_v2.clips([30, 23, 12], seed=5)
    eager, padded = StreamDecoder(codec, 5, "eager"), StreamDecoder(codec, 5, "padded")
    done = dict.fromkeys((4, 0, 2), 0)
    for step in (4, 7, 5, 16):
        new = _next_chunks(dict(zip((4, 0, 2), clips, strict=True)), done, step)
        a, b = eager.decode(new), padded.decode(new)
        assert a.keys() == b.keys() == new.keys()
        for slot in new:
            assert a[slot].shape == b[slot].shape == (len(new[slot]) * 3840, 2)
            np.testing.assert_allclose(b[slot], a[slot], rtol=0, atol=1e-5 * np.abs(a[slot]).max())
    # rows, frames: powers of two (the last call: two requests left, 7 and 16 frames)
    assert sorted(padded._buckets) == [(2, 16), (4, 4), (4, 8)]
    with pytest.raises(ValueError, match="needs a CUDA codec"):
        StreamDecoder(codec, 2, "graphs")


def test_stream_decode_in_pieces_joins_and_keeps_its_audio(codec):
    # More new frames than one decoder call takes (piece_frames 4: a request's 9 or 16 new
    # frames run as pieces, its ring holding 4 frames' steps past each window) still join to the
    # one-shot decode; audio handed out stays as it was after later calls reuse the buffers.
    from bestofn.moss.codec.stream import StreamDecoder

    a, b = codec_v2.clips([41, 25], seed=8)
    one = codec.decode([a, b])
    for mode in ("eager", "padded"):
        sd = StreamDecoder(codec, 3, mode, piece_frames=4)
        parts, done, handed = {1: [], 2: []}, {1: 0, 2: 0}, []
        for step in (3, 9, 16, 1, 16):
            for slot, audio in sd.decode(_next_chunks({1: a, 2: b}, done, step)).items():
                parts[slot].append(audio)
                handed.append((audio, audio.copy()))
        assert all(np.array_equal(audio, copy) for audio, copy in handed), mode
        for slot, ref in ((1, one[0]), (2, one[1])):
            got = np.concatenate(parts[slot])
            assert got.shape == ref.shape, mode
            np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    assert max(frames for _, frames in sd._buckets) == 4  # padded: no bucket past a piece
    with pytest.raises(ValueError, match="piece_frames"):
        StreamDecoder(codec, 2, "eager", piece_frames=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_ring_kernel_computes_what_the_eager_stream_piece_does(
    interpreted_kernels, dtype
):
    """The streaming decode's q/k/v piece as one kernel, through Triton's CPU interpreter: the
    same RoPE'd q as the eager piece, the same k and v written into the same ring entries, the
    other entries untouched; also a stage without RoPE and a head width whose half is not a
    power of two, and more rows than a program owns."""
    from bestofn.moss.codec.stream import heads_to_ring

    kernels = interpreted_kernels[0]
    g = torch.Generator().manual_seed(19)
    for B, N, H, dh, rope in ((3, 5, 2, 8, True), (2, 7, 3, 12, True),
                              (5, kernels.BLOCK_T // 2 + 3, 1, 4, False)):  # fmt: skip
        qkv = torch.randn(B, N, 3 * H * dh, generator=g).to(dtype)
        ang = torch.rand(B, N, dh // 2, generator=g) * 6
        cos, sin = (ang.cos(), ang.sin()) if rope else (None, None)
        entries = 2 * B * N + 3
        dest = torch.randperm(entries, generator=g)[: B * N]  # each new step its own entry
        rings = [torch.randn(entries, H, dh, generator=g).to(dtype) for _ in range(2)]
        want_rings = [r.clone() for r in rings]
        want = heads_to_ring(qkv, cos, sin, dest, *want_rings, H)
        got = kernels.ring_heads(qkv, cos, sin, dest, *rings, H)
        assert got.shape == want.shape == (B, H, N, dh) and got.dtype == dtype
        tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=8e-3, atol=8e-3)
        # float32 throughout, as eager; the kernel may fuse a multiply-add (one rounding)
        torch.testing.assert_close(got, want, **tol)
        torch.testing.assert_close(rings[0], want_rings[0], **tol)
        assert torch.equal(rings[1], want_rings[1])  # v is a plain copy, written in place
        kept = torch.ones(entries, dtype=torch.bool)
        kept[dest] = False
        assert torch.equal(rings[0][kept], want_rings[0][kept])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_ring_attention_computes_what_the_eager_stream_attention_does(
    interpreted_kernels, dtype
):
    """The streaming decode's attention as one kernel, through Triton's CPU interpreter, against
    the eager piece (each row's ring gathered, SDPA under the window mask): rows at the start of
    their stream (steps before 0 hold nothing) and far into it (the ring wrapped), windows
    shorter and longer than a program's queries, rows in any slot, heads narrower than 16."""
    from bestofn.moss.codec.stream import ring_window_attention

    kernels = interpreted_kernels[0]
    g = torch.Generator().manual_seed(23)
    fp32 = dtype == torch.float32
    for B, H, N, dh, window, pos in ((3, 2, 5, 16, 7, (0, 3, 40)),
                                     (2, 1, kernels.ATTN_BLOCK_M + 9, 8, 20, (1000, 2)),
                                     (1, 2, 3, 12, kernels.ATTN_BLOCK_N + 5, (77,))):  # fmt: skip
        slots_n, R = B + 2, window - 1 + N
        rings = [torch.randn(slots_n, R, H, dh, generator=g).to(dtype) for _ in range(2)]
        q = torch.randn(B, H, N, dh, generator=g).to(dtype)
        slots = torch.randperm(slots_n, generator=g)[:B]
        pos = torch.tensor(pos)
        want = ring_window_attention(q, *rings, slots, pos, window)
        got = kernels.ring_attention(q, *rings, slots, pos, window)
        assert got.shape == want.shape == (B, N, H * dh) and got.dtype == dtype
        tol = dict(rtol=1e-5, atol=1e-5) if fp32 else dict(rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(got.double(), want.double(), **tol)


def test_stream_decode_on_the_compiled_pieces_is_the_eager_stream(interpreted_kernels, ckpt):
    """The streaming decode with every decoder stage on the compiled pieces (its ring kernel and
    the layers' fused norm, through Triton's interpreter; padded as the CUDA graphs pad) against
    the eager stream, chunk after chunk, and joined, against the one-shot decode."""
    from bestofn.moss.codec.layers import Transformer
    from bestofn.moss.codec.stream import StreamDecoder

    codec = MossAudioTokenizer(ckpt, compute_dtype="fp32", n_vq=12)
    compiled = MossAudioTokenizer(ckpt, compute_dtype="fp32", n_vq=12)
    for s in compiled.decoder:
        if isinstance(s, Transformer):
            s.kernels = "compiled"
    clips = dict(zip((2, 0), codec_v2.clips([26, 19], seed=29), strict=True))
    eager, fused = StreamDecoder(codec, 3, "eager"), StreamDecoder(compiled, 3, "padded")
    done, parts = dict.fromkeys(clips, 0), {slot: [] for slot in clips}
    for step in (4, 9, 16):
        new = _next_chunks(clips, done, step)
        a, b = eager.decode(new), fused.decode(new)
        for slot in new:
            np.testing.assert_allclose(b[slot], a[slot], rtol=0, atol=1e-5 * np.abs(a[slot]).max())
            parts[slot].append(b[slot])
    one = codec.decode(list(clips.values()))
    for slot, ref in zip(clips, one, strict=True):
        got = np.concatenate(parts[slot])
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_serve_stream_with_the_v2_codec_is_the_workflow_take(ckpt):
    import torch

    from bestofn.core import speech
    from bestofn.fakes.moss import always_continue_, build
    from bestofn.util.spec import GroupSpec

    gen = build("cpu", size="tiny", min_frames=6, max_frames=24, codec_dir=str(ckpt),
                codec_compute_dtype="fp32")  # fmt: skip
    with torch.no_grad():
        always_continue_(gen.model.local_ln_f.bias, gen.model.stop_head)
    specs = [
        GroupSpec("calm", "api", "one two three four", 1, 7),
        GroupSpec("calm", "api", "Hi.", 1, 8),
    ]
    parts = [[], []]
    for i, audio, _last in speech.stream_batch(gen, specs):
        parts[i].append(audio)
    assert len(parts[0]) > 2  # 4 frames, then 16 at a time
    for i, s in enumerate(specs):
        take = gen.generate(s)[0].audio
        got = np.concatenate(parts[i])
        assert got.shape == take.shape == (gen.budget.frames(s.text) * 3840, 2)
        np.testing.assert_allclose(got, take, rtol=0, atol=1e-5 * np.abs(take).max())


def test_stream_decode_dial_reaches_the_codec_and_graphs_need_cuda(ckpt):
    from bestofn.core import speech
    from bestofn.fakes.moss import build
    from bestofn.util.spec import GroupSpec

    kw = {"size": "tiny", "min_frames": 4, "max_frames": 8, "codec_dir": str(ckpt)}
    with pytest.raises(ValueError, match="runtime.stream_decode is graphs"):
        build("cpu", stream_decode="graphs", **kw)
    for dial, mode in (("auto", "eager"), ("eager", "eager")):  # auto on CPU: eager
        gen = build("cpu", stream_decode=dial, **kw)
        list(speech.stream_batch(gen, [GroupSpec("calm", "api", "Hi.", 1, 7)]))
        assert gen.codec._stream.mode == mode
