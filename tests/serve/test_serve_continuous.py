"""Continuous batching of speech requests on moss-fast (tiny random model, CPU): requests that
arrive while a decode runs join it; each keeps its own audio (same seed, same audio alone or
joined mid-flight); rows free and get reused; a cancelled request leaves its row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import Server, moss_speak, write_tsv

from bestofn.core import speech
from bestofn.util.spec import GroupSpec


def spec(text: str, seed: int) -> GroupSpec:
    return GroupSpec("calm", "api", text, 1, seed)


class CausalCodec:
    """Stand-in codec: frame t's audio depends on codes t and t-1; 4 samples per frame."""

    sample_rate, channels, per_frame = 48000, 1, 4

    def decode(self, codes):
        out = []
        for c in codes:
            x = c.double().sum(dim=1)
            prev = torch.cat([x.new_zeros(1), x[:-1]]) if len(x) else x
            # sin, not tanh: a code sum in the hundreds saturated tanh to 1.0, so takes whose
            # codes differed gave the same audio and the seed check below failed now and then
            y = torch.sin(0.37 * x - 0.11 * prev).float().repeat_interleave(self.per_frame)
            out.append(y.numpy().reshape(-1, 1))
        return out


HINT_IS_BUDGET = {"min_tokens": 1, "budget_scale": 1.0, "budget_offset": 0}


def _gen(stops: bool):
    from bestofn.fakes.moss import always_continue_, build, stop_head_tensors

    # the budget is the pacing hint itself (words x 6 frames): the tests count frames per text
    gen = build("cpu", size="tiny", min_frames=6, max_frames=48, **HINT_IS_BUDGET)
    gen.codec = CausalCodec()
    m = gen.model
    with torch.no_grad():
        if stops:  # takes stop at random frames (p = 0.06 per frame): rows free at any sync
            t = stop_head_tensors(gen.config, 0.06, seed=3)
            m.local_ln_f.weight.mul_(t["local_transformer.ln_f.weight"])
            m.local_ln_f.bias.copy_(t["local_transformer.ln_f.bias"])
            m.stop_head.copy_(t["local_text_lm_head.weight"])
        else:
            always_continue_(m.local_ln_f.bias, m.stop_head)  # every take runs its budget
    return gen


@pytest.fixture(scope="module")
def moss():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: threads only add overhead on a shared CPU
    yield _gen(stops=False)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def moss_stops():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield _gen(stops=True)
    torch.set_num_threads(threads)


class LateFeed:
    """Hands out ``later`` requests once the render has yielded ``after`` chunks (they arrive
    while it decodes), ``room`` permitting."""

    def __init__(self, later: list[GroupSpec], after: int, max_batch: int = 8):
        self.later, self.after, self.chunks = list(later), after, 0
        self.max_batch, self.taken, self.gone = max_batch, [], set()

    def take(self, n: int) -> list[GroupSpec]:
        if self.chunks < self.after:
            return []
        out, self.later = self.later[:n], self.later[n:]
        self.taken.append((self.chunks, len(out)))
        return out

    def cancelled(self, i: int) -> bool:
        return i in self.gone

    def feed(self) -> speech.Feed:
        return speech.Feed(self.take, self.cancelled, self.max_batch)


def render(gen, specs, late: LateFeed | None = None, n: int | None = None):
    n = n or len(specs) + (len(late.later) if late else 0)
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    lasts = [0] * n
    order = []
    for i, audio, last in speech.stream_batch(gen, specs, late.feed() if late else None):
        assert lasts[i] == 0, f"request {i} got a chunk after its last one"
        parts[i].append(audio)
        lasts[i] += last
        order.append(i)
        if late is not None:
            late.chunks += 1
    return [np.concatenate(p) if p else None for p in parts], lasts, order


def test_a_request_joined_mid_flight_gets_the_audio_it_gets_alone(moss):
    from bestofn.moss.continuous import decoder_for

    long = spec("one two three four five six seven", 11)  # 7 words x 6 = 42 frames
    late = [spec("Good morning to you.", 5), spec("It is late.", 9)]
    alone = [render(moss, [s])[0][0] for s in (long, *late)]
    dec = decoder_for(moss.engine)
    before = dec.joined_running
    feed = LateFeed(late, after=2)  # after the long request's first two chunks
    joined, lasts, order = render(moss, [long], feed)
    assert lasts == [1, 1, 1]
    assert feed.taken and feed.taken[0] == (2, 2), "the late requests joined at one sync"
    assert dec.joined_running - before == 2, "they joined a decode that was running"
    # the long request went on streaming after they joined, and they streamed before it ended
    last_long = len(order) - 1 - order[::-1].index(0)
    assert order.index(1) < last_long and order.index(2) < last_long
    for got, want in zip(joined, alone, strict=True):
        assert np.array_equal(got, want)
    per = CausalCodec.per_frame
    assert [a.shape[0] for a in joined] == [42 * per, 24 * per, 18 * per]
    # the joined request's audio is exactly the workflow's take with the same seed
    assert np.array_equal(joined[1][:, 0], moss.generate(late[0])[0].audio[:, 0])
    # other seeds give other audio (the comparison above could fail). One seed alone is not
    # enough: on the tiny random model two seeds draw codes that differ in a few percent of
    # places and now and then not at all, so the check is that seeds matter at all.
    others = [render(moss, [spec("Good morning to you.", s)])[0][0] for s in (6, 7, 8)]
    assert any(not np.array_equal(o, joined[1]) for o in others)


def test_first_chunks_are_decoded_and_handed_out_before_the_others_chunks(moss, monkeypatch):
    """A block where joiners' first chunks and a running request's next chunk are both due:
    the first chunks go through the codec in a call of their own and are handed out before the
    running request's chunk is decoded (a joiner's first audio does not wait for the batch's
    big call). First chunks are FIRST_CHUNK_FRAMES frames with no overlap; later ones carry
    OVERLAP_FRAMES of left context, so a call's windows tell which kind it decodes."""
    from bestofn.moss.continuous import decoder_for
    from bestofn.moss.stream import FIRST_CHUNK_FRAMES

    events = []
    decode, dec = moss.codec.decode, decoder_for(moss.engine)
    run = dec.run

    def recording(windows):
        kinds = {len(w) <= FIRST_CHUNK_FRAMES for w in windows}
        assert len(kinds) == 1, f"one call decoded first and later chunks: {windows}"
        events.append(("call", "first" if kinds.pop() else "later"))
        return decode(windows)

    def blocks(*a, **k):
        for block in run(*a, **k):
            events.append(("block",))
            yield block

    monkeypatch.setattr(moss.codec, "decode", recording)
    monkeypatch.setattr(dec, "run", blocks)
    long = spec("one two three four five six seven", 11)
    late = [spec("Good morning to you.", 5), spec("It is late.", 9)]
    # joining at each sync in turn: where the join lands on the block in which the long request
    # ends, its last chunk and the joiners' first chunks are due together
    for sync in range(2, 13):
        asked, later = [0], list(late)

        def take(n, sync=sync, asked=asked, later=later):
            asked[0] += 1
            out = later[:n] if asked[0] >= sync else []
            del later[: len(out)]
            return out

        feed = speech.Feed(take, lambda i: False, 8)
        for i, _audio, _last in speech.stream_batch(moss, [long], feed):
            events.append(("chunk", i))
    per_block, block = [], []
    for e in [*events, ("block",)][1:]:
        if e[0] == "block":
            per_block.append(block)
            block = []
        else:
            block.append(e)
    both = [b for b in per_block if ("call", "first") in b and ("call", "later") in b]
    assert both, "no block had both kinds due: the check below could not fail"
    for b in both:  # first chunks decoded, then handed out, then the later chunk decoded
        later = b.index(("call", "later"))
        assert b.index(("call", "first")) < later
        assert any(e[0] == "chunk" for e in b[:later]) and b[later + 1 :]


def test_requests_that_joined_at_other_syncs_share_their_later_chunks_codec_calls(
    moss, monkeypatch
):
    """Later chunks come on one clock (every CHUNK_FRAMES // STEP_FRAMES syncs) whenever a
    request joined: four requests joining at four syncs in a row have their later chunks
    decoded together, one codec call a tick (not one a sync, each request on its own phase),
    their first chunks still at once, and everyone's audio as alone."""
    from bestofn.moss.stream import CHUNK_FRAMES, FIRST_CHUNK_FRAMES

    texts = [
        "one two three four five six seven eight",
        "a b c d e f g h",
        "nine ten eleven twelve thirteen fourteen fifteen sixteen",
        "p q r s t u v w",
    ]
    specs = [spec(t, 70 + i) for i, t in enumerate(texts)]  # 8 words: 48 frames each
    alone = [render(moss, [s])[0][0] for s in specs]
    calls, pulls = [], [0]
    decode = moss.codec.decode

    def recording(windows):
        if min(len(w) for w in windows) > FIRST_CHUNK_FRAMES:  # later chunks (with overlap)
            calls.append(len(windows))
        return decode(windows)

    later = list(specs[1:])

    def take(n):  # one request a sync (a pull asks until it gets nothing): one joins a sync
        pulls[0] += 1
        return [later.pop(0)] if later and n and pulls[0] % 2 else []

    monkeypatch.setattr(moss.codec, "decode", recording)
    got: list[list[np.ndarray]] = [[] for _ in specs]
    feed = speech.Feed(take, lambda i: False, 8)
    for i, audio, _last in speech.stream_batch(moss, specs[:1], feed):
        got[i].append(audio)
    assert all(np.array_equal(np.concatenate(g), w) for g, w in zip(got, alone, strict=True))
    # 48 frames each, joined over 4 syncs: the clock's ticks decode all four together, and the
    # last chunks go as each request ends (each request on its own phase instead: six calls of
    # two requests each)
    assert max(calls) == 4 and len(calls) <= 48 // CHUNK_FRAMES + 1, calls


def test_a_burst_joins_over_several_syncs_under_an_admission_budget(moss, monkeypatch):
    """runtime.speech_admit_tokens: a burst of requests whose prompts add up to more than the
    budget is prefilled over several syncs (at least one request each), the first ones'
    audio out before the last ones join; every request keeps the audio it gets alone."""
    from bestofn.moss import continuous

    texts = ["one two three", "Good morning to you.", "It is late.", "See you at nine."]
    specs = [spec(t, 40 + i) for i, t in enumerate(texts)]
    alone = [render(moss, [s])[0][0] for s in specs]
    admitted = []
    admit = continuous.ContinuousDecoder._admit

    def counting(self, s, rows, joins, *a):
        admitted.append(len(joins))
        return admit(self, s, rows, joins, *a)

    monkeypatch.setattr(continuous.ContinuousDecoder, "_admit", counting)
    prompt_rows = int(moss.prompt(specs[0]).shape[0])
    monkeypatch.setitem(moss.options, "speech_admit_tokens", 2 * prompt_rows)
    joined, lasts, order = render(moss, specs)
    assert lasts == [1, 1, 1, 1]
    assert len(admitted) > 1 and max(admitted) <= 2 and sum(admitted) == 4, admitted
    assert order.index(0) < order.index(3), "the first request's audio came before the last joined"
    for got, want in zip(joined, alone, strict=True):
        assert np.array_equal(got, want)
    # a budget under one prompt still admits one request a sync
    monkeypatch.setitem(moss.options, "speech_admit_tokens", 1)
    admitted.clear()
    assert all(np.array_equal(g, w) for g, w in zip(render(moss, specs)[0], alone, strict=True))
    assert admitted == [1, 1, 1, 1]


def test_a_burst_of_many_prompt_lengths_is_prefilled_in_one_pass(moss, monkeypatch):
    """Requests whose prompts all differ in length join in one packed prefill (one pass, not one
    per length), or in several when they pass ``PACK_ROWS``; each keeps the audio it gets alone
    (its prompt attended alone and unpadded)."""
    from bestofn.moss import continuous
    from bestofn.moss.model import MossLocalModel

    texts = ["one two three", "Good morning to you.", "It is late.", "See you at nine, then."]
    specs = [spec(t, 60 + i) for i, t in enumerate(texts)]
    lengths = {int(moss.prompt(s).shape[0]) for s in specs}
    assert len(lengths) == len(specs), lengths  # the test needs every length different
    alone = [render(moss, [s])[0][0] for s in specs]
    passes = []
    packed = MossLocalModel.prefill_packed

    def counting(self, prompts, write):
        passes.append(len(prompts))
        return packed(self, prompts, write)

    monkeypatch.setattr(MossLocalModel, "prefill_packed", counting)
    joined = render(moss, specs)[0]
    assert passes == [4], passes
    assert all(np.array_equal(g, w) for g, w in zip(joined, alone, strict=True))
    # and as the workflow's takes with the same seeds (its prefill is not the packed one, so
    # this fails if the packed pass or its K/V writes are wrong, as "alone" alone would not)
    for got, s in zip(joined, specs, strict=True):
        assert np.array_equal(got[:, 0], moss.generate(s)[0].audio[:, 0])
    pack_rows = continuous.PACK_ROWS
    monkeypatch.setattr(continuous, "PACK_ROWS", max(lengths) + 1)  # about one prompt a pass
    passes.clear()
    joined = render(moss, specs)[0]
    assert len(passes) > 1 and sum(passes) == 4, passes
    assert all(np.array_equal(g, w) for g, w in zip(joined, alone, strict=True))
    unfused = _gen(stops=False)  # K and V in caches of their own (runtime fused: false)
    unfused.model.set_fused(False)
    monkeypatch.setattr(continuous, "PACK_ROWS", pack_rows)
    passes.clear()
    joined = render(unfused, specs)[0]
    assert passes == [4] and all(np.array_equal(g, w) for g, w in zip(joined, alone, strict=True))


def test_more_requests_than_rows_wait_for_free_rows_and_keep_their_audio(moss_stops):
    """Rows stop at random frames; 7 requests through at most 2 rows at once: later ones take
    the rows that free up (and the state grows 1 -> 2 rows mid-flight)."""
    from bestofn.moss.continuous import decoder_for

    texts = ["one two three four five", "Hi there.", "It is late now.", "See you at nine.",
             "A b c d e f", "Once more.", "The end of it."]  # fmt: skip
    specs = [spec(t, 100 + i) for i, t in enumerate(texts)]
    alone = [render(moss_stops, [s])[0][0] for s in specs]
    lengths = {a.shape[0] for a in alone}
    assert len(lengths) > 2, "takes of different lengths (rows free at different syncs)"
    feed = LateFeed(specs[1:], after=0, max_batch=2)
    joined, lasts, _ = render(moss_stops, specs[:1], feed)
    assert lasts == [1] * 7
    assert sum(k for _, k in feed.taken) == 6 and max(k for _, k in feed.taken) <= 1
    for got, want in zip(joined, alone, strict=True):
        assert np.array_equal(got, want)
    assert all(s.batch <= 2 for s in decoder_for(moss_stops.engine)._states.values())


def test_a_cancelled_request_leaves_its_row_and_the_others_are_unchanged(moss):
    a, b = spec("one two three four five six", 21), spec("one two three four five six", 22)
    alone_b = render(moss, [b])[0][0]
    feed = LateFeed([], after=0)
    feed.gone = set()
    parts: dict[int, list] = {0: [], 1: []}
    for i, audio, last in speech.stream_batch(moss, [a, b], feed.feed()):
        parts[i].append((audio, last))
        if i == 0 and len(parts[0]) == 1:
            feed.gone.add(0)  # client 0 left after its first chunk
    assert len(parts[0]) == 1 and not parts[0][0][1], "no more chunks for a cancelled request"
    assert parts[1][-1][1]
    assert np.array_equal(np.concatenate([p for p, _ in parts[1]]), alone_b)


def test_piper_ignores_the_feed(tmp_path):
    """piper renders the requests it was given; the feed is left for the caller's next batch."""
    from bestofn.backends.piper import PiperGenerator

    feed = LateFeed([spec("Later.", 1)], after=0)
    out = list(speech.stream_batch(PiperGenerator(), [spec("Now.", 2)], feed.feed()))
    assert {i for i, _, _ in out} == {0} and out[-1][2]
    assert feed.taken == [] and len(feed.later) == 1


@pytest.mark.slow
def test_through_the_server_a_late_request_joins_the_running_decode(tmp_path):
    """`bestofn serve` with moss-fast (tiny, every take runs its budget): a request sent while
    another streams joins its decode (the worker's /health counts it) and gets the audio it
    gets alone."""
    import threading

    import yaml

    from bestofn.fakes import moss

    options = moss.write(tmp_path / "weights", "tiny", seed=0, p_stop=1e-9)
    options.update(HINT_IS_BUDGET, min_frames=25)  # a take runs words x 6 frames, at least 25
    write_tsv(tmp_path / "emotions.tsv", ["emotion", "description"], [["calm", "A calm voice."]])
    write_tsv(tmp_path / "prompts.tsv", ["prompt_id", "text"], [["p1", "Hello."]])
    config = {
        "emotions": "emotions.tsv", "prompts": "prompts.tsv", "results": "results",
        "takes": 1, "device": "cpu",
        "models": {"generator": {"backend": "moss-fast", "options": options}},
        "runtime": {"idle_timeout_s": 120},
        "selection": {"filter": "true", "score": "0"},
    }  # fmt: skip
    (tmp_path / "speech.yaml").write_text(yaml.safe_dump(config))
    srv = Server(tmp_path, "--config", "speech.yaml")
    try:
        long_text = " ".join(["word"] * 16)  # 96 frames: 7.68 s of audio
        late_text = "Good morning to you."
        late_alone = moss_speak(srv, late_text, seed=5)
        before = srv.health()["worker"]["speech_batching"]
        import openai

        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0,
                               timeout=120)  # fmt: skip
        started, result = threading.Event(), {}

        def late():
            started.wait(60)
            result["late"] = moss_speak(srv, late_text, seed=5)

        t = threading.Thread(target=late)
        t.start()
        with client.audio.speech.with_streaming_response.create(
            model="bestofn", voice="default", input=long_text, response_format="pcm",
            extra_body={"seed": 1},
        ) as resp:  # fmt: skip
            parts = []
            for chunk in resp.iter_bytes():
                parts.append(chunk)
                started.set()  # the long request is streaming: send the late one now
        t.join(120)
        after = srv.health()["worker"]["speech_batching"]
        assert len(b"".join(parts)) == 2 * 24000 * 96 * 0.08  # its whole budget, 24 kHz pcm
        assert after["joined_running"] - before["joined_running"] == 1
        # the same audio as alone, to the last 16-bit step: its codec chunks may share a batched
        # decode with the long request's, and a batched matmul can round a float's last bit
        # differently (bestofn.moss.stream: exact "float rounding aside")
        late, alone = (
            np.frombuffer(b, "<i2").astype(np.int32) for b in (result["late"], late_alone)
        )
        assert late.shape == alone.shape and np.abs(late - alone).max() <= 1
    finally:
        srv.close()


def test_a_request_that_cannot_start_fails_alone(moss):
    """Its prompt fails (as an unreadable reference voice would): it gets its error as its one
    last chunk, at the start or when joining mid-flight; the others keep their audio."""
    good, bad = spec("one two three four five", 31), spec("Broken voice.", 32)
    alone = render(moss, [good])[0][0]
    real = moss.prompt

    def prompt(s):
        if s.text == bad.text:
            raise OSError("reference voice unreadable")
        return real(s)

    moss.prompt = prompt
    try:
        for specs, late in (([bad, good], []), ([good], [bad])):
            feed = LateFeed(late, after=1)
            got: dict[int, list] = {0: [], 1: []}
            for i, audio, last in speech.stream_batch(moss, specs, feed.feed()):
                got[i].append((audio, last))
                feed.chunks += 1
            assert late == [] or feed.taken, "the bad request was sent mid-flight"
            b = 0 if specs[0] is bad else 1
            ((err, last),) = got[b]
            assert isinstance(err, OSError) and last
            assert got[1 - b][-1][1]
            assert np.array_equal(np.concatenate([a for a, _ in got[1 - b]]), alone)
    finally:
        moss.prompt = real
