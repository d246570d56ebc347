"""Continuous (iteration-level) batching for moss-fast: requests join a running decode.

``ContinuousDecoder.run(pull, params)`` keeps one decode state of ``batch`` row slots. Every
``every`` frames it syncs with the host: it hands out each occupied row's new frames
(``RowUpdate``), frees the rows that stopped (stop head, their frame budget, or cancelled), and
asks ``pull(room)`` for requests that arrived meanwhile. Those are prefilled in one pass of
up to ``PACK_ROWS`` prompt rows (``MossLocalModel.prefill_packed``: the prompts end to end, so
a burst of many lengths is one pass; attention per length group, so a prompt is never padded;
at most ``admit_tokens`` prompt rows a sync, if set), their K/V written into free row slots of
the running cache, and their first frame sampled from the prefill's last hidden state, exactly
as a batch of their own would start. The loop ends when no row is occupied and ``pull`` has
nothing.

What makes a row independent of its neighbours and of when it joined:
- each row has its own cache write slot, RoPE position, frame counter and frame budget (the
  one-batch engine, ``MossLocalEngine``, shares one write index and one frame counter);
- sampling is counter-based on (seed, the row's own frame, step), so a row draws the same
  uniforms alone or joined mid-flight (``bestofn.moss.sampling``);
- attention reads only the row's own slots (its key mask); free rows attend one dummy slot.

The states, graph capture and sampling are the engine shell's (bestofn.moss.engine_shell), and a
frame's local loop is the Local engine's (``bestofn.moss.engine.local_codes``).
Shapes stay bucketed so CUDA graphs (and compiled code) are reused: the batch is a power of two
(grown at least 4x at a time, never shrunk within a run: the occupied rows are copied into the
larger state), the cache length a power of two >= 256, and the attention window a 64-slot
bucket of the longest occupied row.
Up to ``max_states`` states (each a full KV cache, with its graphs) are kept between runs.
Memory bounds the rows: when the device cannot hold a larger state, the kept states are dropped
and the state is sized down to the largest batch that fits (``row_limit``, kept for the
decoder's life); requests past it wait in the decoder for rows to free, rather than failing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from bestofn.moss.engine import local_codes
from bestofn.moss.engine_shell import StateCache, StepState, pow2, round_up, run_captured
from bestofn.moss.model import decode_attention
from bestofn.moss.sampling import STEPS_PER_FRAME, SamplingParams

log = logging.getLogger(__name__)


@dataclass
class Join:
    key: object  # the caller's handle for this request
    prompt: torch.Tensor  # [T, 1 + n_vq] rows ending in audio_start
    seed: int
    budget: int  # frames at most


@dataclass
class RowUpdate:
    key: object
    codes: torch.Tensor  # int64 [F, n_vq] on CPU: the frames this row produced since last time
    finished: bool  # no more frames will come for this key


class RowState(StepState):
    """Every buffer a frame step reads and writes, per row slot, for one (batch, max_len)."""

    def __init__(self, model, batch: int, max_len: int, cap: int):
        c = model.config
        dev = model.audio_embed.device
        super().__init__(dev)
        self.batch, self.max_len, self.cap = batch, max_len, cap
        self.cache = model.new_backbone_cache(batch, max_len)  # its write_idx is unused
        self.local = model.new_local_cache(batch)
        long = dict(dtype=torch.long, device=dev)
        self.rows = torch.arange(batch, **long)
        self.steps = torch.arange(1 + c.n_vq, **long)
        self.slot = torch.zeros(batch, **long)  # each row's next cache slot
        self.seeds = torch.zeros(batch, **long)
        self.frame = torch.zeros(batch, **long)  # each row's own frame counter
        self.n_frames = torch.zeros(batch, **long)
        self.limit = torch.zeros(batch, **long)  # each row's frame budget
        self.row = torch.zeros(batch, 1 + c.n_vq, **long)  # next backbone input row
        self.alive = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.every_row = torch.ones(batch, dtype=torch.bool, device=dev)
        self.out = torch.zeros(batch, cap, c.n_vq, **long)  # frames since the last sync
        self.out_n = torch.zeros(batch, **long)
        self.seen = torch.zeros(c.n_vq, batch, c.audio_vocab, dtype=torch.bool, device=dev)
        self.pad_row = torch.full((1 + c.n_vq,), c.audio_pad_code, **long)
        self.pad_row[0] = c.pad_token_id

    def clear(self, p: SamplingParams) -> None:
        """Every row free."""
        self.cache.key_mask.zero_()
        self.cache.key_mask[:, 0] = True  # free rows attend slot 0 (no all-masked softmax)
        self.cache.pos.zero_()
        self.slot.fill_(1)  # ...and write (masked) at slot 1, leaving slot 0 as it is
        for t in (self.seeds, self.frame, self.n_frames, self.limit, self.out_n):
            t.zero_()
        self.row.copy_(self.pad_row.expand_as(self.row))
        self.alive.zero_()
        self.finished.fill_(True)
        self.seen.zero_()
        self.set_sampling(p)

    def free(self, b: int) -> None:
        self.finished[b] = True
        self.alive[b] = False
        self.limit[b] = 0

    def copy_rows_from(self, old: RowState, idx: torch.Tensor) -> None:
        """Rows ``idx`` of ``old`` into the same rows here (a state at least as large)."""
        L0 = old.max_len
        self.cache.copy_rows(idx, old.cache, idx)
        self.cache.key_mask[idx] = False
        self.cache.key_mask[idx, :L0] = old.cache.key_mask[idx]
        self.cache.pos[idx] = old.cache.pos[idx]
        for name in ("slot", "seeds", "frame", "n_frames", "limit", "row", "alive", "finished",
                     "out", "out_n"):  # fmt: skip
            getattr(self, name)[idx] = getattr(old, name)[idx]
        self.seen[:, idx] = old.seen[:, idx]


@dataclass
class _Row:
    key: object
    base: int  # cache slot of its first decode step (= its prompt length)
    steps: int  # decode steps since it joined
    budget: int


class ContinuousDecoder:
    def __init__(self, engine, max_states: int = 3, min_len: int = 256):
        self.engine = engine
        self.model = engine.model
        self.config = engine.config
        self.device = engine.device
        self.min_len = min_len
        self._states = StateCache(max_states)
        self.joined_running = 0  # requests that joined a decode already running (for /health)
        self.row_limit: int | None = None  # the most rows the device held (None: not reached)

    # ---- the frame step (captured as a CUDA graph) -------------------------------------------

    def _backbone(self, s: RowState, x: torch.Tensor, kv_len: int) -> torch.Tensor:
        """One backbone step, each row writing at its own slot. x [B, H]."""
        m, c = self.model, s.cache
        B, L = s.batch, kv_len
        c.key_mask.index_put_((s.rows, s.slot), s.alive)
        bias = torch.zeros((), dtype=x.dtype, device=x.device).masked_fill(
            ~c.key_mask[:, None, None, :L], float("-inf")
        )
        cos, sin = m._rope(c.pos, x.dtype)
        if m.fused_backbone and c.kv is not None:
            # as MossLocalModel.backbone_step's fused path (K and V side by side, one write;
            # each residual add fused with the next norm), each row writing at its own slot
            first, n = m.layers[0], len(m.layers)
            hn = first.impl["rms_norm_w"](x, first.input_layernorm.weight, first.eps)
            for i, layer in enumerate(m.layers):
                nxt = m.layers[i + 1].input_layernorm if i + 1 < n else m.norm
                D, n_kv = layer.head_dim, layer.n_kv
                q, kv = layer.impl["backbone_qkv_fused"](
                    hn, cos, sin, layer.qkv.weight, layer._qk_norm_weight(), layer.n_heads,
                    n_kv, layer.eps,
                )  # fmt: skip
                idx = s.slot.view(B, 1, 1, 1, 1).expand(B, n_kv, 1, 2, D)
                c.kv[i].scatter_(2, idx, kv.unsqueeze(2))
                kv_l = c.kv[i][:, :, :L]
                q = q.reshape(B, n_kv, layer.n_heads // n_kv, D)
                k, v = kv_l[..., 0, :], kv_l[..., 1, :]
                out = decode_attention(q, k, v, bias, layer.scale, layer.attention)
                x, hn = layer.impl["backbone_post_attn_norm"](
                    x, out.reshape(B, -1), layer.o_proj.weight,
                    layer.post_attention_layernorm.weight, layer.gate_up.weight,
                    layer.down_proj.weight, nxt.weight, layer.eps,
                )  # fmt: skip
        else:
            for i, layer in enumerate(m.layers):
                q, k, v = layer._pre(x, cos, sin)  # q [B, h, D], k/v [B, kv, D]
                D = layer.head_dim
                idx = s.slot.view(B, 1, 1, 1).expand(B, layer.n_kv, 1, D)
                c.k[i].scatter_(2, idx, k.unsqueeze(2))
                c.v[i].scatter_(2, idx, v.unsqueeze(2))
                q = q.reshape(B, layer.n_kv, layer.n_heads // layer.n_kv, D)
                k, v = c.k[i][:, :, :L], c.v[i][:, :, :L]
                out = decode_attention(q, k, v, bias, layer.scale, layer.attention)
                x = layer._post(x, out.reshape(B, -1))
            hn = m.norm(x)
        step = s.alive.long()
        c.pos.add_(step)
        s.slot.add_(step)
        return hn

    def _heads(self, s: RowState, p: SamplingParams, h: torch.Tensor, act: torch.Tensor) -> None:
        """Local transformer + sampling for one frame of the rows in ``act`` (others untouched)."""
        m, c, e = self.model, self.config, self.engine
        u = e._uniform(s.seeds[:, None], s.frame[:, None] * STEPS_PER_FRAME + s.steps[None, :])
        joining = None if act is s.every_row else act  # a join step: only the joiners
        stop_idx, codes = local_codes(m, e._sample, s, p, h, u, joining)
        cont = (stop_idx == 0) & ~s.finished & act
        n_after = s.n_frames + cont.long()
        done = s.finished | (stop_idx == 1) | (n_after >= s.limit)
        s.finished.copy_(torch.where(act, done, s.finished))
        frame_codes = torch.where(cont.unsqueeze(-1), codes, c.audio_pad_code)
        s.out.index_put_((s.rows, s.out_n.clamp(max=s.cap - 1)), frame_codes)
        s.out_n.add_(cont.long())
        s.n_frames.copy_(n_after)
        text = torch.where(cont, c.audio_assistant_slot_token_id, c.pad_token_id)
        new_row = torch.cat([text.unsqueeze(-1), frame_codes], dim=-1)
        s.row.copy_(torch.where(act.unsqueeze(-1), new_row, s.row))
        s.alive.copy_(torch.where(act, cont, s.alive))
        s.frame.add_(act.long())

    def _frame_step(self, s: RowState, p: SamplingParams, kv_len: int) -> None:
        m = self.model
        x = m.embed_rows(s.row).to(m.audio_embed.dtype)
        self._heads(s, p, self._backbone(s, x, kv_len), s.every_row)

    def _run_step(self, s: RowState, p: SamplingParams, kv_len: int) -> None:
        key = (p.top_k, p.text_top_k, p.do_sample, p.repetition_penalty != 1.0, kv_len)
        run_captured(s, key, lambda: self._frame_step(s, p, kv_len), self.engine.use_cuda_graphs)

    # ---- states ------------------------------------------------------------------------------

    def _state(self, batch: int, max_len: int, cap: int) -> RowState:
        """The smallest kept state that fits (its CUDA graphs too), else a new one."""

        def fits(s):
            return s.batch >= batch and s.max_len >= max_len and s.cap == cap

        key = (batch, max_len, cap)
        return self._states.get_fitting(fits, key, lambda: RowState(self.model, *key))

    def _sized_state(self, old: RowState | None, batch: int, max_len: int, cap: int) -> RowState:
        """A state of ``batch`` rows (at least ``old``'s) and ``max_len`` slots, else, out of
        device memory, of the most rows that fit (never fewer than ``old``'s: its rows are
        copied), recorded as ``row_limit``; the old state itself when only rows were to grow."""
        floor = old.batch if old is not None else 1
        try:
            return self._state(batch, max_len, cap)
        except torch.OutOfMemoryError as first:
            oom = first
        # the kept states of other shapes hold memory a run at this shape cannot use
        for key in [k for k, kept in self._states.items() if kept is not old]:
            del self._states[key]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        while batch >= floor:
            if old is not None and batch == old.batch and old.max_len >= max_len:
                state = old
                break
            try:
                state = self._state(batch, max_len, cap)
                break
            except torch.OutOfMemoryError as e:
                oom = e
                batch //= 2
        else:
            raise oom
        if self.row_limit != state.batch:
            log.warning("continuous decode: %d rows fit on %s, not more (%s); requests past "
                        "them wait for free rows", state.batch, self.device, oom)  # fmt: skip
        self.row_limit = state.batch
        return state

    # ---- the loop ----------------------------------------------------------------------------

    def _admit(self, s, rows: dict[int, _Row], joins: list[Join], p, cap, max_batch):
        """Place ``joins`` in free rows (growing the state when needed; as many as fit) and
        sample their frame 0. Returns the state the loop continues with and how many of
        ``joins``, from the first, were placed."""
        most = min(pow2(max_batch), self.row_limit or pow2(max_batch))
        need_batch = min(most, pow2(len(rows) + len(joins)))
        longest = max(j.prompt.shape[0] + j.budget + 1 for j in joins)
        longest = max([longest] + [r.base + r.budget + 1 for r in rows.values()])
        need_len = max(self.min_len, pow2(longest))
        if s is None or s.batch < need_batch or s.max_len < need_len:
            old = s
            if old is not None and old.batch < need_batch:  # grow 4x at least: fewer shapes
                need_batch = max(need_batch, min(most, 4 * old.batch))
            s = self._sized_state(old, max(need_batch, old.batch if old else 1),
                                  max(need_len, old.max_len if old else 0), cap)  # fmt: skip
            if s is not old:
                s.clear(p)
                if old is not None and rows:
                    s.copy_rows_from(old, torch.tensor(sorted(rows), device=self.device))
        m, dev = self.model, self.device
        free = [b for b in range(s.batch) if b not in rows][: len(joins)]
        joins = joins[: len(free)]
        if not joins:  # every row the device holds is busy: they wait
            return s, 0
        act = torch.zeros(s.batch, dtype=torch.bool, device=dev)
        h0 = torch.zeros(s.batch, self.config.hidden_size, dtype=m.audio_embed.dtype, device=dev)
        by_len: dict[int, list[int]] = {}
        for n, j in enumerate(joins):
            by_len.setdefault(int(j.prompt.shape[0]), []).append(n)
        for part in _passes(list(by_len.items())):
            at = [torch.tensor([free[n] for n in members], device=dev) for _, members in part]
            prompts = [torch.stack([joins[n].prompt for n in members]).to(dev)
                       for _, members in part]  # fmt: skip
            c = s.cache

            def write(layer, g, k, v, at=at, c=c):  # group g's K/V into its rows' slots
                c.write_rows(layer, at[g], k, v)

            for idx, (T, _), h in zip(at, part, m.prefill_packed(prompts, write), strict=True):
                c.key_mask[idx] = False
                c.key_mask[idx, :T] = True
                c.pos[idx] = T
                s.slot[idx] = T
                h0[idx] = h
        idx = torch.tensor(free, device=dev)
        s.seeds[idx] = torch.tensor([int(j.seed) for j in joins], dtype=torch.long, device=dev)
        s.limit[idx] = torch.tensor([int(j.budget) for j in joins], dtype=torch.long, device=dev)
        for t in (s.frame, s.n_frames, s.out_n):
            t[idx] = 0
        s.finished[idx] = False
        s.alive[idx] = True
        s.seen[:, idx] = False
        act[idx] = True
        self._heads(s, p, h0, act)  # frame 0 from the prompt's last hidden state
        for b, j in zip(free, joins, strict=True):
            rows[b] = _Row(j.key, int(j.prompt.shape[0]), 0, int(j.budget))
        return s, len(joins)

    @torch.inference_mode()
    def run(
        self,
        pull: Callable[[int], list[Join]],
        params: SamplingParams | None,
        cancelled: Callable[[object], bool] | None,
        every: int,
        max_batch: int,
        admit_tokens: int | None = None,
    ) -> Iterator[list[RowUpdate]]:
        """Decode until no row is left and ``pull(room)`` (up to ``room`` new requests, never
        blocking) has nothing. Yields, every ``every`` frames, one ``RowUpdate`` per occupied
        row (a row's last one has ``finished``); a request whose ``cancelled(key)`` turns true
        (None: none is) is dropped at the next sync without a last update. ``max_batch``: rows
        decoding at once; no default here: the caller passes the speech service's configured
        value (one decoder serves an engine across runs, so it is a run's argument).
        ``admit_tokens``: at most this many prompt rows prefilled at one sync (at least one
        request), the rest waiting for the next: a burst joins over several syncs and its first
        requests start sooner; None: every request that has a row joins at once."""
        p = params or SamplingParams()
        every, max_batch = max(1, int(every)), max(1, int(max_batch))
        cap = every + 1  # frames a row can produce between two syncs, with room to spare
        s: RowState | None = None
        rows: dict[int, _Row] = {}
        waiting: list[Join] = []  # pulled, not yet placed: more than the device's rows
        while True:
            if cancelled is not None:
                for b in [b for b, r in rows.items() if cancelled(r.key)]:
                    s.free(b)
                    del rows[b]
                waiting = [j for j in waiting if not cancelled(j.key)]
            room = min(max_batch, self.row_limit or max_batch) - len(rows) - len(waiting)
            new = list(pull(room)) if room > 0 else []
            if len(new) > max(room, 0):
                raise ValueError(f"pull({room}) returned {len(new)} requests")
            joins, placed, waiting = waiting + new, 0, []
            if not rows and not joins:
                return
            if joins and len(rows) < min(max_batch, self.row_limit or max_batch):
                running = bool(rows)
                now = _within(joins, admit_tokens)
                s, placed = self._admit(s, rows, now, p, cap, max_batch)
                if running:
                    self.joined_running += placed
            waiting = joins[placed:]
            # after a join, the joiners' frame 0 is already out: sync one step sooner, so
            # their first ``every`` frames come out together (time to first audio)
            for _ in range(every - 1 if placed and every > 1 else every):
                top = max(r.base + r.steps for r in rows.values())  # highest write slot
                kv_len = min(s.max_len, round_up(top + 1))
                self._run_step(s, p, kv_len)
                for r in rows.values():
                    r.steps += 1
            # copies (on a CPU device .cpu() would alias the buffers the next steps rewrite)
            out_n = s.out_n.to("cpu", copy=True)
            finished = s.finished.to("cpu", copy=True)
            most = int(out_n.max())
            out = s.out[:, :most].to("cpu", copy=True) if most else None
            s.out_n.zero_()
            updates = []
            for b, r in sorted(rows.items()):
                n = int(out_n[b])
                codes = out[b, :n] if n else torch.zeros(0, self.config.n_vq, dtype=torch.long)
                done = bool(finished[b])
                updates.append(RowUpdate(r.key, codes, done))
                if done:
                    s.free(b)
                    del rows[b]
            yield updates


PACK_ROWS = 8192  # prompt rows prefilled in one pass at most (its activations' memory)


def _passes(groups: list[tuple[int, list]]) -> list[list[tuple[int, list]]]:
    """Prompt groups (length, members) packed into prefill passes of at most ``PACK_ROWS`` rows
    each (a group larger than that is a pass of its own, as one batch of its length was)."""
    passes, rows = [], 0
    for T, members in groups:
        n = T * len(members)
        if not passes or rows + n > PACK_ROWS:
            passes.append([])
            rows = 0
        passes[-1].append((T, members))
        rows += n
    return passes


def _within(joins: list[Join], tokens: int | None) -> list[Join]:
    """The first of ``joins`` whose prompts add up to at most ``tokens`` rows (at least one)."""
    if tokens is None:
        return joins
    total, n = 0, 0
    for j in joins:
        total += int(j.prompt.shape[0])
        if n and total > tokens:
            break
        n += 1
    return joins[:n]


def decoder_for(engine) -> ContinuousDecoder:
    """The engine's continuous decoder (made once; it keeps its states between runs)."""
    dec = getattr(engine, "_continuous", None)
    if dec is None:
        dec = engine._continuous = ContinuousDecoder(engine)
    return dec
