"""Backends that misbehave on purpose, for tests of the worker contract and the take checks.

Name them in a config by import path (config/README.md, "Your own backends"):

    scorers:
      - backend: lab.faults:FatalOnceScorer
        options: {marker: fault.marker, group: calm/p1}

- ``FatalOnceScorer`` raises the message of a CUDA error that leaves the device unusable
  (default ``RuntimeError("CUDA error: an illegal memory access was encountered")``) the first
  time it scores ``group`` (any group if unset), and only while its ``marker`` file does not
  exist: it creates the marker (``{"pid": ..., "group_id": ...}``) before raising, so the retry
  of that group (on a fresh worker) scores normally and a test can read which pid failed.
- ``ScriptedGenerator`` renders tones without any model, and makes chosen takes empty (the
  stop head fired at frame 0) or cut by the frame budget, with the take meta a real generator
  fills (``n_frames``, ``truncated``, ``stop_reason``).
- ``FatalOnceGenerator``: a ``ScriptedGenerator`` whose first render raises a device error
  (marker file as ``FatalOnceScorer``), for the speech service's fatal-error path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from bestofn.backends.base import Generator, Scorer, Take
from bestofn.util.spec import GroupSpec

MESSAGES = {
    # what torch raises after an illegal address (torch.AcceleratorError since 2.8)
    "illegal-address": "CUDA error: an illegal memory access was encountered",
    "device-assert": "CUDA error: device-side assert triggered",
    # the caching allocator's message: recoverable, the worker keeps serving
    "oom": "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 139.81 GiB total capacity)",
}


class FatalOnceScorer(Scorer):
    name = "fatal-once"
    columns = {"fault_free": "BOOLEAN"}

    def __init__(
        self,
        device: str = "cpu",
        marker: str = "fault.marker",
        group: str | None = None,
        error: str = "illegal-address",
    ):
        if error not in MESSAGES:
            raise ValueError(f"fatal-once: error must be one of {sorted(MESSAGES)}, got {error!r}")
        self.marker, self.group, self.error = Path(marker), group, error

    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec):
        if self.group in (None, spec.group_id):
            try:
                with open(self.marker, "x") as f:  # exclusive: exactly one failure
                    json.dump({"pid": os.getpid(), "group_id": spec.group_id}, f)
            except FileExistsError:
                pass
            else:
                raise RuntimeError(MESSAGES[self.error])
        return {"fault_free": [True] * len(audios)}

    def provenance(self) -> dict:
        return {"backend": self.name, "marker": str(self.marker), "group": self.group}


class ScriptedGenerator(Generator):
    """Tones of ``seconds`` at ``sample_rate`` (``channels`` 1 or 2), one pitch per seed.

    ``empty_takes``: take indices that come back with no audio (``stop_reason`` 'empty', 0
    frames); ``truncated_takes``: takes cut by the frame budget ('budget'). Frames are counted
    at ``frame_rate`` (12.5 Hz, as MOSS)."""

    name = "scripted"

    def __init__(
        self,
        device: str = "cpu",
        sample_rate: int = 16000,
        seconds: float = 0.5,
        channels: int = 1,
        frame_rate: float = 12.5,
        empty_takes: list[int] | None = None,
        truncated_takes: list[int] | None = None,
    ):
        self.sample_rate, self.seconds, self.channels = int(sample_rate), seconds, int(channels)
        self.frame_rate = frame_rate
        self.empty, self.cut = set(empty_takes or ()), set(truncated_takes or ())

    def generate(self, spec: GroupSpec) -> list[Take]:
        n = int(round(self.seconds * self.sample_rate))
        t = np.arange(n, dtype=np.float32) / self.sample_rate
        takes = []
        for i, seed in enumerate(spec.seeds()):
            if i in self.empty:
                audio, frames, reason = np.zeros(0, np.float32), 0, "empty"
            else:
                pitch = 120.0 + (seed % 200)
                audio = (0.3 * np.sin(2 * np.pi * pitch * t)).astype(np.float32)
                frames = int(round(self.seconds * self.frame_rate))
                reason = "budget" if i in self.cut else "eos"
            if self.channels == 2:
                audio = np.stack([audio, audio], axis=1)
            meta = {"n_frames": frames, "truncated": reason == "budget", "stop_reason": reason}
            takes.append(Take(audio, seed, meta))
        return takes

    def provenance(self) -> dict:
        return {"backend": self.name, "sample_rate": self.sample_rate, "seconds": self.seconds}


class FatalOnceGenerator(ScriptedGenerator):
    """``ScriptedGenerator`` that raises a device error (``error``, as ``FatalOnceScorer``) on
    its first render while ``marker`` does not exist (it creates the marker, with its pid,
    first): the speech service's fatal-error path, without a GPU."""

    name = "fatal-once-generator"

    def __init__(
        self,
        device: str = "cpu",
        marker: str = "fault.marker",
        error: str = "illegal-address",
        sample_rate: int = 16000,
        seconds: float = 0.5,
    ):
        if error not in MESSAGES:
            raise ValueError(f"fatal-once: error must be one of {sorted(MESSAGES)}, got {error!r}")
        super().__init__(device, sample_rate=sample_rate, seconds=seconds)
        self.marker, self.error = Path(marker), error

    def generate(self, spec: GroupSpec) -> list[Take]:
        try:
            with open(self.marker, "x") as f:
                json.dump({"pid": os.getpid(), "group_id": spec.group_id}, f)
        except FileExistsError:
            return super().generate(spec)
        raise RuntimeError(MESSAGES[self.error])
