"""Embedded default restorers: pass-through and high-quality resampling (soxr)."""

from __future__ import annotations

import numpy as np

from bestofn.audio import resample
from bestofn.backends.base import Restorer


class IdentityRestorer(Restorer):
    name = "identity"

    def __init__(self, device: str = "cpu"):
        pass

    def restore(self, audios: list[np.ndarray], sample_rate: int):
        return list(audios), sample_rate


class ResampleRestorer(Restorer):
    """Resample every take to ``sample_rate`` (e.g. to match a production restorer's rate)."""

    name = "resample"

    def __init__(self, device: str = "cpu", sample_rate: int = 48000):
        if int(sample_rate) <= 0:
            raise ValueError(f"resample: sample_rate must be positive, got {sample_rate}")
        self.sample_rate = int(sample_rate)

    def restore(self, audios: list[np.ndarray], sample_rate: int):
        return [resample(a, sample_rate, self.sample_rate) for a in audios], self.sample_rate

    def provenance(self) -> dict:
        return {"backend": self.name, "sample_rate": self.sample_rate, "library": "soxr HQ"}
