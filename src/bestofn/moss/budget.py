"""Frame budget of a MOSS take: how many audio frames generation may run before it is cut.

MOSS-TTS-Local emits one frame (12 codebook tokens) every 80 ms (12.5 frames/s), so the
budget is counted in frames and passed as ``max_new_tokens`` to the generator:

    budget = clamp(ceil(words * frames_per_word + pause_frames), min_frames, max_frames)

- ``frames_per_word`` (default 6.0) is a quality/cost dial, not a speaking rate: 6.0 frames
  per word allows 12.5 / 6.0 ~ 2.1 words/s, which leaves room for slow, emotional reads;
  4.2 (~3 words/s) truncates most takes. A take that has not produced its end token when the
  budget runs out is cut there (and will usually fail WER), so a low value saves GPU time by
  giving up on runaway takes early.
- ``min_frames`` (default 25 = 2 s) keeps one-word prompts ("No!") from getting a budget
  too short for a breath and the word.
- ``max_frames`` (default 1500 = 120 s) bounds the batch: every take of a batch waits for
  the slowest, so one runaway take must not hold 63 finished ones for minutes.
- Words: whitespace-separated tokens that contain a letter or digit; in scripts written
  without spaces (CJK, kana, hangul) every character counts as a word.
- ``[pause 1.5s]`` markers (MOSS v1.5 explicit pause syntax) add their duration in frames.

Both MOSS backends (moss-hf and moss-fast) read the budget from here with the same config
keys, so a take's length limit does not depend on which engine made it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

FRAME_RATE_HZ = 12.5
DEFAULT_FRAMES_PER_WORD = 6.0
DEFAULT_MIN_FRAMES = 25
DEFAULT_MAX_FRAMES = 1500

# CJK ideographs, kana, hangul: scripts written without spaces between words.
_NO_SPACE_CHARS = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_PAUSE = re.compile(r"\[pause\s+(\d+(?:\.\d+)?)\s*s\]", re.IGNORECASE)


def count_words(text: str) -> int:
    """Words in ``text``; each character of a no-space script counts as one word."""
    text = _PAUSE.sub(" ", text)
    n_chars = len(_NO_SPACE_CHARS.findall(text))
    rest = _NO_SPACE_CHARS.sub(" ", text)
    n_words = sum(1 for tok in rest.split() if any(c.isalnum() for c in tok))
    return n_words + n_chars


def pause_seconds(text: str) -> float:
    return sum(float(s) for s in _PAUSE.findall(text))


@dataclass(frozen=True)
class FrameBudget:
    frames_per_word: float = DEFAULT_FRAMES_PER_WORD
    min_frames: int = DEFAULT_MIN_FRAMES
    max_frames: int = DEFAULT_MAX_FRAMES
    frame_rate: float = FRAME_RATE_HZ

    def __post_init__(self):
        if not self.frames_per_word > 0:
            raise ValueError(f"frames_per_word must be > 0, got {self.frames_per_word}")
        if not 1 <= self.min_frames <= self.max_frames:
            raise ValueError(
                f"need 1 <= min_frames <= max_frames, got {self.min_frames}, {self.max_frames}"
            )

    @classmethod
    def from_options(cls, options: dict) -> FrameBudget:
        """Build from backend config options (keys: frames_per_word, min_frames, max_frames)."""
        return cls(
            frames_per_word=float(options.get("frames_per_word", DEFAULT_FRAMES_PER_WORD)),
            min_frames=int(options.get("min_frames", DEFAULT_MIN_FRAMES)),
            max_frames=int(options.get("max_frames", DEFAULT_MAX_FRAMES)),
        )

    def frames(self, text: str) -> int:
        raw = count_words(text) * self.frames_per_word + pause_seconds(text) * self.frame_rate
        return max(self.min_frames, min(self.max_frames, math.ceil(raw)))

    def as_dict(self) -> dict:
        return {
            "frames_per_word": self.frames_per_word,
            "min_frames": self.min_frames,
            "max_frames": self.max_frames,
        }


def frame_budget(
    text: str,
    frames_per_word: float = DEFAULT_FRAMES_PER_WORD,
    min_frames: int = DEFAULT_MIN_FRAMES,
    max_frames: int = DEFAULT_MAX_FRAMES,
) -> int:
    """Functional shortcut for ``FrameBudget(...).frames(text)``."""
    return FrameBudget(frames_per_word, min_frames, max_frames).frames(text)
