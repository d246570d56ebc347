"""The pacing dial of a MOSS take: the ``tokens`` hint the prompt carries, and the frame budget
(``max_new_tokens``) generation may run before it is cut.

MOSS-TTS emits one frame (12 codebook tokens Local, 32 Delay) every 80 ms (12.5 frames/s). LAION's
voice-acting recipe (LAION-AI/laion-moss-local-1.5-voice-acting-4.55b SYNTHETIC_DATA_RECIPE.md
section 1, "Prompting rules"; docs/notes/recipes.md) uses the frame count two ways:

    tokens = clamp(ceil(words * frames_per_word + pause_frames), min_tokens, max_tokens)
    budget = clamp(floor(budget_scale * tokens + budget_offset), min_frames, max_frames)

- ``tokens`` goes into the prompt's ``- Tokens:`` field, the published processor's ``tokens``
  input (the model cards' duration control): a *pacing hint*. ``frames_per_word`` 6.0 asks for
  about 12.5 / 6.0 ~ 2.1 words/s, room for slow, emotional reads; the recipe measured 4.2
  forcing a rushed pace. ``tokens_hint: false`` leaves the field "None" (the budget is still
  counted from ``tokens``).
- ``budget`` is ``max_new_tokens``: far above the hint (2.2 x + 300 frames), so a take that
  follows the hint ends on its own stop token; one that has not stopped by then is a runaway and
  is cut (``truncated``).
- ``min_frames`` / ``max_frames`` clamp the budget itself (defaults 1 and none): a cap bounds the
  batch (every take of a batch waits for the slowest) and keeps CPU tests short.
- Words: whitespace-separated tokens that contain a letter or digit; in scripts written
  without spaces (CJK, kana, hangul) every character counts as a word.
- ``[pause 1.5s]`` markers (MOSS v1.5 explicit pause syntax) add their duration in frames.

Both MOSS backends (moss-hf and moss-fast), Local and Delay, read the dial from here with the
same options, whose defaults are written once, in the config schema (``$defs.moss_pacing``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from functools import cache

FRAME_RATE_HZ = 12.5
PACING_OPTIONS = ("frames_per_word", "min_tokens", "max_tokens", "budget_scale",
                  "budget_offset", "min_frames", "max_frames", "tokens_hint")  # fmt: skip

# CJK ideographs, kana, hangul: scripts written without spaces between words.
_NO_SPACE_CHARS = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_PAUSE = re.compile(r"\[pause\s+(\d+(?:\.\d+)?)\s*s\]", re.IGNORECASE)


@cache
def pacing_defaults() -> dict:
    """The pacing options' defaults, as the config schema declares them (``$defs.moss_pacing``).
    Shared: do not modify."""
    from bestofn.schemas import schema

    props = schema("config")["$defs"]["moss_pacing"]["properties"]
    return {key: props[key]["default"] for key in PACING_OPTIONS}


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
    """The pacing dial; a field left None takes the schema's default."""

    frames_per_word: float | None = None
    min_tokens: int | None = None
    max_tokens: int | None = None
    budget_scale: float | None = None
    budget_offset: float | None = None
    min_frames: int | None = None
    max_frames: int | None = None  # None (after defaults): no cap
    tokens_hint: bool | None = None
    frame_rate: float = FRAME_RATE_HZ

    def __post_init__(self):
        defaults = pacing_defaults()
        for f in fields(self):
            if f.name in defaults and getattr(self, f.name) is None:
                object.__setattr__(self, f.name, defaults[f.name])
        if not self.frames_per_word > 0:
            raise ValueError(f"frames_per_word must be > 0, got {self.frames_per_word}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"need 1 <= min_tokens <= max_tokens, got {self.min_tokens}, {self.max_tokens}"
            )
        if not (self.budget_scale > 0 and self.budget_offset >= 0):
            raise ValueError(
                f"need budget_scale > 0 and budget_offset >= 0, got {self.budget_scale}, "
                f"{self.budget_offset}"
            )
        if not 1 <= self.min_frames <= (self.max_frames or self.min_frames):
            raise ValueError(
                f"need 1 <= min_frames <= max_frames, got {self.min_frames}, {self.max_frames}"
            )

    @classmethod
    def from_options(cls, options: dict) -> FrameBudget:
        """Build from backend config options (the keys of PACING_OPTIONS; missing or None: the
        schema's default)."""
        return cls(**{key: options.get(key) for key in PACING_OPTIONS})

    def tokens(self, text: str) -> int:
        """The pacing hint: expected frames of ``text``, clamped."""
        raw = count_words(text) * self.frames_per_word + pause_seconds(text) * self.frame_rate
        return max(self.min_tokens, min(self.max_tokens, math.ceil(raw)))

    def hint(self, text: str) -> int | None:
        """What the prompt's Tokens field carries: the hint, or None with ``tokens_hint`` off."""
        return self.tokens(text) if self.tokens_hint else None

    def frames(self, text: str) -> int:
        """The frame budget (``max_new_tokens``) of a take of ``text``."""
        # floor: the shortest hint, 96 frames, gets 2.2 x 96 + 300 = 511.2 -> 511 frames
        budget = math.floor(self.budget_scale * self.tokens(text) + self.budget_offset)
        budget = max(self.min_frames, budget)
        return budget if self.max_frames is None else min(self.max_frames, budget)

    def as_dict(self) -> dict:
        return {key: getattr(self, key) for key in PACING_OPTIONS}


def frame_budget(text: str, **options) -> int:
    """Functional shortcut for ``FrameBudget(**options).frames(text)``."""
    return FrameBudget(**options).frames(text)
