"""Streaming speech for moss-fast: frames decode to audio in chunks while the engine runs.

Requests of one batch (different texts, voices, seeds and frame budgets) are left-padded into
one engine call (``MossLocalEngine.stream``); every ``STEP_FRAMES`` frames the new codes come
to the host. A request's first ``FIRST_CHUNK_FRAMES`` frames, then every ``CHUNK_FRAMES`` more
(and whatever is left when it stops), go through the codec in one batched decode of all the
requests that are ready. Each window starts ``OVERLAP_FRAMES`` before the frames it emits, and
the audio of that left context is dropped: the codec's decoder is causal (MOSS-Audio-Tokenizer-v2:
causal transformer stages), so the context stands in for the history it would have had. For a
codec whose decoder looks at most ``OVERLAP_FRAMES`` back, the chunks join to exactly the
one-shot decode; for one with a longer memory they are an approximation near each seam.

Batch independence: a request's codes depend only on its own prompt, seed and budget
(counter-based per-take sampling; rows past their own budget are stopped without touching the
others), so alone or in a batch it gets the same frames. Batches are padded to a power of two
with rows that stop at their first sync, so the engine reuses a few decode states (and CUDA
graphs) instead of building one per batch size."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from bestofn.moss.prompt import left_pad
from bestofn.spec import GroupSpec

STEP_FRAMES = 4  # engine hands out codes this often (one host sync each)
FIRST_CHUNK_FRAMES = 4  # 0.32 s of audio at 12.5 Hz: the first chunk of each request
CHUNK_FRAMES = 16  # then 1.28 s per chunk
OVERLAP_FRAMES = 8  # left context decoded again before each chunk (its audio dropped)


def _bucket(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def decode_window(codec, windows: list[torch.Tensor], skip: list[int]) -> list[np.ndarray]:
    """One batched decode of several code windows [T_i, n_vq]; drop each one's first
    ``skip[i]`` frames of audio (the overlap). Audio per frame = decoded samples / T_i."""
    audios = codec.decode(windows)
    out = []
    for audio, w, k in zip(audios, windows, skip, strict=True):
        per_frame = audio.shape[0] // max(1, int(w.shape[0]))
        out.append(np.asarray(audio[k * per_frame :], dtype=np.float32))
    return out


def stream_batch(
    gen,
    specs: list[GroupSpec],
    first_chunk: int = FIRST_CHUNK_FRAMES,
    chunk: int = CHUNK_FRAMES,
    overlap: int = OVERLAP_FRAMES,
    step: int = STEP_FRAMES,
) -> Iterator[tuple[int, np.ndarray, bool]]:
    """``bestofn.speech.stream_batch`` for a ``MossFastGenerator``: (index, audio, last)."""
    n = len(specs)
    prompts = [gen.prompt(spec) for spec in specs]
    seeds = [spec.seeds()[0] for spec in specs]
    budgets = [gen.budget.frames(spec.text) for spec in specs]
    pad = _bucket(n) - n  # filler rows: the last prompt, stopped at the first sync
    ids, mask = left_pad(prompts + [prompts[-1]] * pad, gen.config)
    codec = gen._codec()
    mono = bool(gen.options.get("mono"))
    channels = getattr(codec, "channels", None)
    # a chunk without new frames (a take that stopped at frame 0, or right after a chunk) has
    # the layout of the audio, as the codec's decode of no codes (generate()) has
    empty = np.zeros((0,) if mono or channels is None else (0, int(channels)), np.float32)
    codes = torch.zeros(n, max(budgets), gen.config.n_vq, dtype=torch.long)
    total, emitted, closed = [0] * n, [0] * n, [False] * n
    steps = gen.engine.stream(
        ids, mask, seeds + [0] * pad, max(budgets), gen.params, every=step,
        row_frames=budgets + [1] * pad,
    )  # fmt: skip
    for st in steps:
        ready, windows, skip, done = [], [], [], []
        for b in range(n):
            if closed[b]:
                continue
            have = min(int(st.n_frames[b]), budgets[b])
            if have > total[b]:
                codes[b, total[b] : have] = st.codes[b, total[b] - st.start : have - st.start]
                total[b] = have
            finished = st.last or bool(st.finished[b]) or have >= budgets[b]
            need = first_chunk if emitted[b] == 0 else chunk
            if not finished and total[b] - emitted[b] < need:
                continue
            ready.append(b)
            done.append(finished)
            w0 = max(0, emitted[b] - overlap)
            windows.append(codes[b, w0 : total[b]])
            skip.append(emitted[b] - w0)
        if not ready:
            continue
        todo = [i for i, b in enumerate(ready) if total[b] > emitted[b]]
        audios: list = [empty] * len(ready)
        if todo:
            decoded = decode_window(codec, [windows[i] for i in todo], [skip[i] for i in todo])
            for i, audio in zip(todo, decoded, strict=True):
                audios[i] = audio.mean(axis=1) if mono and audio.ndim == 2 else audio
        for b, audio, finished in zip(ready, audios, done, strict=True):
            emitted[b] = total[b]
            closed[b] = finished
            yield b, audio, finished
