"""Exact streaming decode for MOSS-Audio-Tokenizer (v1 and v2): new frames of many requests in
one batched call, each request continuing from its own past, the audio equal to the one-shot
decode's (up to float rounding), not an approximation near chunk seams.

Why it can be exact: the decoder is transformer stages and patch reshapes only (no
convolutions). A stage's step sees its own past only through attention, limited to the last
``context`` steps, so keeping per request and per layer the keys and values of the last
``context - 1`` steps (RoPE already applied at their absolute positions) is all the history
there is. Every frame is a whole number of steps at every stage, so frames map to steps.

State lives in slots (``StreamDecoder(codec, slots)``): per stage and layer a [slots, H,
context - 1, dh] key and value cache in the compute dtype (about 90 MB per slot for the real v2
decoder in bf16), plus the frames each slot has seen. ``decode({slot: new codes})`` appends;
``reset(slot)`` starts a slot over (a new request).

CUDA graphs (``mode="graphs"``, the default on CUDA): a call is a few thousand small kernels
(every layer's norms, projections, RoPE, cache reads and writes), so at a few requests a call
the GPU waits on the host's launches. On CUDA each call is padded to a bucket (requests and
frames each to the next power of two), its inputs copied into that bucket's fixed buffers, and
the bucket's graph replayed: captured on the bucket's first call (``run_captured``, as the
engine's steps are). Padded requests read and write one scratch slot past the last; padded
frames are masked out of every real request's attention and never enter a cache (a cache keeps
the steps before each request's own length), so padding changes only the float rounding of the
matmuls' other shapes. ``mode="padded"`` is that path without graphs (the tests compare it with
``eager`` on CPU).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from bestofn.moss.codec.layers import Transformer, patch_up, rotate_pairs
from bestofn.moss.engine_shell import pow2, run_captured

MODES = ("eager", "padded", "graphs")


class _StageCache:
    def __init__(self, stage: Transformer, slots: int, device):
        c = stage.cfg
        self.keep = max(0, (c.context or 1) - 1)
        dh = c.d_model // c.heads
        shape = (slots, c.heads, self.keep, dh)
        self.k = [torch.zeros(shape, dtype=stage.dtype, device=device) for _ in stage.layers]
        self.v = [torch.zeros(shape, dtype=stage.dtype, device=device) for _ in stage.layers]


def _stream_stage(stage: Transformer, cache: _StageCache, slots, pos, lens, x):
    """One stage on new steps x [B, N, in] of rows at absolute step ``pos`` [B] with ``lens``
    [B] valid new steps; updates the rows' caches; returns [B, N, out]."""
    c = stage.cfg
    x = x.to(stage.dtype)
    if stage.in_proj is not None:
        x = stage.in_proj(x).to(stage.dtype)
    B, N, D = x.shape
    H, dh, C = c.heads, c.d_model // c.heads, cache.keep
    qpos = pos[:, None] + torch.arange(N, device=x.device)  # [B, N]
    kpos = torch.cat((pos[:, None] - C + torch.arange(C, device=x.device), qpos), dim=1)
    delta = qpos[:, :, None] - kpos[:, None, :]
    mask = ((kpos[:, None, :] >= 0) & (delta >= 0) & (delta < (c.context or N + C)))[:, None]
    cos = sin = None
    if c.rope:
        half = torch.arange(dh // 2, device=x.device, dtype=torch.float32)
        freqs = torch.exp(half * (-math.log(c.max_period) * 2 / dh))
        ang = qpos.float()[:, None, :, None] * freqs  # [B, 1, N, dh/2]
        cos, sin = torch.cos(ang), torch.sin(ang)
    # the last C steps ending at each row's valid length, for the cache
    take = (lens[:, None] + torch.arange(C, device=x.device))[:, None, :, None]
    take = take.expand(B, H, C, dh)
    for i, L in enumerate(stage.layers):
        h = L["norm1"](x)
        q, k, v = L["qkv"](h).to(stage.dtype).view(B, N, 3, H, dh).permute(2, 0, 3, 1, 4)
        if cos is not None:
            q, k = rotate_pairs(q, cos, sin), rotate_pairs(k, cos, sin)
        keys = torch.cat((cache.k[i][slots], k), dim=2)
        values = torch.cat((cache.v[i][slots], v), dim=2)
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        if C:
            cache.k[i][slots] = torch.gather(keys, 2, take)
            cache.v[i][slots] = torch.gather(values, 2, take)
        u = L["o"](a.transpose(1, 2).reshape(B, N, D)).to(stage.dtype)
        x = x + (u * L["layer_scale_1"] if L["layer_scale_1"] is not None else u)
        h = L["norm2"](x)
        u = L["fc2"](F.gelu(L["fc1"](h).to(stage.dtype))).to(stage.dtype)
        x = x + (u * L["layer_scale_2"] if L["layer_scale_2"] is not None else u)
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
    ``eager``, ``padded`` or ``graphs`` (the module docstring; default: graphs on CUDA)."""

    def __init__(self, codec, slots: int, mode: str | None = None):
        self.codec, self.slots = codec, int(slots)
        if any(isinstance(s, Transformer) and not s.cfg.context for s in codec.decoder):
            raise ValueError("streaming decode needs every decoder stage to have a window")
        cuda = torch.device(codec.device).type == "cuda"
        self.mode = mode or ("graphs" if cuda else "eager")
        if self.mode not in MODES:
            raise ValueError(f"stream decode mode is {self.mode!r}; known: {', '.join(MODES)}")
        if self.mode == "graphs" and not cuda:
            raise ValueError("stream decode mode 'graphs' needs a CUDA codec")
        # one row more than the slots: the scratch row of a bucket's padded requests
        self.caches = {
            i: _StageCache(s, self.slots + 1, codec.device)
            for i, s in enumerate(codec.decoder)
            if isinstance(s, Transformer)
        }
        self.frames = [0] * self.slots
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._pool = None  # the buckets' graphs replay one at a time: one memory pool

    def reset(self, slot: int) -> None:
        self.frames[slot] = 0  # old cache entries sit at negative positions: masked

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
                    stage, self.caches[i], slots, pos * per_frame, lens * per_frame, x
                )
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

    @torch.inference_mode()
    def decode(self, new: dict[int, torch.Tensor]) -> dict[int, np.ndarray]:
        """{slot: codes [n, >= n_vq]} -> {slot: float32 audio (n * hop, channels)} of exactly
        those frames, continuing each slot's stream."""
        codec = self.codec
        items = [(s, torch.as_tensor(c)[:, : codec.n_vq]) for s, c in new.items() if len(c)]
        out = {s: np.zeros((0, codec.channels), np.float32) for s in new}
        if not items:
            return out
        B, N = len(items), max(len(c) for _, c in items)
        if self.mode != "eager":
            B, N = pow2(B), pow2(N)
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
        audio = x[: len(items)].cpu().numpy()
        for b, (s, c) in enumerate(items):
            self.frames[s] += len(c)
            out[s] = np.ascontiguousarray(audio[b, : len(c) * codec.hop])
        return out
