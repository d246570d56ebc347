"""DNSMOS scorer: the numbers of speechmos' reference, with bounded ONNX Runtime calls."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("speechmos")

from bestofn.backends import dnsmos  # noqa: E402

SR = 16000
COLUMNS = {"dnsmos_sig": "sig_mos", "dnsmos_bak": "bak_mos", "dnsmos_ovrl": "ovrl_mos"}
COLUMNS["dnsmos_p808"] = "p808_mos"


def _take(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    tone = 0.3 * np.sin(2 * np.pi * (140 + 40 * seed) * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2
    return (tone + 0.03 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.fixture(scope="module")
def scorers():
    return dnsmos.DNSMOSScorer(), dnsmos.DNSMOSScorer(share_frames=False)


def test_window_starts_are_the_reference_windows():
    # 1 s hops; the reference drops hops 7..23 (a float-rounded slice one sample short)
    assert dnsmos.window_starts(int(9.6 * SR)) == [0]
    assert dnsmos.window_starts(12 * SR) == [0, 1, 2]
    assert dnsmos.window_starts(int(17.6 * SR)) == list(range(7))
    assert dnsmos.window_starts(40 * SR) == [*range(7), *range(24, 31)]
    # a 3 s take is doubled to 12 s, a 0.3 s take to 9.6 s
    assert dnsmos.looped(np.ones(3 * SR)).size == 12 * SR
    assert dnsmos.looped(np.ones(int(0.3 * SR))).size == int(0.3 * SR) * 32


@pytest.mark.slow
def test_matches_speechmos_reference(scorers):
    """Takes of 1 window (0.3 s, looped to 9.6 s), 3 windows (3.1 s) and 7 windows with the
    reference's skipped hops (4.4 s, looped to 17.6 s): both paths give speechmos' numbers."""
    from speechmos import dnsmos as reference

    takes = [_take(s, i) for i, s in enumerate((0.3, 3.1, 4.4))]
    ref = [reference.run(t, SR) for t in takes]
    for scorer in scorers:
        got = scorer.score(takes, SR, None)
        for col, key in COLUMNS.items():
            np.testing.assert_allclose(
                got[col], [r[key] for r in ref], rtol=0, atol=1e-5, err_msg=col
            )


class _Recorder:
    def __init__(self, session, calls):
        self.session, self.calls = session, calls

    def run(self, outputs, feeds):
        (x,) = feeds.values()
        self.calls.append(x.shape)
        return self.session.run(outputs, feeds)


def test_every_onnx_call_is_bounded(monkeypatch):
    """However many takes and windows a group has, one ONNX Runtime call sees at most
    ``batch_windows`` windows, and the shared convolutions at most one window's rows (plus
    the halo): the arena, which keeps its peak, stays small."""
    scorer = dnsmos.DNSMOSScorer(batch_windows=2)
    calls: dict[str, list] = {}
    for name in ("spec", "stem", "head", "p808"):
        calls[name] = []
        monkeypatch.setattr(scorer, name, _Recorder(getattr(scorer, name), calls[name]))
    takes = [_take(3.1, 0), _take(12.5, 1), np.zeros(0, np.float32), _take(1.0, 2)]
    out = scorer.score(takes, SR, None)
    assert all(len(v) == 4 and np.isfinite(v).all() for v in out.values())
    # 3.1 s and 12.5 s: 3 windows each; empty and 1 s takes are looped to 16 s: 7 each
    assert sum(s[0] for s in calls["head"]) == sum(s[0] for s in calls["p808"]) == 3 + 3 + 7 + 7
    assert all(s[0] <= 2 for shapes in calls.values() for s in shapes)
    assert max(s[2] for s in calls["stem"]) <= dnsmos.TILE + 2 * dnsmos.HALO


def test_bad_batch_windows_is_refused():
    with pytest.raises(ValueError, match="batch_windows"):
        dnsmos.DNSMOSScorer(batch_windows=0)
