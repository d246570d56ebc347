"""The MOSS engine shell: what every decode loop of ours shares, whatever the architecture.

- **Decode states.** A state holds every tensor one step reads and writes, preallocated for one
  shape (batch, cache length, steps), so a step has no host sync and no data-dependent shape.
  A few states are kept between requests (``StateCache``: each holds a full KV cache and its
  CUDA graphs) and reused by any later request that fits.
- **CUDA graphs.** On CUDA a step is captured once per (sampling flags, KV bucket) and then
  replayed: one launch per step instead of ~1,000 kernels (``run_captured``).
- **The sync loop.** Prefill, the first step from the prefill's last hidden state, then one
  captured step per output row; the host reads the device only every ``sync_every`` steps, to
  see whether every row has stopped (``EngineShell._loop``).
- **Sampling.** Per-take counter-based uniforms (``bestofn.moss.sampling``) and the sampling
  scalars kept on the device (``StepState``), so a replayed graph reads this request's values.
- **Pairs.** ``generate_pair`` decodes two requests (two groups, or two chunks of one) in one
  call of a fixed shape whatever the partner (``PairRequest``, ``pair_bucket``), so a take's
  codes do not depend on whether, or beside whom, it ran (``EngineShell._pair_start`` says
  how).

The architectures are strategies on this shell: each says what its state holds and what one
step does. ``MossLocalEngine`` (bestofn.moss.engine): a frame is a backbone step plus the local
transformer's n_vq codebook steps. ``MossDelayEngine`` (bestofn.moss.delay_engine): a row is a
backbone step plus 1 + n_vq heads, with the delay pattern's counters. Continuous batching
(bestofn.moss.continuous) runs Local frames whose rows join a decode already running, on the same
states, graphs and sampling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from bestofn.moss.sampling import SamplingParams, sample_tokens, take_uniform


@dataclass
class GenerationOutput:
    codes: list[torch.Tensor]  # per row: int64 [n_frames, n_vq] on CPU (no stop frame, no pads)
    stopped: list[bool]  # row emitted its end before the frame budget ran out
    frames: int  # decode steps actually run


def round_up(n: int, to: int = 64) -> int:
    """Shapes are rounded up (cache lengths, steps, attention windows) so that a few states and
    a few captured graphs serve many requests."""
    return -(-n // to) * to


def pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for n <= 1): batch and bucket shapes, rounded up
    so that a few states and captured graphs serve many sizes."""
    return 1 << max(0, int(n) - 1).bit_length()


# ---- pairs: two requests in one decode, each computed as if alone ---------------------------

PAIR_PROMPT_BUCKET = 64  # prompt rows: two requests pair only within one bucket


def pair_bucket(prompt_len: int) -> int:
    """The cache slot where every prompt of a pair ends (each is placed to end there): its
    length rounded up to ``PAIR_PROMPT_BUCKET``. Two requests pair only with the same bucket."""
    return round_up(prompt_len, PAIR_PROMPT_BUCKET)


@dataclass(frozen=True)
class PairRequest:
    """One half of a paired decode: a prompt [T, 1 + n_vq] that every row of the half shares,
    a seed per row (at most the half's size; the rest of the half is dummy rows) and its
    budget (Local: max frames, an int; Delay: a ``DelayBudget``)."""

    prompt: torch.Tensor
    seeds: Sequence[int]
    budget: object


def _copy_row(cache, r0: int, r1: int, slots: slice) -> None:
    """Row ``r0``'s keys, values, key mask and position (``slots``) into rows (r0, r1)."""
    if r1 - r0 < 2:
        return
    src, dst = slice(r0, r0 + 1), slice(r0 + 1, r1)
    for t in (cache.k, cache.v) if cache.kv is None else (cache.kv,):
        t[:, dst, :, slots] = t[:, src, :, slots]
    cache.key_mask[dst, slots] = cache.key_mask[src, slots]
    cache.pos[dst] = cache.pos[src]


class CacheWindow:
    """Rows [r0, r1) of a ``BackboneCache`` with its slots shifted by ``offset``: what a
    model's ``prefill`` writes to slots [0, T) lands in slots [offset, offset + T) of those
    rows. Its write index is its own (the pair sets the shared one after every prefill)."""

    def __init__(self, cache, r0: int, r1: int, offset: int):
        rows = slice(r0, r1)
        self.kv = None if cache.kv is None else cache.kv[:, rows, :, offset:]
        self.k = cache.k[:, rows, :, offset:]
        self.v = cache.v[:, rows, :, offset:]
        self.key_mask = cache.key_mask[rows, offset:]
        self.pos = cache.pos[rows]
        self.write_idx = torch.zeros_like(cache.write_idx)
        self.max_len = cache.max_len - offset
        self.batch = r1 - r0


class StepState:
    """What every decode state holds beside its architecture's buffers: the sampling scalars
    (device tensors: a captured graph reads their values when it replays, so one graph serves
    every temperature) and the CUDA graphs captured on this state's buffers."""

    def __init__(self, device):
        f32 = dict(dtype=torch.float32, device=device)
        self.temperature = torch.ones((), **f32)
        self.top_p = torch.ones((), **f32)
        self.penalty = torch.ones((), **f32)
        self.text_temperature = torch.ones((), **f32)
        self.text_top_p = torch.ones((), **f32)
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.graph_pool = None

    def set_sampling(self, p: SamplingParams) -> None:
        self.temperature.fill_(p.temperature)
        self.top_p.fill_(p.top_p)
        self.penalty.fill_(p.repetition_penalty)
        self.text_temperature.fill_(p.text_temperature)
        self.text_top_p.fill_(p.text_top_p)


class StateCache(dict):
    """At most ``max_states`` decode states by shape key, most recently used last. Each holds a
    full KV cache (and its graphs), so the least recently used is dropped to make room."""

    def __init__(self, max_states: int):
        super().__init__()
        self.max_states = max_states

    def get_fitting(self, fits: Callable[[StepState], bool], key: tuple, make) -> StepState:
        """The smallest kept state that ``fits`` (its CUDA graphs too), else ``make()`` kept
        under ``key``."""
        found = [k for k, s in self.items() if fits(s)]
        if found:
            key = min(found)
        state = self.pop(key, None)
        if state is None:
            while len(self) >= self.max_states:
                self.pop(next(iter(self)))
            state = make()
        self[key] = state
        return state


def run_captured(s: StepState, key: tuple, step: Callable[[], None], use_graphs: bool) -> None:
    """One decode step on the buffers of ``s``: eager, or the CUDA graph captured for ``key``
    (everything the step's Python decides: sampling flags, KV bucket), captured the first time."""
    if not use_graphs:
        step()
        return
    graph = s.graphs.get(key)
    if graph is not None:
        graph.replay()
        return
    # Warm up on a side stream (a real step), then capture the step for the next one.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # Graphs of one state replay one after another, so they can share a memory pool.
    # thread_local: the worker's overlap threads (event records, FLAC writes) may make CUDA
    # calls while this thread captures; under "global" those calls abort the capture.
    with torch.cuda.graph(graph, pool=s.graph_pool, capture_error_mode="thread_local"):
        step()
    s.graph_pool = s.graph_pool or graph.pool()
    s.graphs[key] = graph
    # Capture does not execute; the warm-up step already produced this step's output. The next
    # replay runs the step after it from the state the warm-up left, which is exactly right.


class EngineShell:
    """The shell of a decode engine; an architecture subclasses it with its state (``new_state``)
    and its step. ``sampler``: the architecture's sampling function (same draws either way)."""

    sampler = staticmethod(sample_tokens)

    def __init__(
        self,
        model,
        use_cuda_graphs: bool | None = None,
        compile: bool | None = None,
        sync_every: int = 8,
        max_states: int = 2,
        compile_mode: str | None = None,
    ):
        self.model = model.eval()
        self.config = model.config
        self.device = model.embed_tokens.weight.device
        on_gpu = self.device.type == "cuda"
        self.use_cuda_graphs = on_gpu if use_cuda_graphs is None else use_cuda_graphs
        # torch.compile fuses the elementwise chains between the matmuls (fewer kernels per
        # step); CUDA graphs then remove the launch cost of what is left.
        self.compiled = on_gpu if compile is None else compile
        self._sample, self._uniform = self.sampler, take_uniform
        if self.compiled:
            model.compile_steps(compile_mode)  # runtime option compile_mode (None: torch's)
            self._sample = torch.compile(self.sampler, dynamic=False)
            self._uniform = torch.compile(take_uniform, dynamic=False)
        self.sync_every = sync_every
        self._states = StateCache(max_states)

    def new_state(self, batch: int, max_len: int, max_steps: int) -> StepState:
        raise NotImplementedError

    def _state_for(self, batch: int, prompt_len: int, max_steps: int) -> StepState:
        """A decode state big enough for this request: the smallest kept one, else a new one
        with its cache length and steps rounded up to 64."""
        need_len = prompt_len + max_steps + 1

        def fits(s):
            return s.batch == batch and s.max_len >= need_len and s.max_steps >= max_steps

        key = (batch, round_up(need_len), round_up(max_steps))
        return self._states.get_fitting(fits, key, lambda: self.new_state(*key))

    def _reset(self, s: StepState, p: SamplingParams, seeds) -> None:
        """What every request resets: the cache, the seeds, the sampling scalars."""
        s.cache.reset()
        seeds = torch.as_tensor(seeds, dtype=torch.long)
        if seeds.shape != (s.batch,):
            raise ValueError(f"need one seed per row ({s.batch}), got {tuple(seeds.shape)}")
        s.seeds.copy_(seeds)
        s.set_sampling(p)

    # ---- pairs ---------------------------------------------------------------------------

    def _pair_start(self, requests: Sequence[PairRequest], takes: int, max_steps: int, reset):
        """State, prefill and dummy rows of a paired decode; returns (state, prompt bucket,
        last prompt hidden [2 * takes, H]). ``reset(state, seeds)``: the architecture's reset.

        Why a row's computation depends only on its own request (and the model, the kernel
        path): every call has the same shape, 2 x ``takes`` rows and prompts ending at slot
        ``pair_bucket(T)``, whether a request runs alone (the other half dummy rows, finished
        from the start) or beside a partner; so every GEMM, attention and sampling call has the
        same shape, and each is computed row by row. Each request's prompt is prefilled on its
        own, unpadded, once (its rows share it; its K/V copied to them), placed to end at the
        bucket; its RoPE positions count from its own first row. The decode's attention
        window is the bucket plus the steps so far (``_loop``), the same whatever the partner;
        padded slots are masked (weight exactly 0). Frame budgets are per row (a row that runs
        on because its partner has a larger budget is cut at its own), and a finished row's
        codes never change, so the loop running longer for the partner changes nothing."""
        if not 1 <= len(requests) <= 2:
            raise ValueError(f"a pair is one or two requests, got {len(requests)}")
        T = pair_bucket(int(requests[0].prompt.shape[0]))
        for r in requests:
            n = len(r.seeds)
            if pair_bucket(int(r.prompt.shape[0])) != T:
                raise ValueError(
                    f"pair: prompts of {requests[0].prompt.shape[0]} and {r.prompt.shape[0]} "
                    f"rows lie in different buckets of {PAIR_PROMPT_BUCKET}"
                )
            if not 1 <= n <= takes:
                raise ValueError(f"pair: a request has {n} seeds, the half holds 1..{takes}")
        B = 2 * takes
        seeds = torch.zeros(B, dtype=torch.long)
        real = torch.zeros(B, dtype=torch.bool)
        for i, r in enumerate(requests):
            n = len(r.seeds)
            seeds[i * takes : i * takes + n] = torch.as_tensor(list(r.seeds), dtype=torch.long)
            real[i * takes : i * takes + n] = True
        s = self._state_for(B, T, max_steps)
        reset(s, seeds)
        dev = self.device
        h = None
        for i, r in enumerate(requests):
            n, t, r0 = len(r.seeds), int(r.prompt.shape[0]), i * takes
            # the half's rows share one prompt: prefill it once, into the half's first row
            last = self._prefill_last(
                r.prompt.to(dev)[None], CacheWindow(s.cache, r0, r0 + 1, T - t)
            )
            if h is None:
                h = torch.zeros(B, last.shape[-1], dtype=last.dtype, device=dev)
            h[r0 : r0 + n] = last
            _copy_row(s.cache, r0, r0 + n, slice(T - t, T))
        s.cache.write_idx.fill_(T)
        dummy = ~real.to(dev)
        # dummy rows attend one slot (no all-masked softmax) and never produce a frame
        s.cache.key_mask[:, T - 1] |= dummy
        self._pair_dummies(s, dummy)
        return s, T, h

    def _prefill_last(self, ids: torch.Tensor, cache) -> torch.Tensor:
        """Prefill ``ids`` [n, T, 1 + n_vq] (unpadded) into ``cache``; the last hidden [n, H]."""
        raise NotImplementedError

    def _pair_dummies(self, s, dummy: torch.Tensor) -> None:
        """Mark the ``dummy`` rows [B] finished before the first step."""
        raise NotImplementedError

    def _loop(
        self, s, prompt_len: int, max_steps: int, step, every: int = 0, on_sync=None
    ) -> Iterator[tuple[int, bool]]:
        """Steps 1.. of a decode whose step 0 is done (from the prefill). Yields (steps done,
        last) every ``every`` steps (0: never) and once at the end. Every ``sync_every`` steps
        the host reads whether all rows have finished (``on_sync`` first: rules that need the
        host's view, e.g. per-row frame budgets). ``step(kv_len)`` runs one step."""
        n = 1
        while n < max_steps:
            if n % self.sync_every == 0:
                if on_sync is not None:
                    on_sync()
                if bool(s.finished.all()):
                    break
            if every and n % every == 0:
                yield n, False
            # Step n's backbone step writes cache slot T + n - 1; read a 64-slot bucket past it.
            step(min(s.max_len, round_up(prompt_len + n)))
            n += 1
        yield n, True
