"""Duration and pacing: audio seconds and spoken words per second."""

from __future__ import annotations

import numpy as np

from bestofn.backends.base import Scorer
from bestofn.util.spec import GroupSpec

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {"duration": {"role": "scorer", "class": "DurationScorer", "parallel_build": True}}


class DurationScorer(Scorer):
    name = "duration"
    table_weights = "–"
    table_options = "columns `words_per_s`, `n_words`"
    columns = {"words_per_s": "DOUBLE", "n_words": "BIGINT"}

    def __init__(self, device: str = "cpu"):
        pass

    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec):
        n_words = len(spec.text.split())
        seconds = [a.shape[0] / sample_rate for a in audios]
        return {
            "words_per_s": [n_words / s if s > 0 else 0.0 for s in seconds],
            "n_words": [n_words] * len(audios),
        }
