"""bestofn.ops.pcm_diff: B's takes against A's, as audio (the decode dials' `bestofn ab` rows)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from bestofn.ops.ab import Threshold
from bestofn.ops.pcm_diff import pcm_rows, take_diffs


def test_take_diffs_measure_noise_and_clicks():
    rng = np.random.default_rng(0)
    a = (0.1 * rng.standard_normal((4800, 2))).astype(np.float32)
    same = take_diffs(a, a)
    assert same == {"pcm_mean_abs_diff": 0.0, "pcm_max_abs_diff": 0.0, "pcm_rel_rms_diff": 0.0}
    noisy = a + 0.001 * rng.standard_normal(a.shape).astype(np.float32)
    d = take_diffs(a, noisy)
    assert d["pcm_rel_rms_diff"] == pytest.approx(0.01, rel=0.05)  # SNR 40 dB
    click = a.copy()
    click[100, 0] += 0.5
    assert take_diffs(a, click)["pcm_max_abs_diff"] == pytest.approx(0.5, abs=1e-6)


def test_rows_match_takes_by_path_and_apply_thresholds(tmp_path):
    rng = np.random.default_rng(1)
    for side, scale in (("A", 0.0), ("B", 0.01)):
        for take in range(2):
            d = tmp_path / side / "groups" / "calm" / "p1" / "takes"
            d.mkdir(parents=True, exist_ok=True)
            x = 0.2 * np.sin(np.arange(2400) / 7.0 + take)[:, None].repeat(2, 1)
            x += scale * rng.standard_normal(x.shape)
            sf.write(d / f"{take:03d}.flac", x.astype(np.float32), 48000, subtype="PCM_24")
    th = {"pcm_mean_abs_diff": Threshold("pcm_mean_abs_diff", "max_increase", 0.001)}
    rows = {r["metric"]: r for r in pcm_rows(tmp_path / "A", tmp_path / "B", th)}
    assert rows["pcm_mean_abs_diff"]["n_pairs"] == 2
    assert rows["pcm_mean_abs_diff"]["b"] == pytest.approx(0.008, rel=0.1)  # 0.01 * sqrt(2/pi)
    assert rows["pcm_mean_abs_diff"]["verdict"] == "FAIL"
    assert rows["pcm_rel_rms_diff"]["verdict"] == "info"
