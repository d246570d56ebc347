"""Loudness of a take as stored: mean RMS and peak level in dBFS (full scale = 1.0).

LAION's voice-acting recipe scores "volume: mean-RMS dBFS + peak dBFS" per take beside ASR and
VoiceCLAP (LAION-AI/laion-moss-local-1.5-voice-acting-4.55b SYNTHETIC_DATA_RECIPE.md section 5;
docs/notes/recipes.md). Its use here: a shouted take that clipped has ``vol_peak_db`` at or
above 0 (the FLAC's integer samples stop at full scale), and a near-silent one a low
``vol_rms_db``; both are columns a selection filter can name, e.g. ``vol_peak_db < -0.1``.

- ``vol_rms_db``: 10 log10 of the mean square over every sample of every channel (the RMS of
  the whole take).
- ``vol_peak_db``: 20 log10 of the largest absolute sample.
- Silence (or an empty take) is floored at SILENCE_DB, so the columns stay finite.
"""

from __future__ import annotations

import numpy as np

from bestofn.backends.base import Scorer
from bestofn.util.spec import GroupSpec

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {"volume": {"role": "scorer", "class": "VolumeScorer", "parallel_build": True}}

SILENCE_DB = -120.0  # floor of both columns: a digital-silence take


def _db(power: float) -> float:
    return max(SILENCE_DB, 10.0 * np.log10(power)) if power > 0 else SILENCE_DB


def levels(audio: np.ndarray) -> tuple[float, float]:
    """(mean-RMS dBFS, peak dBFS) of one take, frames[, channels]."""
    x = np.asarray(audio, dtype=np.float64)
    if x.size == 0:
        return SILENCE_DB, SILENCE_DB
    return _db(float(np.mean(x * x))), _db(float(np.max(np.abs(x))) ** 2)


class VolumeScorer(Scorer):
    name = "volume"
    table_weights = "–"
    table_options = (
        "columns `vol_rms_db` (10 log10 of the mean square of every sample: the take's RMS in "
        "dBFS), `vol_peak_db` (the largest absolute sample in dBFS; a clipped take reaches "
        "0); silence floored at -120"
    )
    columns = {"vol_rms_db": "DOUBLE", "vol_peak_db": "DOUBLE"}

    def __init__(self, device: str = "cpu"):
        pass

    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec):
        rms, peak = zip(*(levels(a) for a in audios), strict=True) if audios else ((), ())
        return {"vol_rms_db": list(rms), "vol_peak_db": list(peak)}
