"""Reading a MOSS-Audio-Tokenizer checkpoint (v1 or v2): tensors by name over its safetensors
files, read lazily, with errors that name the file and the tensor.

Both codec versions store fp32 safetensors (one file, or shards + ``model.safetensors.index.json``)
and weight-normalised 1x1 convolutions in the quantizer (``parametrizations.weight.original0``
= g [out, 1, 1], ``original1`` = v [out, in, 1]; the older ``weight_g`` / ``weight_v`` also load).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


class AudioTokenizerError(ValueError):
    """A bad MOSS-Audio-Tokenizer checkpoint or option; the message names the file or option."""


class Checkpoint:
    """Name -> tensor over the safetensors files of a checkpoint directory (read lazily)."""

    def __init__(self, codec_dir: Path):
        from safetensors import safe_open

        self._safe_open = safe_open
        index = codec_dir / "model.safetensors.index.json"
        if index.is_file():
            files = sorted(
                {codec_dir / f for f in json.loads(index.read_text())["weight_map"].values()}
            )
        else:
            files = sorted(codec_dir.glob("*.safetensors"))
        if not files:
            raise AudioTokenizerError(f"no *.safetensors in {codec_dir} (config field: codec_dir)")
        self.where: dict[str, Path] = {}
        for f in files:
            if not f.is_file():
                raise AudioTokenizerError(f"{f} (listed in {index}) not found")
            with safe_open(str(f), framework="pt") as sf:
                for k in sf.keys():
                    self.where[k] = f
        self.files = files
        self._open: dict = {}

    def __contains__(self, key: str) -> bool:
        return key in self.where

    def get(self, key: str) -> torch.Tensor:
        f = self.where[key]
        if f not in self._open:
            self._open[f] = self._safe_open(str(f), framework="pt")
        return self._open[f].get_tensor(key).float()

    def describe(self) -> str:
        return ", ".join(str(f) for f in self.files)

    def close(self) -> None:
        self._open.clear()


def need(ck: Checkpoint, *names: str) -> str:
    """The first of ``names`` present in the checkpoint, else an error naming the files."""
    for n in names:
        if n in ck:
            return n
    also = f" (or {', '.join(repr(n) for n in names[1:])})" if names[1:] else ""
    raise AudioTokenizerError(
        f"MOSS-Audio-Tokenizer checkpoint {ck.describe()}: missing tensor {names[0]!r}{also}"
    )


def weight_normed(ck: Checkpoint, prefix: str) -> torch.Tensor:
    """A weight-normalised 1x1 conv's weight [out, in] (g * v / |v|, norm over dims 1..)."""
    if prefix + ".weight" in ck:
        w = ck.get(prefix + ".weight")
    else:
        g = ck.get(need(ck, prefix + ".parametrizations.weight.original0", prefix + ".weight_g"))
        v = ck.get(need(ck, prefix + ".parametrizations.weight.original1", prefix + ".weight_v"))
        w = g * v / v.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (v.dim() - 1)))
    return w.reshape(w.shape[0], -1)


def check_shape(ck: Checkpoint, key: str, t: torch.Tensor, shape: tuple) -> torch.Tensor:
    if tuple(t.shape) != tuple(shape):
        where = ck.where.get(key) or ck.where.get(key + ".bias") or ck.describe()
        raise AudioTokenizerError(
            f"MOSS-Audio-Tokenizer checkpoint {where}: {key} has shape "
            f"{tuple(t.shape)}, config.json says {tuple(shape)}"
        )
    return t
