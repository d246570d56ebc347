"""Exact streaming decode for MOSS-Audio-Tokenizer (v1 and v2): new frames of many requests in
one batched call, each request continuing from its own past, the audio equal to the one-shot
decode's (up to float rounding), not an approximation near chunk seams.

Why it can be exact: the decoder is transformer stages and patch reshapes only (no
convolutions). A stage's step sees its own past only through attention, limited to the last
``context`` steps, so keeping per request and per layer the keys and values of the last
``context - 1`` steps (RoPE already applied at their absolute positions) is all the history
there is. Every frame is a whole number of steps at every stage, so frames map to steps.

State lives in slots (``StreamDecoder(codec, slots)``): per stage and layer a ring of keys and
values per slot (RoPE already applied), ``context - 1`` steps plus the most new steps one call
brings (``piece_frames``; about 130 MB per slot for the real v2 decoder in bf16 at 16 frames),
plus the frames each slot has seen. A call writes its new keys into the rings in place, then
each row attends to its ring, step s at entry s % ring, masked to the window by absolute step.
``decode({slot: new codes})`` appends; ``reset(slot)`` starts a slot over (a new request). On
the ``compiled`` path (``ring_pieces``) the q/k/v split, RoPE and ring write are one Triton
kernel, and the attention another that reads only the ring entries its queries' windows reach,
in place; the plain pieces gather each row's ring per layer and score all of it. The residual
adds and LayerNorms between the matmuls are the one-shot decode's pieces
(``codec_layers.layer_pieces``), so the stream rounds as the one-shot decode does.

CUDA graphs (``mode="graphs"``, the default on CUDA): a call is a few thousand small kernels
(every layer's norms, projections, RoPE, cache reads and writes), so at a few requests a call
the GPU waits on the host's launches. On CUDA each call is padded to a bucket (requests and
frames each to the next power of two), its inputs copied into that bucket's fixed buffers, and
the bucket's graph replayed: captured on the bucket's first call (``run_captured``, as the
engine's steps are). Padded requests read and write one scratch slot past the last; padded
frames are masked out of every real request's attention and their keys go to the scratch slot,
never into a request's ring, so padding changes only the float rounding of the
matmuls' other shapes. ``mode="padded"`` is that path without graphs (the tests compare it with
``eager`` on CPU).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from bestofn.moss.codec.layers import Transformer, layer_pieces, patch_up, rotate_pairs
from bestofn.moss.engine_shell import pow2, run_captured

MODES = ("eager", "padded", "graphs")
PIECE = 16  # new frames of a request per decoder call: the serve chunk (CHUNK_FRAMES)


class _StageCache:
    """A stage's per-slot history as a ring: per layer a [slots, ring, H, dh] key and value
    buffer; step s of a slot's stream sits at ring index s % ring. The ring holds the window's
    ``keep`` past steps plus the most new steps one call can bring, so a call writes its new
    keys in place (before attending) without overwriting any key its own queries still see."""

    def __init__(self, stage: Transformer, slots: int, device, max_new: int):
        c = stage.cfg
        self.keep = max(0, (c.context or 1) - 1)
        self.ring = self.keep + max_new
        shape = (slots, self.ring, c.heads, c.d_model // c.heads)
        self.k = [torch.zeros(shape, dtype=stage.dtype, device=device) for _ in stage.layers]
        self.v = [torch.zeros(shape, dtype=stage.dtype, device=device) for _ in stage.layers]


def heads_to_ring(qkv, cos, sin, dest, ring_k, ring_v, heads: int) -> torch.Tensor:
    """The fused projection's output [B, N, 3 * heads * dh] of N new steps per request -> q
    [B, heads, N, dh], RoPE'd at ``cos``, ``sin`` [B, N, dh / 2] (None: no RoPE); k (RoPE'd)
    and v written into the rings ([entries, heads, dh]) at entries ``dest`` [B * N]."""
    B, N, _ = qkv.shape
    q, k, v = qkv.view(B, N, 3, heads, -1).unbind(2)
    if cos is not None:
        q, k = (rotate_pairs(t, cos[:, :, None], sin[:, :, None]) for t in (q, k))
    ring_k.index_copy_(0, dest, k.reshape(B * N, heads, -1))
    ring_v.index_copy_(0, dest, v.reshape(B * N, heads, -1))
    return q.transpose(1, 2)


def ring_window_attention(q, ring_k, ring_v, slots, pos, window: int, memo: dict | None = None):
    """q [B, H, N, dh]: the new steps of each row, row b at absolute steps ``pos[b]``.. of slot
    ``slots[b]`` of the rings [slots, R, H, dh] (step s at entry s % R, its keys and values
    already written) -> [B, N, H * dh]. Query step t sees steps max(0, t - window + 1)..t.
    ``memo``: a dict kept across one call's layers (their mask is the same)."""
    B, H, N, dh = q.shape
    R = ring_k.shape[1]
    memo = {} if memo is None else memo
    if "mask" not in memo:
        qpos = pos[:, None] + torch.arange(N, device=q.device)  # [B, N]
        # the step each entry holds: the latest s <= the row's last step with s = entry mod R.
        # Entries of padded steps were not written (they hold older steps) but their step is
        # after every valid query: masked as the future
        last = qpos[:, -1:]
        kpos = last - (last - torch.arange(R, device=q.device)[None, :]) % R  # [B, R]
        delta = qpos[:, :, None] - kpos[:, None, :]
        memo["mask"] = ((kpos[:, None, :] >= 0) & (delta >= 0) & (delta < window))[:, None]
    keys = ring_k.index_select(0, slots).transpose(1, 2)  # [B, H, R, dh]
    values = ring_v.index_select(0, slots).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, keys, values, attn_mask=memo["mask"])
    return a.transpose(1, 2).reshape(B, N, H * dh)


def ring_pieces(kernels: str):
    """(``heads_to_ring``, ``ring_window_attention``) for ``kernels``: plain, or (``compiled``)
    each one Triton kernel (``codec.kernels``). The plain pieces' float32 RoPE temporaries and
    ring write were about a quarter of a busy service's streaming decode (H100 profile); the
    plain attention gathers each row's whole ring per layer and scores every entry of it."""
    if kernels == "eager":
        return heads_to_ring, ring_window_attention
    from bestofn.moss.codec.kernels import ring_attention, ring_heads, window_attention_fits

    def attend(q, ring_k, ring_v, slots, pos, window, memo=None):
        if not window_attention_fits(q):
            return ring_window_attention(q, ring_k, ring_v, slots, pos, window, memo)
        return ring_attention(q, ring_k, ring_v, slots, pos, window)

    return ring_heads, attend


def _stream_stage(stage: Transformer, cache: _StageCache, slots, scratch, pos, lens, x):
    """One stage on new steps x [B, N, in] of rows at absolute step ``pos`` [B] with ``lens``
    [B] valid new steps (N <= the ring's room for new steps); writes the rows' valid new keys
    and values into their rings (padded steps go to the ``scratch`` slot); returns
    [B, N, out]."""
    c = stage.cfg
    x = x.to(stage.dtype)
    if stage.in_proj is not None:
        x = stage.in_proj(x).to(stage.dtype)
    N = x.shape[1]
    H, dh, R = c.heads, c.d_model // c.heads, cache.ring
    steps = torch.arange(N, device=x.device)
    qpos = pos[:, None] + steps  # [B, N]
    # where each new step goes: its ring index in its row's slot, the scratch slot if padded
    valid = steps[None, :] < lens[:, None]
    dest = (torch.where(valid, slots[:, None], scratch) * R + qpos % R).reshape(-1)
    cos = sin = None
    if c.rope:
        half = torch.arange(dh // 2, device=x.device, dtype=torch.float32)
        freqs = torch.exp(half * (-math.log(c.max_period) * 2 / dh))
        ang = qpos.float()[:, :, None] * freqs  # [B, N, dh/2]: the one-shot tables' values
        cos, sin = torch.cos(ang), torch.sin(ang)
    _, _, add_norm = layer_pieces(stage.kernels)
    to_ring, attend = ring_pieces(stage.kernels)
    window, memo = c.context or R, {}
    layers = stage.layers
    h = layers[0]["norm1"](x) if layers else x
    for i, L in enumerate(layers):
        ring_k, ring_v = (r.view(-1, H, dh) for r in (cache.k[i], cache.v[i]))
        q = to_ring(L["qkv"](h).to(stage.dtype), cos, sin, dest, ring_k, ring_v, H)
        a = attend(q, cache.k[i], cache.v[i], slots, pos, window, memo)
        u = L["o"](a).to(stage.dtype)
        x, h = stage._residual(add_norm, x, u, L["layer_scale_1"], L["norm2"])
        u = L["fc2"](F.gelu(L["fc1"](h).to(stage.dtype))).to(stage.dtype)
        following = layers[i + 1]["norm1"] if i + 1 < len(layers) else None
        x, h = stage._residual(add_norm, x, u, L["layer_scale_2"], following)
    if stage.out_proj is not None:
        x = stage.out_proj(x).to(stage.dtype)
    return x


class _Bucket:
    """The fixed buffers of one (requests, frames) shape and its graph (``run_captured``'s
    state: ``graphs``, ``graph_pool``)."""

    def __init__(self, rows: int, frames: int, n_vq: int, out_shape: tuple, device, pool):
        self.codes = torch.zeros(rows, frames, n_vq, dtype=torch.long, device=device)
        self.slots = torch.zeros(rows, dtype=torch.long, device=device)
        self.pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.lens = torch.zeros(rows, dtype=torch.long, device=device)
        self.out = torch.zeros(out_shape, dtype=torch.float32, device=device)
        self.graphs: dict = {}
        self.graph_pool = pool


class StreamDecoder:
    """Batched exact streaming decode over ``slots`` request slots of one codec; ``mode``:
    ``eager``, ``padded`` or ``graphs`` (the module docstring; default: graphs on CUDA).
    ``piece_frames``: the most new frames of a request one decoder call takes (more are decoded
    in pieces of that size); the rings hold that much beyond each window, so it sets the
    caches' size (the serve chunk, ``CHUNK_FRAMES``, fits in one piece)."""

    def __init__(self, codec, slots: int, mode: str | None = None, piece_frames: int = PIECE):
        self.codec, self.slots = codec, int(slots)
        self.piece = int(piece_frames)
        if self.piece < 1:
            raise ValueError(f"piece_frames is {piece_frames}; it must be at least 1")
        if any(isinstance(s, Transformer) and not s.cfg.context for s in codec.decoder):
            raise ValueError("streaming decode needs every decoder stage to have a window")
        cuda = torch.device(codec.device).type == "cuda"
        self.mode = mode or ("graphs" if cuda else "eager")
        if self.mode not in MODES:
            raise ValueError(f"stream decode mode is {self.mode!r}; known: {', '.join(MODES)}")
        if self.mode == "graphs" and not cuda:
            raise ValueError("stream decode mode 'graphs' needs a CUDA codec")
        # one row more than the slots: the scratch row of padded requests and padded steps
        self.caches, per_frame = {}, 1
        for i, stage in enumerate(codec.decoder):
            if isinstance(stage, Transformer):
                new = self.piece * per_frame
                self.caches[i] = _StageCache(stage, self.slots + 1, codec.device, new)
            else:
                per_frame *= stage
        self.frames = [0] * self.slots
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._pool = None  # the buckets' graphs replay one at a time: one memory pool

    def reset(self, slot: int) -> None:
        self.frames[slot] = 0  # old ring entries sit at negative positions: masked

    def _run(self, codes, slots, pos, lens) -> torch.Tensor:
        """The decoder on device inputs: codes [B, N, n_vq], each row's slot, frames seen and
        valid new frames -> audio [B, N * hop, channels] float32 on the device."""
        codec = self.codec
        B, N = codes.shape[:2]
        x = codec.embed_codes(codes)
        per_frame = 1  # steps per frame at the current stage
        for i, stage in enumerate(codec.decoder):
            if isinstance(stage, Transformer):
                x = _stream_stage(
                    stage, self.caches[i], slots, self.slots, pos * per_frame,
                    lens * per_frame, x,
                )  # fmt: skip
            else:
                x, per_frame = patch_up(x, stage), per_frame * stage
        return x.reshape(B, N * codec.hop, codec.channels).float()

    def _run_bucket(self, grid, slots, pos, lens) -> torch.Tensor:
        rows, frames = grid.shape[:2]
        bucket = self._buckets.get((rows, frames))
        if bucket is None:
            shape = (rows, frames * self.codec.hop, self.codec.channels)
            bucket = _Bucket(rows, frames, grid.shape[2], shape, self.codec.device, self._pool)
            self._buckets[(rows, frames)] = bucket
        for buf, host in zip((bucket.codes, bucket.slots, bucket.pos, bucket.lens),
                             (grid, slots, pos, lens), strict=True):  # fmt: skip
            buf.copy_(host)

        def step():
            bucket.out.copy_(self._run(bucket.codes, bucket.slots, bucket.pos, bucket.lens))

        run_captured(bucket, (), step, self.mode == "graphs")
        self._pool = self._pool or bucket.graph_pool
        return bucket.out

    def _piece(self, items: list[tuple[int, torch.Tensor]]) -> np.ndarray:
        """One decoder call on at most ``piece`` new frames per request -> the requests'
        audio [len(items), frames * hop, channels] on the host (rows past a request's own
        frames are padding)."""
        codec = self.codec
        longest = max(len(c) for _, c in items)
        B, N = len(items), longest
        if self.mode != "eager":
            B, N = pow2(B), min(pow2(N), self.piece)
        grid = torch.zeros(B, N, codec.n_vq, dtype=torch.long)
        slots = torch.full((B,), self.slots, dtype=torch.long)  # padded rows: the scratch slot
        pos = torch.zeros(B, dtype=torch.long)
        lens = torch.zeros(B, dtype=torch.long)
        for b, (s, c) in enumerate(items):
            grid[b, : len(c)] = c
            slots[b], pos[b], lens[b] = s, self.frames[s], len(c)
        codec.check_codes(grid)
        if self.mode == "eager":
            dev = codec.device
            x = self._run(grid.to(dev), slots.to(dev), pos.to(dev), lens.to(dev))
        else:
            x = self._run_bucket(grid, slots, pos, lens)
        x = x[: len(items), : longest * codec.hop]
        if x.device.type != "cuda":
            return x.clone().numpy()  # not a view of a bucket's buffer, which the next call reuses
        # into page-locked host memory: a pageable copy of a busy service's audio took tens of
        # ms a call; the caching host allocator reuses the block once its arrays are gone
        host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        host.copy_(x, non_blocking=True)
        torch.cuda.current_stream(x.device).synchronize()
        return host.numpy()

    @torch.inference_mode()
    def decode(self, new: dict[int, torch.Tensor]) -> dict[int, np.ndarray]:
        """{slot: codes [n, >= n_vq]} -> {slot: float32 audio (n * hop, channels)} of exactly
        those frames, continuing each slot's stream."""
        codec = self.codec
        items = [(s, torch.as_tensor(c)[:, : codec.n_vq]) for s, c in new.items() if len(c)]
        out = {s: np.zeros((0, codec.channels), np.float32) for s in new}
        parts: dict[int, list[np.ndarray]] = {s: [] for s, _ in items}
        for start in range(0, max((len(c) for _, c in items), default=0), self.piece):
            piece = [(s, c[start : start + self.piece]) for s, c in items if len(c) > start]
            audio = self._piece(piece)
            for b, (s, c) in enumerate(piece):
                self.frames[s] += len(c)
                parts[s].append(audio[b, : len(c) * codec.hop])
        for s, got in parts.items():
            # one piece: a view of that piece's host buffer, not copied again
            out[s] = got[0] if len(got) == 1 else np.concatenate(got)
        return out
