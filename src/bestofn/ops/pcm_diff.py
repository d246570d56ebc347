"""How far B's takes are from A's as audio, take by take: the `bestofn ab` rows of a decode dial
(codec dtype), where the codes are the same on both sides and only the samples differ.

Per matched take (same group, same take index, so the same seed and codes), from the FLACs both
sides wrote: the mean |B - A| (full scale 1), the largest |B - A| (a click), and the RMS of
B - A relative to A's RMS (0.056 is an SNR of 25 dB). Each row's A value is 0 (A against
itself), its B value the mean over takes, and a threshold ``{max_increase: x}`` bounds it. Takes
whose lengths differ are compared over the shorter length and counted in the note.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

METRICS = {
    "pcm_mean_abs_diff": "mean |B - A| per sample, full scale 1, averaged over takes",
    "pcm_max_abs_diff": "largest |B - A| of a take (a click), averaged over takes",
    "pcm_rel_rms_diff": "RMS(B - A) / RMS(A) per take (0.056 = SNR 25 dB), averaged",
}


def take_diffs(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    n = min(len(a), len(b))
    a, b = a[:n].astype(np.float64), b[:n].astype(np.float64)
    if n == 0:
        return dict.fromkeys(METRICS, 0.0)
    d = np.abs(b - a)
    rms_a = math.sqrt(float((a**2).mean()))
    rel = math.sqrt(float((d**2).mean())) / rms_a if rms_a > 0 else float(d.max() > 0)
    return {
        "pcm_mean_abs_diff": float(d.mean()),
        "pcm_max_abs_diff": float(d.max()),
        "pcm_rel_rms_diff": rel,
    }


def pcm_rows(dir_a: Path, dir_b: Path, thresholds: dict) -> list[dict]:
    """Rows (as `bestofn.ops.ab`'s) over the takes under ``dir_a`` / ``dir_b`` (the two sides'
    ``groups/<emotion>/<prompt>/takes/*.flac``, matched by relative path)."""
    import soundfile as sf

    takes_a = {p.relative_to(dir_a): p for p in sorted(Path(dir_a).glob("groups/*/*/takes/*.flac"))}
    sums = dict.fromkeys(METRICS, 0.0)
    n = unequal = 0
    for rel, path_a in takes_a.items():
        path_b = Path(dir_b) / rel
        if not path_b.is_file():
            continue
        a, _ = sf.read(path_a, dtype="float32", always_2d=True)
        b, _ = sf.read(path_b, dtype="float32", always_2d=True)
        unequal += a.shape != b.shape
        for k, v in take_diffs(a, b).items():
            sums[k] += v
        n += 1
    rows = []
    for metric, what in METRICS.items():
        t = thresholds.get(metric)
        value = sums[metric] / n if n else math.nan
        note = what + (f"; {unequal} take(s) differ in length" if unequal else "")
        rows.append(
            {
                "metric": metric,
                "kind": "quality",
                "a": 0.0,
                "b": value,
                "delta": value,
                "rule": t.rule if t else "",
                "limit": t.limit if t else None,
                "verdict": ("PASS" if t.passes(value) else "FAIL") if t else "info",
                "n_pairs": n,
                "note": note if n else "no matched takes",
            }
        )
    return rows
