"""The embedded default's CPU thread settings change speed only: takes and scores are the same
whatever the threads (piper, whisper-asr and DNSMOS take one take per core side by side;
resemblyzer runs on one torch thread)."""

from __future__ import annotations

import numpy as np
import pytest

from bestofn.util.spec import GroupSpec

pytestmark = pytest.mark.slow  # the CPU models' takes, in parallel and serially

SPEC = GroupSpec("calm", "p1", "Good morning, how are you?", 4, base_seed=5)


@pytest.fixture(scope="module")
def takes():
    from bestofn.backends.piper import PiperGenerator

    serial = PiperGenerator(threads=1)
    parallel = PiperGenerator(threads=3)  # more threads than takes per core: still the same
    assert serial._pool is None and parallel._pool is not None
    return serial.generate(SPEC), parallel.generate(SPEC)


def test_piper_takes_in_parallel_are_the_serial_takes(takes):
    serial, parallel = takes
    assert [t.seed for t in parallel] == [t.seed for t in serial] == SPEC.seeds()
    for a, b in zip(serial, parallel, strict=True):
        np.testing.assert_array_equal(a.audio, b.audio)
        assert a.meta == b.meta


def test_resemblyzer_one_thread_is_the_default_threads(takes):
    import torch

    from bestofn.backends.resemblyzer_sim import ResemblyzerScorer
    from bestofn.util.audio import resample

    audios = [resample(t.audio, 22050, 16000) for t in takes[0]]
    before = torch.get_num_threads()
    # the process's count, which threads=0 leaves alone: two, not the one thread that
    # conftest.py gives each pytest-xdist worker on a 2-core box
    torch.set_num_threads(2)
    try:
        one = ResemblyzerScorer(threads=1).score(audios, 16000, SPEC)
        assert torch.get_num_threads() == 2  # restored after scoring
        default = ResemblyzerScorer(threads=0).score(audios, 16000, SPEC)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    np.testing.assert_allclose(one["speaker_sim"], default["speaker_sim"], rtol=0, atol=1e-6)


def test_whisper_takes_side_by_side_are_the_serial_transcripts(takes):
    from bestofn.backends.whisper_asr import WhisperASRScorer
    from bestofn.util.audio import resample

    audios = [resample(t.audio, 22050, 16000) for t in takes[0]]
    serial = WhisperASRScorer(workers=1, cpu_threads=2)
    parallel = WhisperASRScorer(workers=2, cpu_threads=1)
    assert serial._pool is None and parallel._pool is not None
    a, b = serial.score(audios, 16000, SPEC), parallel.score(audios, 16000, SPEC)
    assert a == b and any(a["transcript"])


def test_dnsmos_takes_side_by_side_are_the_serial_scores(takes):
    from bestofn.backends.dnsmos import DNSMOSScorer
    from bestofn.util.audio import resample

    audios = [resample(t.audio, 22050, 16000) for t in takes[0]]
    serial, parallel = DNSMOSScorer(threads=1), DNSMOSScorer(threads=2)
    assert serial._pool is None and parallel._pool is not None
    assert serial.score(audios, 16000, SPEC) == parallel.score(audios, 16000, SPEC)
