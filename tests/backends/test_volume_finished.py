"""The volume scorer's levels (a clipped take shows in vol_peak_db, and a selection filter can
drop it) and the ASR scorers' ``finished`` flag (the text's last words in the transcript's
tail)."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from bestofn.backends.registry import build
from bestofn.backends.volume import SILENCE_DB, levels
from bestofn.util.spec import GroupSpec
from bestofn.util.textnorm import asr_columns, finished


def test_levels_of_known_signals():
    sr = 48000
    t = np.arange(sr) / sr
    sine = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    rms, peak = levels(sine)
    assert rms == pytest.approx(20 * np.log10(0.5 / np.sqrt(2)), abs=1e-3)  # -9.03 dBFS
    assert peak == pytest.approx(20 * np.log10(0.5), abs=1e-3)  # -6.02 dBFS
    stereo = np.stack([sine, sine], axis=1)  # every channel counts
    assert levels(stereo) == pytest.approx((rms, peak))
    assert levels(np.zeros(100, np.float32)) == (SILENCE_DB, SILENCE_DB)
    assert levels(np.zeros(0, np.float32)) == (SILENCE_DB, SILENCE_DB)


def test_a_clipped_take_is_visible_in_selection():
    scorer = build("scorer", "volume")
    quiet = np.full(4800, 0.1, np.float32)
    clipped = np.clip(np.linspace(-3, 3, 4800, dtype=np.float32), -1, 1)
    cols = scorer.score([quiet, clipped], 48000, GroupSpec("calm", "p1", "Hi.", n_takes=2))
    assert set(cols) == set(scorer.columns) == {"vol_rms_db", "vol_peak_db"}
    assert cols["vol_peak_db"][0] == pytest.approx(-20.0, abs=1e-4)
    assert cols["vol_peak_db"][1] == pytest.approx(0.0, abs=1e-6)
    con = duckdb.connect()
    con.execute("CREATE TABLE takes (take INT, vol_rms_db DOUBLE, vol_peak_db DOUBLE)")
    rows = [(i, cols["vol_rms_db"][i], cols["vol_peak_db"][i]) for i in range(2)]
    con.executemany("INSERT INTO takes VALUES (?, ?, ?)", rows)
    passing = con.execute("SELECT take FROM takes WHERE vol_peak_db < -0.1").fetchall()
    assert passing == [(0,)]


@pytest.mark.parametrize(
    ("text", "transcript", "want"),
    [
        ("I told you to leave. Now go away!", "i told you to leave now go away", True),
        ("I told you to leave. Now go away!", "I told you to leave. Now go away! Uh, hm.", True),
        ("I told you to leave. Now go away!", "I told you to leave now", False),  # cut
        ("I told you to leave. Now go away!", "told you go away now", False),  # out of order
        ("Nine lives.", "9 lives", True),  # normalised both sides
        ("Hi!", "", False),
        ("", "anything", True),
    ],
)
def test_finished_is_the_texts_last_words_in_the_transcripts_tail(text, transcript, want):
    assert finished(text, transcript) is want


def test_asr_columns_carry_finished_beside_wer():
    cols = asr_columns("We will win this.", ["we will win this", "we will"])
    assert cols["finished"] == [True, False]
    assert cols["wer"][0] == 0.0 and cols["wer"][1] > 0
