"""Preallocated KV caches. Nothing here ever grows: decode steps write in place at an index held
in a device tensor, so the same step can be replayed from a CUDA graph."""

from __future__ import annotations

import torch


class BackboneCache:
    """K/V for every backbone layer, laid out [layers, batch, kv_heads, max_len, head_dim].

    K/V stay at kv_heads (grouped-query attention reads them per group; they are never expanded
    to every query head). ``key_mask`` marks which slots a query may attend to (left padding and
    finished rows are 0). ``pos`` is each row's next RoPE position; ``write_idx`` the next slot.
    """

    def __init__(
        self, n_layers, batch, kv_heads, max_len, head_dim, dtype, device, kv_side_by_side=False
    ):
        shape = (n_layers, batch, kv_heads, max_len, head_dim)
        self.kv = None
        if kv_side_by_side:
            # [layers, batch, kv_heads, max_len, 2, head_dim]: a token's K and V are adjacent,
            # so the fused decode writes both with one index_copy. k/v are strided views of it
            # with the usual [layers, batch, kv_heads, max_len, head_dim] shape.
            self.kv = torch.zeros(
                (n_layers, batch, kv_heads, max_len, 2, head_dim), dtype=dtype, device=device
            )
            self.k, self.v = self.kv[..., 0, :], self.kv[..., 1, :]
        else:
            self.k = torch.zeros(shape, dtype=dtype, device=device)
            self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.key_mask = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
        self.pos = torch.zeros(batch, dtype=torch.long, device=device)
        self.write_idx = torch.zeros(1, dtype=torch.long, device=device)
        self.max_len = max_len
        self.batch = batch

    def reset(self) -> None:
        self.key_mask.zero_()
        self.pos.zero_()
        self.write_idx.zero_()

    def copy_rows(self, rows: torch.Tensor, src: BackboneCache, src_rows: torch.Tensor) -> None:
        """K/V of rows ``src_rows`` of ``src`` (its whole length) into rows ``rows`` of this
        cache, slots [0, src.max_len): the rows kept when a decode state grows."""
        L = src.max_len
        if self.kv is not None and src.kv is not None:  # K and V side by side: one copy
            pairs = [(self.kv, src.kv)]
        else:
            pairs = [(self.k, src.k), (self.v, src.v)]
        for dst, s in pairs:
            # Picking src_rows copies what it picks: a layer at a time, that copy is a layer's
            # rows, not every layer's (62 rows of a 1,024-slot cache of Qwen3-4B: 8.7 GiB at
            # once, which ran a full GPU out of memory while the state grew).
            for layer in range(dst.shape[0]):
                dst[layer, rows, :, :L] = s[layer, src_rows]

    def write_rows(self, layer: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """One layer's K/V of a prefill ([len(rows), kv_heads, T, head_dim] each) into slots
        [0, T) of ``rows`` (through the k/v views when K and V sit side by side)."""
        T = k.shape[2]
        self.k[layer, rows, :, :T] = k
        self.v[layer, rows, :, :T] = v

    def tensors(self) -> list[torch.Tensor]:
        kv = [self.k, self.v] if self.kv is None else [self.kv]
        return [*kv, self.key_mask, self.pos, self.write_idx]


class LocalCache:
    """K/V of the local transformer for one frame: [layers, batch, heads, n_vq + 1, head_dim].
    Each frame overwrites slots 0..n_vq-1 in order, so it never needs clearing.

    ``kv`` is the fused local loop's copy ([layers, batch, n_vq + 1, 2, heads, head_dim]: a
    position's K and V side by side, written with one copy); ``k``/``v`` serve the unfused loop.
    A few hundred KiB at batch 64, so both are kept rather than switching layouts."""

    def __init__(self, n_layers, batch, heads, length, head_dim, dtype, device):
        shape = (n_layers, batch, heads, length, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        kv_shape = (n_layers, batch, length, 2, heads, head_dim)
        self.kv = torch.zeros(kv_shape, dtype=dtype, device=device)

    def tensors(self) -> list[torch.Tensor]:
        return [self.k, self.v, self.kv]
