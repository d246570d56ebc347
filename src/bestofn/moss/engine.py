"""The MOSS-TTS-Local decode loop: batched prefill, then one fixed-shape frame step per frame.

A frame step = backbone step on the previous frame's row + local transformer position 0 (stop
decision) + n_vq codebook steps, each with its sampling. Local is one strategy on the engine
shell (bestofn.moss.engine_shell: states, CUDA graphs, the sync loop); this module says what a
Local state holds (``DecodeState``) and what one frame step does. The Delay 8B strategy is in
bestofn.moss.delay_engine; continuous batching (bestofn.moss.continuous) runs these same frame
pieces (``local_codes``) on rows that join a running decode.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from bestofn.moss.engine_shell import (  # noqa: F401  (GenerationOutput: part of this API)
    EngineShell,
    GenerationOutput,
    PairRequest,
    StepState,
    run_captured,
)
from bestofn.moss.model import MossLocalModel
from bestofn.moss.sampling import STEPS_PER_FRAME, SamplingParams, apply_repetition_penalty


@dataclass
class StreamStep:
    start: int  # first frame index in ``codes``
    codes: torch.Tensor  # int64 [B, F, n_vq] on CPU: frames [start, start + F) of every row
    n_frames: torch.Tensor  # [B] frames each row has produced so far (its codes end there)
    finished: torch.Tensor  # [B] bool: the row stopped (stop head, or its row_frames budget)
    last: bool  # the decode loop is over


class DecodeState(StepState):
    """All buffers one frame step reads and writes, for a fixed batch and cache length
    (``max_steps``: frames)."""

    def __init__(self, model: MossLocalModel, batch: int, max_len: int, max_steps: int):
        c = model.config
        dev = model.audio_embed.device
        super().__init__(dev)
        self.batch, self.max_len, self.max_steps = batch, max_len, max_steps
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
        self.history = torch.full((batch, max_steps + 1, c.n_vq), c.audio_pad_code, **long)
        self.seen = torch.zeros(c.n_vq, batch, c.audio_vocab, dtype=torch.bool, device=dev)

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


# ---- the local loop of one frame (shared with continuous batching) ---------------------------


def local_codes(m, sample, s, p: SamplingParams, h, u, joining=None):
    """Stop index [B] and codes [B, n_vq] of one frame, from the backbone hidden h [B, H] and
    this frame's uniforms u [B, 1 + n_vq]: the whole local loop as one compiled function
    (``model.local_frame``, moss/local_loop.py) or piece by piece (runtime ``fused: false``).
    ``joining``: the rows that take this frame when not all do (a continuous batch's join step:
    the others keep their repetition-penalty memory); None: every row."""
    penalty = p.repetition_penalty != 1.0
    if not m.fused_local:
        return _local_loop_unfused(m, sample, s, p, h, u, joining)
    seen = s.seen.clone() if penalty and joining is not None else None
    out = m.local_frame(
        h, u, s.local, s.seen, s.temperature, s.top_p, s.penalty, s.text_temperature,
        s.text_top_p, top_k=p.top_k, text_top_k=p.text_top_k, do_sample=p.do_sample,
        use_penalty=penalty,
    )  # fmt: skip
    if seen is not None:  # rows not joining keep what they had seen
        s.seen.copy_(torch.where(joining[None, :, None], s.seen, seen))
    return out


def _local_loop_unfused(m, sample, s, p: SamplingParams, h, u, joining):
    """The local loop piece by piece (each piece compiled on its own); kept as the baseline for
    the fused ``model.local_frame``."""
    n_vq, penalty = m.config.n_vq, p.repetition_penalty != 1.0
    local = m.local_step(h, 0, s.local)
    stop_idx = sample(
        m.stop_logits(local), u[:, 0], temperature=s.text_temperature, top_k=p.text_top_k,
        top_p=s.text_top_p, do_sample=p.do_sample,
    )  # fmt: skip
    codes = []
    for k in range(n_vq):
        logits = m.audio_logits(local, k)
        if penalty:
            logits = apply_repetition_penalty(logits, s.seen[k], s.penalty)
        code = sample(
            logits, u[:, 1 + k], temperature=s.temperature, top_k=p.top_k, top_p=s.top_p,
            do_sample=p.do_sample,
        )  # fmt: skip
        if penalty and joining is None:
            s.seen[k].scatter_(1, code.unsqueeze(1), True)
        elif penalty:
            hit = torch.zeros_like(s.seen[k]).scatter_(1, code.unsqueeze(1), joining.unsqueeze(1))
            s.seen[k] |= hit
        codes.append(code)
        if k + 1 < n_vq:
            local = m.local_step(m.audio_embed[k][code].to(local.dtype), k + 1, s.local)
    return stop_idx, torch.stack(codes, dim=-1)


class MossLocalEngine(EngineShell):
    def new_state(self, batch: int, max_len: int, max_steps: int) -> DecodeState:
        return DecodeState(self.model, batch, max_len, max_steps)

    # ---- the frame step (captured as a CUDA graph) -------------------------------------------

    def _frame_step(self, s: DecodeState, p: SamplingParams, kv_len: int | None = None) -> None:
        m = self.model
        x = m.embed_rows(s.row).to(m.audio_embed.dtype)
        self._heads_and_sampling(s, p, m.backbone_step(x, s.alive, s.cache, kv_len))

    def _heads_and_sampling(self, s: DecodeState, p: SamplingParams, h: torch.Tensor) -> None:
        """Local transformer + sampling for one frame, given the backbone hidden h [B, H]."""
        c = self.config
        # All of this frame's uniforms at once: [B, 1 + n_vq] (stop head, then codebooks).
        u = self._uniform(s.seeds[:, None], s.frame * STEPS_PER_FRAME + s.steps[None, :])
        stop_idx, frame_codes = local_codes(self.model, self._sample, s, p, h, u)
        cont = (stop_idx == 0) & ~s.finished
        s.finished |= stop_idx == 1
        frame_codes = torch.where(cont.unsqueeze(-1), frame_codes, c.audio_pad_code)
        idx = s.frame.clamp(max=s.max_steps).view(1)
        s.history.index_copy_(1, idx, frame_codes.unsqueeze(1))
        s.n_frames += cont.long()
        # Next input row: [assistant_slot, codes] for rows still going, all-pad (masked) otherwise.
        text = torch.where(cont, c.audio_assistant_slot_token_id, c.pad_token_id)
        s.row[:, 0].copy_(text)
        s.row[:, 1:].copy_(frame_codes)
        s.alive.copy_(cont)
        s.frame += 1

    def _run_step(self, s: DecodeState, p: SamplingParams, kv_len: int) -> None:
        key = (p.top_k, p.text_top_k, p.do_sample, p.repetition_penalty != 1.0, kv_len)
        run_captured(s, key, lambda: self._frame_step(s, p, kv_len), self.use_cuda_graphs)

    # ---- public API --------------------------------------------------------------------------

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
        if s.batch != B or s.max_len < T + max_frames + 1 or s.max_steps < max_frames:
            raise ValueError("decode state too small for this request")
        self._reset(s, p, seeds)
        on_sync = None
        if row_frames is not None:  # a row past its own budget stops at the next sync
            limits = torch.as_tensor(list(row_frames), dtype=torch.long).to(dev)

            def on_sync():
                s.finished |= s.n_frames >= limits

        h = self.model.prefill(input_ids.to(dev), attention_mask.to(dev), s.cache)
        # Prefill gives the hidden for the last prompt row, so frame 0 skips its backbone step.
        self._heads_and_sampling(s, p, h[:, -1])
        step = lambda kv_len: self._run_step(s, p, kv_len)  # noqa: E731
        for frames, last in self._loop(s, T, max_frames, step, every, on_sync):
            yield s, frames, last

    @torch.inference_mode()
    def generate_pair(
        self, requests: Sequence[PairRequest], takes: int, params: SamplingParams | None = None
    ) -> list[GenerationOutput]:
        """One or two requests (``PairRequest``: budget = max frames) in one decode of
        2 x ``takes`` rows; a request's codes are the same alone or beside any partner of the
        same prompt bucket (``EngineShell._pair_start`` says why). One output per request."""
        p = params or SamplingParams()
        budgets = [int(r.budget) for r in requests]
        max_steps = max(budgets)
        s, T, h = self._pair_start(
            requests, takes, max_steps, lambda s, seeds: self._reset(s, p, seeds)
        )
        self._heads_and_sampling(s, p, h)
        limits = torch.zeros(s.batch, dtype=torch.long)
        for i, (r, b) in enumerate(zip(requests, budgets, strict=True)):
            limits[i * takes : i * takes + len(r.seeds)] = b
        limits = limits.to(self.device)

        def on_sync():  # a row past its own budget stops (its codes are cut there below)
            s.finished |= s.n_frames >= limits

        step = lambda kv_len: self._run_step(s, p, kv_len)  # noqa: E731
        *_, (frames, _) = self._loop(s, T, max_steps, step, 0, on_sync)
        n = s.n_frames.cpu()
        hist = s.history[:, :max_steps].cpu()
        outs = []
        for i, (r, b) in enumerate(zip(requests, budgets, strict=True)):
            rows = range(i * takes, i * takes + len(r.seeds))
            # stopped: the stop head fired within the budget (the row's frames end before it),
            # as a call of its own would say; a row that ran on is cut at its budget
            codes = [hist[k, : min(int(n[k]), b)].clone() for k in rows]
            stopped = [int(n[k]) < b for k in rows]
            outs.append(GenerationOutput(codes=codes, stopped=stopped, frames=min(frames, b)))
        return outs

    def _prefill_last(self, ids: torch.Tensor, cache) -> torch.Tensor:
        mask = torch.ones(ids.shape[:2], dtype=torch.bool, device=ids.device)
        return self.model.prefill(ids, mask, cache)[:, -1]

    def _pair_dummies(self, s: DecodeState, dummy: torch.Tensor) -> None:
        s.finished |= dummy

    def _reset(self, s: DecodeState, p: SamplingParams, seeds) -> None:
        super()._reset(s, p, seeds)
        s.frame.zero_()
        s.finished.zero_()
        s.alive.fill_(True)
        s.n_frames.zero_()
        s.history.fill_(self.config.audio_pad_code)
        s.seen.zero_()

    def _collect(self, s: DecodeState, max_frames: int, frames: int) -> GenerationOutput:
        n = s.n_frames.cpu()
        hist = s.history[:, :max_frames].cpu()
        finished = s.finished.cpu()
        codes = [hist[b, : int(n[b])].clone() for b in range(s.batch)]
        return GenerationOutput(codes=codes, stopped=[bool(f) for f in finished], frames=frames)
