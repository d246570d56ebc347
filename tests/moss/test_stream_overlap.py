"""moss-fast's streaming with the engine in a thread of its own (runtime.stream_overlap on):
the same chunks as one after the other, requests joining, stopping at random frames and failing
alike; an error in the engine's thread reaches the caller; a caller that stops early stops the
thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from bestofn.core import speech
from bestofn.util.spec import GroupSpec


class CausalCodec:
    """Stand-in codec: frame t's audio depends on codes t and t-1; 4 samples per frame."""

    sample_rate, channels = 48000, 1

    def decode(self, codes):
        out = []
        for c in codes:
            x = c.double().sum(dim=1)
            prev = torch.cat([x.new_zeros(1), x[:-1]]) if len(x) else x
            y = torch.sin(0.37 * x - 0.11 * prev).float().repeat_interleave(4)
            out.append(y.numpy().reshape(-1, 1))
        return out


@pytest.fixture(scope="module")
def gen():
    from bestofn.fakes.moss import build, stop_head_tensors

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: threads only add overhead on a shared CPU
    g = build("cpu", size="tiny", min_frames=6, max_frames=48, min_tokens=1, budget_scale=1.0,
              budget_offset=0)  # fmt: skip
    g.codec = CausalCodec()
    with torch.no_grad():  # takes stop at random frames: rows free at any sync
        t = stop_head_tensors(g.config, 0.06, seed=3)
        g.model.local_ln_f.weight.mul_(t["local_transformer.ln_f.weight"])
        g.model.local_ln_f.bias.copy_(t["local_transformer.ln_f.bias"])
        g.model.stop_head.copy_(t["local_text_lm_head.weight"])
    yield g
    torch.set_num_threads(threads)


class CountedFeed:
    """Hands out ``later`` one request per call of ``take`` from its ``start``-th call on: what
    joins when depends on the engine's syncs alone, not on how far the caller has read."""

    def __init__(self, later, start: int, max_batch: int):
        self.later, self.start, self.calls, self.max_batch = list(later), start, 0, max_batch

    def take(self, n: int):
        self.calls += 1
        if self.calls < self.start or not self.later or n < 1:
            return []
        return [self.later.pop(0)]

    def feed(self) -> speech.Feed:
        return speech.Feed(self.take, lambda i: False, self.max_batch)


TEXTS = ["one two three four five", "Hi there.", "It is late now.", "See you at nine.",
         "A b c d e f", "Once more.", "The end of it."]  # fmt: skip


def render(g, overlap: str, fail: str | None = None):
    g.options["stream_overlap"] = overlap
    specs = [GroupSpec("calm", "api", t, 1, 100 + i) for i, t in enumerate(TEXTS)]
    real = g.prompt

    def prompt(s):
        if s.text == fail:
            raise OSError("reference voice unreadable")
        return real(s)

    g.prompt = prompt
    try:
        feed = CountedFeed(specs[2:], start=3, max_batch=3)
        per: dict[int, list] = {}
        for i, audio, last in speech.stream_batch(g, specs[:2], feed.feed()):
            per.setdefault(i, []).append((audio, last))
        return per
    finally:
        g.prompt = real
        g.options["stream_overlap"] = "auto"


def test_overlapped_streaming_gives_the_chunks_of_one_after_the_other(gen):
    serial = render(gen, "off", fail="Once more.")
    ahead = render(gen, "on", fail="Once more.")
    assert sorted(ahead) == sorted(serial) == list(range(len(TEXTS)))
    lengths = set()
    for i, chunks in serial.items():
        if TEXTS[i] == "Once more.":  # it failed alone, in both modes
            for mode in (serial, ahead):
                ((err, last),) = mode[i]
                assert isinstance(err, OSError) and last
            continue
        got = ahead[i]
        assert [a.shape for a, _ in got] == [a.shape for a, _ in chunks]
        assert [last for _, last in got] == [last for _, last in chunks]
        for (a, _), (b, _) in zip(got, chunks, strict=True):
            assert np.array_equal(a, b)
        lengths.add(sum(a.shape[0] for a, _ in chunks))
    assert len(lengths) > 2, "takes of several lengths: rows freed and rejoined mid-flight"


def _engine_threads() -> int:
    return sum(t.name == "moss-stream-engine" for t in threading.enumerate())


def test_an_error_in_the_engine_thread_reaches_the_caller(gen, monkeypatch):
    from bestofn.moss import continuous

    real = continuous.ContinuousDecoder.run

    def broken(self, *a, **k):
        it = real(self, *a, **k)
        yield next(it)
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setattr(continuous.ContinuousDecoder, "run", broken)
    gen.options["stream_overlap"] = "on"
    try:
        with pytest.raises(RuntimeError, match="illegal memory access"):
            list(speech.stream_batch(gen, [GroupSpec("calm", "api", TEXTS[0], 1, 1)]))
    finally:
        gen.options["stream_overlap"] = "auto"
    assert _engine_threads() == 0


def test_a_caller_that_stops_early_stops_the_engine_thread(gen):
    gen.options["stream_overlap"] = "on"
    try:
        chunks = speech.stream_batch(gen, [GroupSpec("calm", "api", TEXTS[0], 1, 1)])
        next(chunks)
        assert _engine_threads() == 1
        chunks.close()
    finally:
        gen.options["stream_overlap"] = "auto"
    assert _engine_threads() == 0


def test_overlap_modes_are_checked():
    from bestofn.moss.stream import overlapped

    assert overlapped("auto", "cpu") is False and overlapped("on", "cpu") is True
    assert overlapped("off", "cuda") is False and overlapped("auto", "cuda") is True
    with pytest.raises(ValueError, match="stream_overlap is 'yes'; known: auto, off, on"):
        overlapped("yes", "cpu")
