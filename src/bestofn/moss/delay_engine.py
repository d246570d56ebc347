"""The MOSS-TTS Delay decode loop: batched prefill, then one fixed-shape step per row.

One step = one backbone step on the previous row, the text head and the 32 codebook heads on
its hidden, and their sampling. Delay is one strategy on the engine shell
(bestofn.moss.engine_shell: states, CUDA graphs, the sync loop); this module says what a Delay
state holds (``DelayState``) and what one step does.

The published ``generate`` (moss_tts_delay/modeling_moss_tts.py) keeps per-row counters that
decide, every step, what each row may emit; they are kept here as device tensors with the same
rules, so the step has no host sync and no data-dependent shape and is captured once as a CUDA
graph on cuda (eager on cpu):

- ``audio_len``: rows since the audio block started; codebook k is sampled once it exceeds k
  (so codebook k of frame f lands in row f + k: the delay pattern);
- ``delayed``: INF until the text head emits the delay slot (the row's "stop"), then counts
  the n_vq rows of the tail in which the low codebooks fall silent one by one; at n_vq the row
  emits audio_end. While the tail runs the text token is forced, else it is sampled:
  inside audio only {gen slot, delay slot}, outside audio anything but the audio specials
  (and never im_end during the first n_vq + 1 steps, never the delay slot at step 0);
- a row that emits im_end stops (its next rows are masked as keys, as the reference does).

What this engine adds, all off by default in ``exact`` mode (the parity check):
``force_audio_start`` (a prompt ending in "assistant\\n" starts its audio block at step 0, as
the trained model does), ``min_frames`` / ``max_frames`` (the delay slot is banned before
min_frames frames and forced at max_frames: every take ends with a complete tail), and
``stop_at_audio_end`` (a row is done at its first audio_end; the loop ends when all are).
Random numbers: ``take_uniform(seed, step * 64 + j)``, j = 0 text, 1 + k codebook k, so a take
draws the same numbers whatever its batch. The repetition penalty (if != 1) is per take and
per codebook over its own generated codes (the published one pools the whole batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from bestofn.moss.delay import MossDelayModel, undo_delay
from bestofn.moss.engine_shell import (
    EngineShell,
    GenerationOutput,
    PairRequest,
    StepState,
    run_captured,
)
from bestofn.moss.sampling import (
    STEPS_PER_FRAME,
    SamplingParams,
    apply_repetition_penalty,
    sample_tokens_fused,
)

INF = 1 << 40  # "no tail running" (the reference uses int64 max; only comparisons matter)


@dataclass(frozen=True)
class DelayBudget:
    """Frame limits of one request (frames = complete codec frames of 80 ms)."""

    max_frames: int
    min_frames: int = 0
    force_audio_start: bool = True
    stop_at_audio_end: bool = True
    enforce: bool = True  # min_frames / max_frames are applied (off: the reference's rules)

    @classmethod
    def exact(cls, max_steps: int) -> DelayBudget:
        """The published generate's behaviour: no forcing, run until im_end or max_steps."""
        return cls(max_frames=max_steps, min_frames=0, force_audio_start=False,
                   stop_at_audio_end=False, enforce=False)  # fmt: skip

    def steps(self, n_vq: int) -> int:
        """Rows needed for max_frames frames: audio_start + frames + tail + audio_end."""
        return self.max_frames + n_vq + 1


class DelayState(StepState):
    """Every buffer one step reads or writes, for a fixed (batch, cache length, steps)."""

    def __init__(self, model: MossDelayModel, batch: int, max_len: int, max_steps: int):
        c = model.config
        dev = model.text_head.device
        super().__init__(dev)
        self.batch, self.max_len, self.max_steps = batch, max_len, max_steps
        self.cache = model.new_backbone_cache(batch, max_len)
        long = dict(dtype=torch.long, device=dev)
        boolean = dict(dtype=torch.bool, device=dev)
        self.seeds = torch.zeros(batch, **long)
        self.offsets = torch.arange(1 + c.n_vq, **long)
        self.k = torch.arange(c.n_vq, **long)
        self.step = torch.zeros((), **long)
        self.row = torch.zeros(batch, 1 + c.n_vq, **long)
        self.alive = torch.ones(batch, **boolean)
        self.stopping = torch.zeros(batch, **boolean)
        self.is_audio = torch.zeros(batch, **boolean)
        self.audio_len = torch.zeros(batch, **long)
        self.delayed = torch.full((batch,), INF, **long)
        self.frames = torch.zeros(batch, **long)  # codebook-0 codes of the first audio block
        self.audio_done = torch.zeros(batch, **boolean)
        self.forced_end = torch.zeros(batch, **boolean)  # max_frames forced the tail
        self.finished = torch.zeros(batch, **boolean)
        self.history = torch.full((batch, max_steps + 1, 1 + c.n_vq), c.audio_pad_code, **long)
        self.seen = torch.zeros(batch, c.n_vq, c.audio_vocab + 1, **boolean)
        # per row: the two requests of a pair may have different budgets
        self.min_frames = torch.zeros(batch, **long)
        self.max_frames = torch.zeros(batch, **long)
        # text-head masks: outside audio these four are banned; inside only gen/delay allowed
        V = c.vocab_size
        self.ban_text = torch.zeros(V, **boolean)
        banned = [c.pad_token_id, c.audio_assistant_gen_slot_token_id,
                  c.audio_assistant_delay_slot_token_id, c.audio_end_token_id]  # fmt: skip
        self.ban_text[banned] = True
        self.slot_ids = torch.tensor([c.audio_assistant_gen_slot_token_id,
                                      c.audio_assistant_delay_slot_token_id], **long)  # fmt: skip
        self.ban_audio = torch.ones(V, **boolean)
        self.ban_audio[[c.audio_assistant_gen_slot_token_id,
                        c.audio_assistant_delay_slot_token_id]] = False  # fmt: skip
        # one-column masks (built here, on the device: an index assignment with a Python
        # scalar inside the captured step copies the scalar from the host)
        self.col_delay = torch.zeros(V, **boolean)
        self.col_delay[c.audio_assistant_delay_slot_token_id] = True
        self.col_im_end = torch.zeros(V, **boolean)
        self.col_im_end[c.im_end_token_id] = True

    def buffers(self) -> list[torch.Tensor]:
        return [*self.cache.tensors(), self.seeds, self.step, self.row, self.alive,
                self.stopping, self.is_audio, self.audio_len, self.delayed, self.frames,
                self.audio_done, self.forced_end, self.finished, self.history,
                self.seen]  # fmt: skip


class MossDelayEngine(EngineShell):
    # the fused sampler: the same draws as sample_tokens, bit for bit, in fewer kernels
    sampler = staticmethod(sample_tokens_fused)

    def new_state(self, batch: int, max_len: int, max_steps: int) -> DelayState:
        return DelayState(self.model, batch, max_len, max_steps)

    # ---- one step (captured as a CUDA graph) ---------------------------------------------

    def _step(self, s: DelayState, p: SamplingParams, b: DelayBudget, kv_len=None) -> None:
        m = self.model
        x = m.embed_rows(s.row).to(m.text_head.dtype)
        self._heads_and_sampling(s, p, b, m.backbone_step(x, s.alive, s.cache, kv_len))

    def _heads_and_sampling(self, s: DelayState, p: SamplingParams, b: DelayBudget, h):
        m, c = self.model, self.config
        n, t = c.n_vq, s.step
        gen, dly = c.audio_assistant_gen_slot_token_id, c.audio_assistant_delay_slot_token_id
        u = self._uniform(s.seeds[:, None], t * STEPS_PER_FRAME + s.offsets[None, :])

        # -- text channel
        in_tail = ~s.stopping & (s.delayed < n)
        at_end = ~s.stopping & (s.delayed == n)
        is_audio = s.is_audio & ~at_end
        free = ~s.stopping & (s.delayed > n)
        short = None
        if b.enforce and b.min_frames > 0:  # too short to stop: no delay slot yet
            short = is_audio & (s.frames + 1 < s.min_frames) & ~s.audio_done
        if b.force_audio_start and b.stop_at_audio_end:
            # Every row whose text we keep is inside its audio block (step 0 is forced to
            # audio_start, a row is done at audio_end), where only the two slot tokens are
            # allowed: two rows of the text head instead of the whole vocabulary (the same
            # draw: the banned tokens have probability 0 either way).
            logits = (h @ m.text_head[s.slot_ids].t()).float()  # [B, 2]: gen, delay
            stop_banned = (t == 0).expand(logits.shape[0])
            if short is not None:
                stop_banned = stop_banned | short
            logits[:, 1] = logits[:, 1].masked_fill(stop_banned, float("-inf"))
            k = min(p.text_top_k, 2) if p.text_top_k > 0 else 0
            pick = self._sample(logits, u[:, 0], temperature=s.text_temperature, top_k=k,
                                top_p=s.text_top_p, do_sample=p.do_sample)  # fmt: skip
            sampled = s.slot_ids[pick]
        else:  # the published rules over the whole vocabulary
            ban = torch.where(is_audio[:, None], s.ban_audio, s.ban_text)
            ban = ban | (s.col_delay & (t == 0))
            if short is not None:
                ban = ban | (s.col_delay & short[:, None])
            ban = ban | (s.col_im_end & (t <= n))
            logits = m.text_logits(h).float().masked_fill(ban, float("-inf"))
            sampled = self._sample(logits, u[:, 0], temperature=s.text_temperature,
                                   top_k=p.text_top_k, top_p=s.text_top_p,
                                   do_sample=p.do_sample)  # fmt: skip
        text = torch.full_like(sampled, c.pad_token_id)
        text = torch.where(in_tail, dly, text)
        text = torch.where(at_end, c.audio_end_token_id, text)
        text = torch.where(free, sampled, text)
        if b.force_audio_start:
            start = free & ~is_audio & (t == 0)
            text = torch.where(start, c.audio_start_token_id, text)
        if b.enforce:  # long enough: start the tail
            full = free & is_audio & (s.frames + 1 >= s.max_frames) & ~s.audio_done
            text = torch.where(full, dly, text)
            s.forced_end |= full & (sampled != dly)
        s.is_audio.copy_(is_audio | (text == c.audio_start_token_id))
        s.stopping |= text == c.im_end_token_id

        # -- codebooks: k is sampled once the block has run k rows, until the tail passes it
        pre = s.audio_len[:, None] > s.k[None, :]
        post = (s.k[None, :] > s.delayed[:, None] - 1) | (s.delayed == INF)[:, None]
        take = pre & post
        logits = m.audio_logits(h).float()  # [B, n, V+1]
        if p.repetition_penalty != 1.0:
            logits = apply_repetition_penalty(logits, s.seen, s.penalty)
        B = logits.shape[0]
        codes = self._sample(logits.reshape(B * n, -1), u[:, 1:].reshape(-1),
                             temperature=s.temperature, top_k=p.top_k, top_p=s.top_p,
                             do_sample=p.do_sample).view(B, n)  # fmt: skip
        codes = torch.where(take, codes, c.audio_pad_code)
        if p.repetition_penalty != 1.0:
            s.seen.scatter_(2, codes.unsqueeze(-1), True)  # pad (never sampled) is harmless

        # -- counters
        grows = (text == c.audio_start_token_id) | (text == gen) | (text == dly)
        s.audio_len.copy_(torch.where(text == c.audio_end_token_id, 0, s.audio_len + grows))
        d = torch.where((s.delayed == INF) & (text == dly), 0, s.delayed)
        d = torch.where(d != INF, d + 1, d)
        s.delayed.copy_(torch.where(d > n, INF, d))
        s.frames += (take[:, 0] & ~s.audio_done).long()
        s.audio_done |= text == c.audio_end_token_id
        done = s.stopping | s.audio_done if b.stop_at_audio_end else s.stopping
        s.finished.copy_(done)

        row = torch.cat([text[:, None], codes], dim=1)
        s.history.index_copy_(1, t.clamp(max=s.max_steps).view(1), row.unsqueeze(1))
        s.row.copy_(row)
        s.alive.copy_(~s.stopping)
        s.step += 1

    # ---- public API ----------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        seeds,
        budget: DelayBudget | int,
        params: SamplingParams | None = None,
        max_steps: int | None = None,
    ) -> GenerationOutput:
        """input_ids [B, T, 1 + n_vq] left-padded prompts; one seed per row. ``budget``: a
        DelayBudget or max_frames. Returns de-delayed codes [T_b, n_vq] per row (complete
        frames of the first audio block), stopped = the row ended its audio by itself."""
        s, steps = self.run(input_ids, attention_mask, seeds, budget, params, max_steps)
        return self._collect(s, steps, input_ids[:, -1, 0])

    @torch.inference_mode()
    def generate_pair(
        self, requests: Sequence[PairRequest], takes: int, params: SamplingParams | None = None
    ) -> list[GenerationOutput]:
        """One or two requests (``PairRequest``, budget: a ``DelayBudget``) in one decode of
        2 x ``takes`` rows; a request's codes are the same alone or beside any partner of the
        same prompt bucket (``EngineShell._pair_start`` says why; the budgets may differ, their
        rules may not). One output per request."""
        p, c = params or SamplingParams(), self.config
        budgets = [r.budget for r in requests]
        rules = {replace(b, max_frames=0, min_frames=int(b.min_frames > 0)) for b in budgets}
        if len(rules) != 1 or not all(b.enforce and b.stop_at_audio_end for b in budgets):
            raise ValueError(f"pair: budgets with different rules, or not enforced: {budgets}")
        # the widest budget for the step's flags (the limits themselves are per row)
        b = max(budgets, key=lambda x: x.max_frames)
        max_steps = b.steps(c.n_vq)
        B = 2 * takes
        text = torch.full((B, 1), c.pad_token_id, dtype=torch.long)  # each row's last prompt token
        mins, maxs = torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long)
        for i, (r, rb) in enumerate(zip(requests, budgets, strict=True)):
            rows = slice(i * takes, i * takes + len(r.seeds))
            text[rows, 0] = int(r.prompt[-1, 0])
            mins[rows], maxs[rows] = rb.min_frames, rb.max_frames

        def reset(s, seeds):
            # the prompt rules read only each row's last token here: the published prompt ends
            # in "assistant\n" (not in audio), as every prompt of ours does
            self._reset(s, p, b, seeds, text.unsqueeze(-1))
            s.min_frames.copy_(mins)
            s.max_frames.copy_(maxs)

        if any(
            int(r.prompt[-1, 0]) in (c.audio_start_token_id, c.audio_assistant_gen_slot_token_id)
            for r in requests
        ):
            raise ValueError("pair: a Delay prompt that ends inside audio cannot pair")  # fmt: skip
        s, T, h = self._pair_start(requests, takes, max_steps, reset)
        self._heads_and_sampling(s, p, b, h)
        step = lambda kv_len: self._run_step(s, p, b, kv_len)  # noqa: E731
        *_, (steps, _) = self._loop(s, T, max_steps, step)
        out = self._collect(s, steps, text[:, 0])
        return [
            GenerationOutput(
                codes=out.codes[i * takes : i * takes + len(r.seeds)],
                stopped=out.stopped[i * takes : i * takes + len(r.seeds)],
                frames=steps,
            )
            for i, r in enumerate(requests)
        ]

    def _prefill_last(self, ids: torch.Tensor, cache) -> torch.Tensor:
        mask = torch.ones(ids.shape[:2], dtype=torch.bool, device=ids.device)
        return self.model.prefill(ids, mask, cache, last_only=True)

    def _pair_dummies(self, s: DelayState, dummy: torch.Tensor) -> None:
        s.stopping |= dummy
        s.finished |= dummy
        s.alive &= ~dummy

    @torch.inference_mode()
    def run(self, input_ids, attention_mask, seeds, budget, params=None, max_steps=None):
        """The decode loop; returns (state, steps run). ``state.history[:, :steps]`` holds
        every generated row [text, delayed codes] as the published generate appends them."""
        p = params or SamplingParams()
        b = budget if isinstance(budget, DelayBudget) else DelayBudget(max_frames=int(budget))
        c = self.config
        B, T, C = input_ids.shape
        if C != 1 + c.n_vq:
            raise ValueError(
                f"input_ids must be [B, T, {1 + c.n_vq}], got {tuple(input_ids.shape)}"
            )
        if not 0 <= b.min_frames <= b.max_frames:
            raise ValueError(f"need 0 <= min_frames <= max_frames, got {b}")
        max_steps = int(max_steps or b.steps(c.n_vq))
        if attention_mask is None:
            attention_mask = torch.ones(B, T, dtype=torch.bool)
        s = self._state_for(B, T, max_steps)
        self._reset(s, p, b, seeds, input_ids)
        dev = self.device
        h = self.model.prefill(input_ids.to(dev), attention_mask.to(dev), s.cache, last_only=True)
        self._heads_and_sampling(s, p, b, h)
        step = lambda kv_len: self._run_step(s, p, b, kv_len)  # noqa: E731
        *_, (steps, _) = self._loop(s, T, max_steps, step)  # it yields only at its end here
        return s, steps

    def _reset(self, s: DelayState, p: SamplingParams, b: DelayBudget, seeds, input_ids):
        c = self.config
        super()._reset(s, p, seeds)
        s.step.zero_()
        # where the prompt leaves each row (the published generate's continuation rule)
        text = input_ids[..., 0].cpu()
        T = text.shape[1]
        last = text[:, -1]
        cont = (last == c.audio_start_token_id) | (last == c.audio_assistant_gen_slot_token_id)
        hits = text == c.audio_start_token_id
        idx = torch.where(hits.any(1), T - 1 - hits.flip(1).int().argmax(1), -1)
        in_audio = cont & (idx != -1)
        s.is_audio.copy_(in_audio)
        s.audio_len.copy_(torch.where(in_audio, T - idx, 0))
        s.delayed.fill_(INF)
        s.stopping.zero_()
        s.frames.zero_()
        s.audio_done.zero_()
        s.forced_end.zero_()
        s.finished.zero_()
        s.alive.fill_(True)
        s.history.fill_(c.audio_pad_code)
        s.seen.zero_()
        s.min_frames.fill_(b.min_frames)
        s.max_frames.fill_(b.max_frames)

    def _run_step(self, s: DelayState, p: SamplingParams, b: DelayBudget, kv_len: int) -> None:
        key = (p.top_k, p.text_top_k, p.do_sample, p.repetition_penalty != 1.0, b.min_frames > 0,
               b.enforce, b.force_audio_start, b.stop_at_audio_end, kv_len)  # fmt: skip
        run_captured(s, key, lambda: self._step(s, p, b, kv_len), self.use_cuda_graphs)

    def _collect(self, s: DelayState, steps: int, last_text) -> GenerationOutput:
        """last_text [B]: each row's last prompt token (where its prompt left it)."""
        c = self.config
        hist = s.history[:, :steps].cpu()
        last = last_text.cpu()
        started = (last == c.audio_start_token_id) | (last == c.audio_assistant_gen_slot_token_id)
        forced = s.forced_end.cpu()
        codes, stopped = [], []
        for b in range(s.batch):
            rows = hist[b]
            begin = 0
            if not bool(started[b]):
                hit = (rows[:, 0] == c.audio_start_token_id).nonzero()
                begin = int(hit[0]) + 1 if len(hit) else steps
            end_hit = (rows[begin:, 0] == c.audio_end_token_id).nonzero()
            end = begin + int(end_hit[0]) if len(end_hit) else steps
            frames = undo_delay(rows[begin:end, 1:])
            complete = (frames != c.audio_pad_code).all(dim=1)
            frames = frames[: int(complete.long().cumprod(0).sum())]  # up to the first gap
            codes.append(frames.clone())
            stopped.append(bool(len(end_hit)) and not bool(forced[b]))
        return GenerationOutput(codes=codes, stopped=stopped, frames=steps)
