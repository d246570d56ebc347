"""Streaming speech for moss-fast: frames decode to audio in chunks while the engine runs.

Requests (different texts, voices, seeds and frame budgets) run in one continuous decode
(``bestofn.moss.continuous``): every ``STEP_FRAMES`` frames the new codes come to the host,
finished requests leave their row, and requests that arrived meanwhile (``feed``) join free
rows. A request's first ``FIRST_CHUNK_FRAMES`` frames, then its new frames at every tick of a
clock shared by all requests (every ``CHUNK_FRAMES // STEP_FRAMES`` syncs), and what is left
when it stops, go through the codec in one batched decode of all the requests that are due:
first chunks in a call of their own, handed out before the others' are decoded; later chunks
together, whenever each request joined.
A codec with ``stream_decoder`` (MOSS-Audio-Tokenizer v1 and v2, ours) gets only
the new frames: each request holds a slot of per-layer key/value caches, so the chunks join to
the one-shot decode exactly (``bestofn.moss.codec.stream``; float rounding aside). Any other
codec gets windows that start ``OVERLAP_FRAMES`` before the frames they emit, the audio of that
left context dropped: exact only for a decoder that looks at most ``OVERLAP_FRAMES`` back, an
approximation near each seam otherwise.

Batch independence: a request's codes depend only on its own prompt, seed and budget (its own
cache slots, frame counter and counter-based sampling; its prompt prefilled without padding), so
alone, in a batch, or joined mid-flight it gets the same frames."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from bestofn.util.spec import GroupSpec

STEP_FRAMES = 4  # engine hands out codes this often (one host sync each)
FIRST_CHUNK_FRAMES = 4  # 0.32 s of audio at 12.5 Hz: the first chunk of each request
CHUNK_FRAMES = 16  # then 1.28 s per chunk
OVERLAP_FRAMES = 8  # left context decoded again before each chunk (its audio dropped)


def decode_window(codec, windows: list[torch.Tensor], skip: list[int]) -> list[np.ndarray]:
    """One batched decode of several code windows [T_i, n_vq]; drop each one's first
    ``skip[i]`` frames of audio (the overlap). Audio per frame = decoded samples / T_i."""
    audios = codec.decode(windows)
    out = []
    for audio, w, k in zip(audios, windows, skip, strict=True):
        per_frame = audio.shape[0] // max(1, int(w.shape[0]))
        out.append(np.asarray(audio[k * per_frame :], dtype=np.float32))
    return out


def _running_chunks(codes, emitted, block) -> list[tuple[int, bool]]:
    """(index, False) of the running requests past their first chunk with new frames: what is
    due at a tick of the chunk clock."""
    return [(u.key, False) for u in block
            if not u.finished and 0 < emitted[u.key] < codes[u.key].shape[0]]  # fmt: skip


def stream_batch(
    gen,
    specs: list[GroupSpec],
    feed=None,
    first_chunk: int = FIRST_CHUNK_FRAMES,
    chunk: int = CHUNK_FRAMES,
    overlap: int = OVERLAP_FRAMES,
    step: int = STEP_FRAMES,
    max_batch: int | None = None,
) -> Iterator[tuple[int, np.ndarray, bool]]:
    """``bestofn.core.speech.stream_batch`` for a ``MossFastGenerator``: (index, audio, last).

    ``feed`` (a ``bestofn.core.speech.Feed``, optional): requests that arrive while this call
    decodes join it at the next sync; their indices continue after ``specs`` in the order
    ``feed.take`` returns them. ``feed.cancelled(i)`` drops request i (its client left).
    A request that cannot start (its prompt fails, e.g. an unreadable reference voice) gets
    its exception as its one last chunk: ``(i, exception, True)``; the others go on."""
    from bestofn.moss.continuous import Join, decoder_for

    if max_batch is None:
        max_batch = feed.max_batch if feed is not None else max(1, len(specs))
    todo = list(specs)
    budgets: list[int] = []
    codes: list[torch.Tensor] = []  # per request: every frame so far [T, n_vq]
    emitted: list[int] = []

    failed: list[tuple[int, Exception]] = []  # requests that could not start, to report

    def join(spec: GroupSpec) -> Join | None:
        i = len(budgets)
        budgets.append(0)
        codes.append(torch.zeros(0, gen.config.n_vq, dtype=torch.long))
        emitted.append(0)
        try:  # a request that fails here (e.g. its reference voice) fails alone
            if spec.n_takes != 1:
                raise ValueError(f"speech renders one take per request, got {spec.n_takes}")
            budgets[i] = gen.budget.frames(spec.text)
            return Join(i, gen.prompt(spec), spec.seeds()[0], budgets[i])
        except Exception as e:
            failed.append((i, e))
            return None

    def pull(room: int) -> list[Join]:
        out = []
        while todo and len(out) < room:
            if (j := join(todo.pop(0))) is not None:
                out.append(j)
        while feed is not None and len(out) < room:
            more = feed.take(room - len(out))
            if not more:
                break
            out += [j for spec in more if (j := join(spec)) is not None]
        return out

    def report_failed():
        while failed:
            yield *failed.pop(0), True

    codec = gen._codec()
    mono = bool(gen.options.get("mono"))
    channels = getattr(codec, "channels", None)
    # a chunk without new frames (a take that stopped at frame 0, or right after a chunk) has
    # the layout of the audio, as the codec's decode of no codes (generate()) has
    empty = np.zeros((0,) if mono or channels is None else (0, int(channels)), np.float32)
    cancelled = feed.cancelled if feed is not None else None
    # exact streaming: one cache slot per request in flight (at most max_batch at a time)
    streamer = None
    if hasattr(codec, "stream_decoder"):
        mode = gen.options.get("stream_decode", "auto")
        streamer = codec.stream_decoder(max_batch, None if mode == "auto" else mode)
    free_slots, slot_of = list(range(max_batch)), {}

    def emit(ready: list[tuple[int, bool]]):
        """Decode the new frames of the ``ready`` requests ((index, last) each) in one codec
        call and hand out (index, audio, last) for each."""
        todo = [b for b, _ in ready if codes[b].shape[0] > emitted[b]]
        decoded: dict[int, np.ndarray] = {}
        if todo and streamer is not None:
            new = {}
            for b in todo:
                if b not in slot_of:
                    if not free_slots and cancelled is not None:
                        # requests cancelled mid-stream end without a last update
                        for k in [k for k in slot_of if cancelled(k)]:
                            free_slots.append(slot_of.pop(k))
                    slot_of[b] = free_slots.pop()
                    streamer.reset(slot_of[b])
                new[slot_of[b]] = codes[b][emitted[b] :]
            by_slot = streamer.decode(new)
            decoded = {b: by_slot[slot_of[b]] for b in todo}
        elif todo:
            starts = [max(0, emitted[b] - overlap) for b in todo]
            windows = [codes[b][w0:] for b, w0 in zip(todo, starts, strict=True)]
            skips = [emitted[b] - w0 for b, w0 in zip(todo, starts, strict=True)]
            decoded = dict(zip(todo, decode_window(codec, windows, skips), strict=True))
        for b, finished in ready:
            audio = decoded.get(b, empty)
            if mono and audio is not empty and audio.ndim == 2:
                audio = audio.mean(axis=1)
            emitted[b] = codes[b].shape[0]
            if finished:
                codes[b] = codes[b][:0]  # its frames are no longer needed
                if b in slot_of:
                    free_slots.append(slot_of.pop(b))
            yield b, audio, finished

    admit = gen.options.get("speech_admit_tokens")
    updates = decoder_for(gen.engine).run(pull, gen.params, cancelled, step, max_batch, admit)
    # Later chunks on one clock: every ``chunk // step`` syncs, every running request past its
    # first chunk hands out what it has, whenever it joined. Requests that joined at other syncs
    # (a burst admitted over several, or traffic arriving at any time) then share one codec
    # call rather than each sync making a small one of its own; none waits longer than
    # ``chunk`` frames for its next chunk, as before. A last chunk goes at once: its codec slot
    # must be free for the request that takes its row.
    every_n = max(1, chunk // max(1, step))
    try:
        for tick, block in enumerate(updates):
            yield from report_failed()
            firsts, lasts = [], []  # (index, last) due now
            for u in block:
                b = u.key
                if u.codes.shape[0]:
                    codes[b] = torch.cat([codes[b], u.codes])
                if emitted[b] == 0 and (u.finished or codes[b].shape[0] >= first_chunk):
                    firsts.append((b, u.finished))
                elif u.finished:
                    lasts.append((b, True))
            # first chunks in a call of their own, handed out before the others' longer chunks
            # are decoded: a joining request's time to first audio does not wait for the
            # batch's big call, and its 4 frames are not padded to the others' 16
            if firsts:
                yield from emit(firsts)
            if tick and tick % every_n == 0:
                lasts += _running_chunks(codes, emitted, block)
            if lasts:
                yield from emit(lasts)
        yield from report_failed()
    finally:
        updates.close()
