"""What one group is: the unit of generation, scoring, writing and resuming."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


def take_seed(group_id: str, take: int, base_seed: int = 0) -> int:
    """Seed of one take, derived only from (base seed, group id, take index).

    A take is therefore reproducible whatever batch it was generated in and whatever
    the batch size was. 63 bits so it fits torch/numpy generators and int64 columns.
    """
    digest = hashlib.blake2b(f"{base_seed}:{group_id}:{take}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class GroupSpec:
    """Everything that determines a group's takes (and nothing that only affects speed)."""

    emotion: str
    prompt_id: str
    text: str
    n_takes: int
    base_seed: int = 0
    reference_audio: str | None = None  # path to the group's reference voice, if any
    emotion_description: str = ""  # natural-language direction, e.g. for prompt similarity
    negative_description: str = ""  # optional text to subtract in prompt similarity
    language: str = "en"
    extra: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def group_id(self) -> str:
        return f"{self.emotion}/{self.prompt_id}"

    def seeds(self) -> list[int]:
        return [take_seed(self.group_id, t, self.base_seed) for t in range(self.n_takes)]
