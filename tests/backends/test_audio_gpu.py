"""The scorers' GPU resampler (``bestofn.backends.scorer_input``) against soxr, on the CPU (the
same torch
code as on CUDA), and the ``runtime.resampler`` option from config to the pipeline."""

from __future__ import annotations

import numpy as np
import pytest

from bestofn.backends.base import resolve_resampler
from bestofn.backends.scorer_input import resample_batch
from bestofn.backends.scorer_input import scorer_input as mono_at

pytest.importorskip("torch")

EDGE_S = 0.02  # the first and last 20 ms: soxr's edge handling differs from the FIR's
PASSBAND_SNR_DB = 90.0  # measured over 100 dB for 48/24 -> 16 kHz, tones up to 0.8 x 8 kHz
PASSBAND_MAX_ABS = 1e-5  # measured ~1e-6
EDGE_MAX_ABS = 1e-2  # measured ~5e-3


def _tones(sr, seconds, top_hz, seed, stereo=True):
    """Twelve tones below ``top_hz``, stereo (right at half level) or mono, float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    x = sum(0.1 * np.sin(2 * np.pi * f * t + 6 * rng.random()) for f in rng.uniform(50, top_hz, 12))
    return (np.stack([x, 0.5 * x], axis=1) if stereo else x).astype(np.float32)


@pytest.mark.parametrize("sr_in", [48000, 24000])
def test_matches_soxr_in_the_passband(sr_in):
    """Tones up to 0.8 of the 16 kHz Nyquist, takes of different lengths in one batch, stereo
    and mono: the same lengths as soxr, SNR >= 90 dB and max |diff| <= 1e-5 against soxr away
    from the edges, <= 1e-2 at them."""
    takes = [_tones(sr_in, s, 0.8 * 8000, i, stereo=i != 1) for i, s in enumerate((2.0, 1.0, 0.3))]
    ours = mono_at(takes, sr_in, 16000, "torch", "cpu")
    ref = mono_at(takes, sr_in, 16000, "soxr", "cpu")
    edge = int(EDGE_S * 16000)
    for y, r in zip(ours, ref, strict=True):
        assert y.dtype == np.float32 and y.shape == r.shape
        d = (y - r)[edge:-edge]
        snr = 10 * np.log10(np.sum(r[edge:-edge] ** 2) / np.sum(d**2))
        assert snr >= PASSBAND_SNR_DB, snr
        assert np.abs(d).max() <= PASSBAND_MAX_ABS
        assert np.abs(y - r).max() <= EDGE_MAX_ABS


def test_stops_what_is_above_the_new_nyquist():
    """A 12 kHz tone at 48 kHz has no place at 16 kHz: it comes out below -60 dB (soxr's too)."""
    t = np.arange(48000) / 48000
    x = (0.5 * np.sin(2 * np.pi * 12000 * t)).astype(np.float32)
    (y,) = resample_batch([x], 48000, 16000, "cpu")
    assert 20 * np.log10(np.abs(y[320:-320]).max() / 0.5) < -60


def test_same_rate_and_empty():
    x = _tones(16000, 0.5, 4000, 0)
    (y,) = resample_batch([x], 16000, 16000, "cpu")
    np.testing.assert_allclose(y, (x[:, 0] + x[:, 1]) * 0.5, rtol=0, atol=1e-7)
    assert resample_batch([], 48000, 16000, "cpu") == []


def test_resampler_option_defaults_and_errors():
    assert resolve_resampler(None, "cpu") == resolve_resampler("auto", "cpu") == "soxr"
    assert resolve_resampler(None, "cuda") == resolve_resampler("auto", "cuda:1") == "torch"
    assert resolve_resampler("torch", "cpu") == "torch"
    with pytest.raises(ValueError, match="runtime.resampler must be one of auto, soxr, torch"):
        resolve_resampler("sinc", "cpu")


def test_runtime_resampler_reaches_the_scorer_and_its_provenance():
    """Through the registry, as the worker builds scorers from config: the scorer carries the
    resolved resampler and says so in its provenance; the config check knows the key."""
    from bestofn.backends.registry import backend_class, build

    s = build("scorer", "duration", {"resampler": "torch"})
    assert s.resampler == "torch" and s.provenance()["resampler"] == "torch"
    assert build("scorer", "duration", {}).provenance()["resampler"] == "soxr"  # CPU default
    s.resampler = "soxr"  # what a bench variant sets: the rows must name the one that ran
    assert s.provenance()["resampler"] == "soxr"
    assert "resampler" in backend_class("scorer", "duration").known_options()
    assert "resampler" not in backend_class("restorer", "identity").known_options()


def test_score_stage_resamples_once_per_rate_and_resampler():
    """The pipeline's score stage hands each scorer its input from the resampler it asks for;
    scorers asking for the same (rate, resampler) share one resample."""
    from datetime import UTC, datetime

    from bestofn.backends.base import Scorer
    from bestofn.core.pipeline import GroupWork, StageTimer, score_stage
    from bestofn.util.spec import GroupSpec

    class Recorder(Scorer):
        input_sample_rate = 16000
        columns = {}

        def __init__(self, name, resampler):
            self.name, self.resampler, self.seen = name, resampler, None

        def score(self, audios, sample_rate, spec):
            self.seen = audios
            return {}

    class B:  # the fields score_stage reads of bestofn.core.pipeline.Backends
        cpu_threads = 1

    b = B()
    b.scorers = [Recorder("a", "torch"), Recorder("b", "soxr"), Recorder("c", "torch")]
    spec = GroupSpec(emotion="calm", prompt_id="p1", text="hi", n_takes=2)
    work = GroupWork(spec, "cpu", datetime.now(UTC), StageTimer("cpu"))
    work.audios, work.sr = [_tones(48000, 0.5, 6000, 0), _tones(48000, 0.4, 6000, 1)], 48000
    score_stage(work, b)
    a, s, c = (x.seen for x in b.scorers)
    assert a is c  # shared
    ref = mono_at(work.audios, 48000, 16000, "soxr")
    assert all(np.array_equal(x, y) for x, y in zip(s, ref, strict=True))
    torch_ref = mono_at(work.audios, 48000, 16000, "torch", "cpu")
    assert all(np.array_equal(x, y) for x, y in zip(a, torch_ref, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, s, strict=True))
