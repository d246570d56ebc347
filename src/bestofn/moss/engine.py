"""The decode loop: batched prefill, then one fixed-shape step per frame.

A frame step = backbone step on the previous frame's row + local transformer position 0 (stop
decision) + n_vq codebook steps, each with its sampling. Every tensor it touches is preallocated
in a ``DecodeState`` for one (batch, max_len) shape, so on CUDA the whole step is captured once as
a CUDA graph and replayed for every frame (one launch per frame instead of ~1,000 kernels).
The host syncs only every ``sync_every`` frames to see whether all rows have stopped.

The MOSS-TTS Delay 8B variant (32 codebooks, delay pattern, no local transformer) has its own
loop in ``bestofn.moss.delay_engine`` on the same pieces: the backbone layers and cache, the
per-take uniforms (``STEPS_PER_FRAME`` = 64 > 1 + 32 steps), the sampler and graph capture.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from bestofn.moss.model import MossLocalModel
from bestofn.moss.sampling import (
    STEPS_PER_FRAME,
    SamplingParams,
    apply_repetition_penalty,
    sample_tokens,
    take_uniform,
)


@dataclass
class GenerationOutput:
    codes: list[torch.Tensor]  # per row: int64 [n_frames, n_vq] on CPU (no stop frame, no pads)
    stopped: list[bool]  # row emitted audio_end before the frame budget ran out
    frames: int  # decode steps actually run


@dataclass
class StreamStep:
    start: int  # first frame index in ``codes``
    codes: torch.Tensor  # int64 [B, F, n_vq] on CPU: frames [start, start + F) of every row
    n_frames: torch.Tensor  # [B] frames each row has produced so far (its codes end there)
    finished: torch.Tensor  # [B] bool: the row stopped (stop head, or its row_frames budget)
    last: bool  # the decode loop is over


class DecodeState:
    """All buffers one frame step reads and writes, for a fixed batch and cache length."""

    def __init__(self, model: MossLocalModel, batch: int, max_len: int, max_frames: int):
        c = model.config
        dev = model.audio_embed.device
        self.batch, self.max_len, self.max_frames = batch, max_len, max_frames
        self.cache = model.new_backbone_cache(batch, max_len)
        self.local = model.new_local_cache(batch)
        long = dict(dtype=torch.long, device=dev)
        self.seeds = torch.zeros(batch, **long)
        self.steps = torch.arange(1 + c.n_vq, **long)  # counter offsets within a frame
        self.frame = torch.zeros((), **long)  # frame counter for the random stream
        self.row = torch.zeros(batch, 1 + c.n_vq, **long)  # next backbone input row
        self.alive = torch.ones(batch, dtype=torch.bool, device=dev)  # its attention mask
        self.finished = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.n_frames = torch.zeros(batch, **long)
        self.history = torch.full((batch, max_frames + 1, c.n_vq), c.audio_pad_code, **long)
        self.seen = torch.zeros(c.n_vq, batch, c.audio_vocab, dtype=torch.bool, device=dev)
        f32 = dict(dtype=torch.float32, device=dev)
        self.temperature = torch.ones((), **f32)
        self.top_p = torch.ones((), **f32)
        self.penalty = torch.ones((), **f32)
        self.text_temperature = torch.ones((), **f32)
        self.text_top_p = torch.ones((), **f32)
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.graph_pool = None

    def buffers(self) -> list[torch.Tensor]:
        """Every persistent tensor (for the 'nothing grows' test)."""
        return [
            *self.cache.tensors(),
            *self.local.tensors(),
            self.seeds,
            self.frame,
            self.row,
            self.alive,
            self.finished,
            self.n_frames,
            self.history,
            self.seen,
        ]


class MossLocalEngine:
    def __init__(
        self,
        model: MossLocalModel,
        use_cuda_graphs: bool | None = None,
        compile: bool | None = None,
        sync_every: int = 8,
        max_states: int = 2,
    ):
        self.model = model.eval()
        self.config = model.config
        self.device = model.audio_embed.device
        on_gpu = self.device.type == "cuda"
        self.use_cuda_graphs = on_gpu if use_cuda_graphs is None else use_cuda_graphs
        # torch.compile fuses the elementwise chains between the matmuls (fewer kernels per
        # frame); CUDA graphs then remove the launch cost of what is left.
        self.compiled = on_gpu if compile is None else compile
        self._sample, self._uniform = sample_tokens, take_uniform
        if self.compiled:
            model.compile_steps()
            self._sample = torch.compile(sample_tokens, dynamic=False)
            self._uniform = torch.compile(take_uniform, dynamic=False)
        self.sync_every = sync_every
        self.max_states = max_states
        self._states: dict[tuple[int, int, int], DecodeState] = {}

    # ---- the frame step (captured as a CUDA graph) -------------------------------------------

    def _frame_step(self, s: DecodeState, p: SamplingParams, kv_len: int | None = None) -> None:
        m = self.model
        x = m.embed_rows(s.row).to(m.audio_embed.dtype)
        self._heads_and_sampling(s, p, m.backbone_step(x, s.alive, s.cache, kv_len))

    def _heads_and_sampling(self, s: DecodeState, p: SamplingParams, h: torch.Tensor) -> None:
        """Local transformer + sampling for one frame, given the backbone hidden h [B, H]."""
        m, c = self.model, self.config
        # All of this frame's uniforms at once: [B, 1 + n_vq] (stop head, then codebooks).
        u = self._uniform(s.seeds[:, None], s.frame * STEPS_PER_FRAME + s.steps[None, :])
        if m.fused_local:  # the whole local loop as one (compiled) function: moss/local_loop.py
            stop_idx, frame_codes = m.local_frame(
                h, u, s.local, s.seen, s.temperature, s.top_p, s.penalty, s.text_temperature,
                s.text_top_p, top_k=p.top_k, text_top_k=p.text_top_k, do_sample=p.do_sample,
                use_penalty=p.repetition_penalty != 1.0,
            )  # fmt: skip
        else:
            stop_idx, frame_codes = self._local_loop_unfused(s, p, h, u)
        cont = (stop_idx == 0) & ~s.finished
        s.finished |= stop_idx == 1
        frame_codes = torch.where(cont.unsqueeze(-1), frame_codes, c.audio_pad_code)
        idx = s.frame.clamp(max=s.max_frames).view(1)
        s.history.index_copy_(1, idx, frame_codes.unsqueeze(1))
        s.n_frames += cont.long()
        # Next input row: [assistant_slot, codes] for rows still going, all-pad (masked) otherwise.
        text = torch.where(cont, c.audio_assistant_slot_token_id, c.pad_token_id)
        s.row[:, 0].copy_(text)
        s.row[:, 1:].copy_(frame_codes)
        s.alive.copy_(cont)
        s.frame += 1

    def _local_loop_unfused(self, s: DecodeState, p: SamplingParams, h, u):
        """The local loop piece by piece (each piece compiled on its own); kept as the baseline
        for the fused ``model.local_frame`` (BESTOFN_MOSS_FUSED=0 / ``model.fused_local``)."""
        m, c = self.model, self.config
        local = m.local_step(h, 0, s.local)
        stop_idx = self._sample(
            m.stop_logits(local),
            u[:, 0],
            temperature=s.text_temperature,
            top_k=p.text_top_k,
            top_p=s.text_top_p,
            do_sample=p.do_sample,
        )
        codes = []
        for k in range(c.n_vq):
            logits = m.audio_logits(local, k)
            if p.repetition_penalty != 1.0:
                logits = apply_repetition_penalty(logits, s.seen[k], s.penalty)
            code = self._sample(
                logits,
                u[:, 1 + k],
                temperature=s.temperature,
                top_k=p.top_k,
                top_p=s.top_p,
                do_sample=p.do_sample,
            )
            if p.repetition_penalty != 1.0:
                s.seen[k].scatter_(1, code.unsqueeze(1), True)
            codes.append(code)
            if k + 1 < c.n_vq:
                local = m.local_step(m.audio_embed[k][code].to(local.dtype), k + 1, s.local)
        return stop_idx, torch.stack(codes, dim=-1)

    # ---- public API --------------------------------------------------------------------------

    def _state_for(self, batch: int, prompt_len: int, max_frames: int) -> DecodeState:
        """A decode state big enough for this request: reuse the smallest existing one (its
        CUDA graphs too), else allocate one with shapes rounded up to 64 so a few states serve
        many groups. At most ``max_states`` are kept (each holds a full KV cache)."""
        need_len, need_frames = prompt_len + max_frames + 1, max_frames
        fits = [
            s
            for s in self._states.values()
            if s.batch == batch and s.max_len >= need_len and s.max_frames >= need_frames
        ]
        if fits:
            return min(fits, key=lambda s: s.max_len)
        max_len = -(-need_len // 64) * 64
        mf = -(-max_frames // 64) * 64
        while len(self._states) >= self.max_states:  # drop the oldest (and its graphs)
            self._states.pop(next(iter(self._states)))
        state = DecodeState(self.model, batch, max_len, mf)
        self._states[(batch, max_len, mf)] = state
        return state

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        seeds: list[int] | torch.Tensor,
        max_frames: int,
        params: SamplingParams | None = None,
        state: DecodeState | None = None,
    ) -> GenerationOutput:
        """input_ids [B, T, 1+n_vq]: left-padded prompts ending in audio_start; a seed per row."""
        *_, (s, frames, _) = self._decode(
            input_ids, attention_mask, seeds, max_frames, params, state
        )  # the loop yields only at its end here
        return self._collect(s, max_frames, frames)

    @torch.inference_mode()
    def stream(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        seeds: list[int] | torch.Tensor,
        max_frames: int,
        params: SamplingParams | None = None,
        every: int = 4,
        row_frames: list[int] | None = None,
    ) -> Iterator[StreamStep]:
        """``generate`` that hands out the frames as they are decoded: a ``StreamStep`` every
        ``every`` frames and a last one at the end. Row b's codes are the first ``n_frames[b]``
        frames of the concatenated blocks (exactly ``generate``'s codes for the same inputs).

        ``row_frames``: each row's own frame budget (rows of one batch may have different ones);
        a row past it is stopped at the next sync (every ``sync_every`` frames), so it can
        overshoot by a few frames: cut each row at its budget. Other rows are not affected."""
        start = 0
        for s, frames, last in self._decode(
            input_ids, attention_mask, seeds, max_frames, params, None, every, row_frames
        ):
            block = s.history[:, start:frames].cpu()
            yield StreamStep(start, block, s.n_frames.cpu(), s.finished.cpu(), last)
            start = frames

    def _decode(
        self, input_ids, attention_mask, seeds, max_frames, params, state, every=0, row_frames=None
    ) -> Iterator[tuple[DecodeState, int, bool]]:
        """The decode loop; yields (state, frames decoded, last) every ``every`` frames (0:
        never) and once at the end."""
        p = params or SamplingParams()
        B, T, _ = input_ids.shape
        dev = self.device
        if attention_mask is None:
            attention_mask = torch.ones(B, T, dtype=torch.bool)
        s = state or self._state_for(B, T, max_frames)
        if s.batch != B or s.max_len < T + max_frames + 1 or s.max_frames < max_frames:
            raise ValueError("decode state too small for this request")
        self._reset(s, p, seeds)
        limits = None
        if row_frames is not None:
            limits = torch.as_tensor(list(row_frames), dtype=torch.long).to(dev)

        h = self.model.prefill(input_ids.to(dev), attention_mask.to(dev), s.cache)
        # Prefill gives the hidden for the last prompt row, so frame 0 skips its backbone step.
        self._heads_and_sampling(s, p, h[:, -1])
        frames = 1
        while frames < max_frames:
            if frames % self.sync_every == 0:
                if limits is not None:
                    s.finished |= s.n_frames >= limits
                if bool(s.finished.all()):
                    break
            if every and frames % every == 0:
                yield s, frames, False
            # Frame f's backbone step writes cache slot T + f - 1; read a 64-slot bucket past it.
            kv_len = min(s.max_len, -(-(T + frames) // 64) * 64)
            self._run_step(s, p, kv_len)
            frames += 1
        yield s, frames, True

    def _reset(self, s: DecodeState, p: SamplingParams, seeds) -> None:
        s.cache.reset()
        seeds = torch.as_tensor(seeds, dtype=torch.long)
        if seeds.shape != (s.batch,):
            raise ValueError(f"need one seed per row ({s.batch}), got {tuple(seeds.shape)}")
        s.seeds.copy_(seeds)
        s.frame.zero_()
        s.finished.zero_()
        s.alive.fill_(True)
        s.n_frames.zero_()
        s.history.fill_(self.config.audio_pad_code)
        s.seen.zero_()
        s.temperature.fill_(p.temperature)
        s.top_p.fill_(p.top_p)
        s.penalty.fill_(p.repetition_penalty)
        s.text_temperature.fill_(p.text_temperature)
        s.text_top_p.fill_(p.text_top_p)

    def _run_step(self, s: DecodeState, p: SamplingParams, kv_len: int) -> None:
        if not self.use_cuda_graphs:
            self._frame_step(s, p, kv_len)
            return
        key = (p.top_k, p.text_top_k, p.do_sample, p.repetition_penalty != 1.0, kv_len)
        graph = s.graphs.get(key)
        if graph is None:
            # Warm up on a side stream (a real frame), then capture the step for the next one.
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._frame_step(s, p, kv_len)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            # Graphs of one state replay one after another, so they can share a memory pool.
            # thread_local: the worker's overlap threads (event records, FLAC writes) may make CUDA
            # calls while this thread captures; under "global" those calls abort the capture.
            with torch.cuda.graph(graph, pool=s.graph_pool, capture_error_mode="thread_local"):
                self._frame_step(s, p, kv_len)
            s.graph_pool = s.graph_pool or graph.pool()
            s.graphs[key] = graph
            # Capture does not execute; the warm-up step already produced this frame. The next
            # replay runs frame+1 from the state the warm-up left, which is exactly right.
            return
        graph.replay()

    def _collect(self, s: DecodeState, max_frames: int, frames: int) -> GenerationOutput:
        n = s.n_frames.cpu()
        hist = s.history[:, :max_frames].cpu()
        finished = s.finished.cpu()
        codes = [hist[b, : int(n[b])].clone() for b in range(s.batch)]
        return GenerationOutput(codes=codes, stopped=[bool(f) for f in finished], frames=frames)
