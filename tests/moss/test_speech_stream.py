"""The speech service's render path, in process: batch independence and streamed chunks for
piper (embedded default) and moss-fast (tiny random model, a causal stand-in codec), and the
response encoders."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from bestofn.core import speech
from bestofn.util.spec import GroupSpec


def spec(text: str, seed: int, emotion: str = "calm") -> GroupSpec:
    return GroupSpec(emotion, "api", text, 1, seed)


def render(gen, specs: list[GroupSpec]) -> tuple[list[np.ndarray], list[int]]:
    """Concatenated audio and chunk count per request; checks one last chunk each."""
    parts: list[list[np.ndarray]] = [[] for _ in specs]
    lasts = [0] * len(specs)
    for i, audio, last in speech.stream_batch(gen, specs):
        assert lasts[i] == 0, f"request {i} got a chunk after its last one"
        parts[i].append(audio)
        lasts[i] += last
    assert lasts == [1] * len(specs)
    return [np.concatenate(p) for p in parts], [len(p) for p in parts]


@pytest.fixture(scope="module")
def piper():
    from bestofn.backends.piper import PiperGenerator

    return PiperGenerator()


def test_piper_request_gets_the_same_audio_alone_or_in_a_batch(piper):
    two = spec("Good morning. See you at nine.", 5)
    one = spec("It is late.", 9)
    other = spec("It is late.", 10)  # same text, another seed: other noise
    batch, chunks = render(piper, [two, one, other])
    assert chunks[0] == 2, "two sentences stream as two chunks"
    alone_two, _ = render(piper, [two])
    alone_one, _ = render(piper, [one])
    assert np.array_equal(batch[0], alone_two[0])
    assert np.array_equal(batch[1], alone_one[0])
    assert not np.array_equal(batch[1], batch[2])
    # a one-sentence request is exactly the workflow's take with the same seed
    assert np.array_equal(batch[1], piper.generate(one)[0].audio)
    assert all(a.dtype == np.float32 and a.shape[0] > piper.sample_rate // 5 for a in batch)


def test_encoders_stream_wav_and_pcm_and_write_flac():
    rng = np.random.default_rng(0)
    chunks = [rng.uniform(-0.9, 0.9, n).astype(np.float32) for n in (2205, 4410, 1000)]
    whole = np.concatenate(chunks)
    for fmt in ("wav", "flac"):
        enc = speech.Encoder(fmt, 22050, 1)
        data = b"".join(enc.chunk(c) for c in chunks) + enc.finish()
        audio, sr = sf.read(io.BytesIO(data), dtype="float32")
        assert sr == 22050 and audio.shape == whole.shape
        assert np.abs(audio - whole).max() < 1e-3
        assert enc.seconds == pytest.approx(whole.shape[0] / 22050)
    enc = speech.Encoder("pcm", 22050, 1)
    data = b"".join(enc.chunk(c) for c in chunks) + enc.finish()
    assert enc.rate == 24000 and len(data) == 2 * enc.frames
    assert enc.frames == pytest.approx(whole.shape[0] * 24000 / 22050, abs=2)
    assert speech.bytes_to_seconds("pcm", len(data), 24000, 1) == pytest.approx(enc.seconds)
    stereo = speech.Encoder("pcm", 48000, 2)
    assert len(stereo.chunk(np.zeros((4800, 2), np.float32)) + stereo.finish()) == 2 * 2400
    with pytest.raises(ValueError, match="mp3"):
        speech.Encoder("mp3", 22050, 1)


class CausalCodec:
    """A causal stand-in codec: frame t's audio depends on codes t, t-1 and t-2 (a memory of
    two frames), 8 stereo samples per frame. Decoding a window with at least two frames of
    left context gives exactly the one-shot audio of the frames after that context."""

    sample_rate, channels, per_frame = 48000, 2, 8

    def decode(self, codes):
        import torch

        out = []
        for c in codes:
            if c.shape[0] == 0:  # no codes, no audio (as the real codec answers)
                out.append(np.zeros((0, self.channels), np.float32))
                continue
            x = c.double().sum(dim=1)
            prev = [torch.cat([x.new_zeros(k), x[: len(x) - k]]) for k in (1, 2)]
            y = torch.tanh(0.05 * x + 0.03 * prev[0] - 0.02 * prev[1]).float()
            y = y.repeat_interleave(self.per_frame)
            out.append(torch.stack([y, -y], dim=1).numpy())
        return out


@pytest.fixture(scope="module")
def moss():
    import torch

    from bestofn.fakes.moss import always_continue_, build

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: threads only add overhead on a shared CPU
    # the budget is the pacing hint itself (words x 6 frames): the test counts frames per text
    gen = build("cpu", size="tiny", min_frames=10, max_frames=40, min_tokens=1, budget_scale=1.0,
                budget_offset=0)  # fmt: skip
    gen.codec = CausalCodec()  # the engine's frames are real; only the codec is a stand-in
    always_continue_(gen.model.local_ln_f.bias, gen.model.stop_head)  # run to each budget
    yield gen
    torch.set_num_threads(threads)


def test_moss_fast_streams_frame_chunks_batch_independently(moss):
    from bestofn.moss import stream

    short = spec("Hi.", 3)  # budget: min_frames 10
    long = spec("one two three four five", 4)  # 5 words x 6 = 30 frames
    budgets = [moss.budget.frames(s.text) for s in (short, long)]
    assert budgets == [10, 30]
    batch, chunks = render(moss, [short, long, spec("Again.", 5)])
    per = CausalCodec.per_frame
    assert [a.shape for a in batch] == [(10 * per, 2), (30 * per, 2), (10 * per, 2)]
    first = stream.FIRST_CHUNK_FRAMES
    assert chunks[1] == 1 + -(-(30 - first) // stream.CHUNK_FRAMES)  # 4, then 16 at a time
    alone, _ = render(moss, [long])
    assert np.array_equal(alone[0], batch[1])
    # the chunks (their overlap dropped) join to exactly the one-shot decode of the same take
    assert np.array_equal(batch[1], moss.generate(long)[0].audio)
    moss.options["mono"] = True
    try:
        mono, _ = render(moss, [long])
    finally:
        moss.options["mono"] = False
    assert mono[0].shape == (30 * per,) and not mono[0].any()  # (y + -y) / 2


def test_chunked_decode_is_exact_for_a_codec_with_short_memory():
    import torch

    from bestofn.moss.stream import OVERLAP_FRAMES, decode_window

    codec = CausalCodec()
    codes = torch.randint(0, 50, (30, 3))
    whole = codec.decode([codes])[0]
    pieces, emitted = [], 0
    for end in (4, 20, 30):
        w0 = max(0, emitted - OVERLAP_FRAMES)
        pieces.append(decode_window(codec, [codes[w0:end]], [emitted - w0])[0])
        emitted = end
    assert np.array_equal(np.concatenate(pieces), whole)
    # without the left context the seams differ: the test above can fail
    cut = decode_window(codec, [codes[4:20]], [0])[0]
    assert not np.array_equal(cut, whole[4 * 8 : 20 * 8])


def test_moss_fast_take_that_stops_at_frame_zero_ends_with_one_empty_chunk(moss):
    """A row whose stop head fires at its first frame, alone and beside one that goes on: one
    chunk, empty, with the codec's channel layout (as ``generate``'s empty take has), marked
    last; the other row is unchanged."""
    import torch

    head = moss.model.stop_head
    keep = head.detach().clone()
    go_on = spec("one two three four five", 4)
    with_go_on, _ = render(moss, [go_on])
    with torch.no_grad():
        head.copy_(keep.flip(0))  # [continue, stop] swapped: every row stops at once
    try:
        chunks = list(speech.stream_batch(moss, [spec("Hi.", 3)]))
        empty_take = moss.generate(spec("Hi.", 3))[0].audio
    finally:
        with torch.no_grad():
            head.copy_(keep)
    assert len(chunks) == 1
    index, audio, last = chunks[0]
    assert index == 0 and last and audio.shape == (0, 2) == empty_take.shape
    assert render(moss, [go_on])[0][0].shape == with_go_on[0].shape == (30 * 8, 2)


def test_flac_encoder_skips_empty_chunks_of_any_layout():
    stereo = np.full((480, 2), 0.5, np.float32)
    enc = speech.Encoder("flac", 48000, 2)
    for chunk in (stereo, np.zeros(0, np.float32), stereo, np.zeros((0, 2), np.float32)):
        assert enc.chunk(chunk) == b""
    audio, sr = sf.read(io.BytesIO(enc.finish()), dtype="float32")
    assert sr == 48000 and audio.shape == (960, 2) and enc.seconds == pytest.approx(0.02)
