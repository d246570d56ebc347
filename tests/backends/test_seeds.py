"""A take is a pure function of its seed, whatever batch it was generated in."""

import numpy as np
import pytest

from bestofn.util.spec import GroupSpec, take_seed


def test_take_seed_depends_on_group_take_and_base_only():
    assert take_seed("calm/p1", 3, 7) == take_seed("calm/p1", 3, 7)
    seeds = {take_seed("calm/p1", t, 7) for t in range(64)}
    assert len(seeds) == 64
    assert take_seed("calm/p1", 3, 7) != take_seed("calm/p2", 3, 7)
    assert take_seed("calm/p1", 3, 7) != take_seed("calm/p1", 3, 8)


def test_seeds_prefix_is_stable_across_n():
    small = GroupSpec("calm", "p1", "Hi.", 3, base_seed=1).seeds()
    large = GroupSpec("calm", "p1", "Hi.", 8, base_seed=1).seeds()
    assert large[:3] == small


@pytest.fixture(scope="module")
def piper():
    from bestofn.backends.piper import PiperGenerator

    return PiperGenerator()


def test_piper_same_seed_identical_take(piper):
    ids = piper.phoneme_ids("The train leaves at nine.")
    a, b = piper.synthesize(ids, seed=11), piper.synthesize(ids, seed=11)
    assert a.dtype == np.float32 and a.size > piper.sample_rate // 2
    np.testing.assert_array_equal(a, b)


def test_piper_different_seeds_differ(piper):
    ids = piper.phoneme_ids("The train leaves at nine.")
    a, b = piper.synthesize(ids, seed=11), piper.synthesize(ids, seed=12)
    n = min(a.size, b.size)
    assert a.size != b.size or not np.allclose(a[:n], b[:n])


def test_piper_take_independent_of_batch(piper):
    two = piper.generate(GroupSpec("calm", "p1", "Good morning.", 2, base_seed=5))
    four = piper.generate(GroupSpec("calm", "p1", "Good morning.", 4, base_seed=5))
    for x, y in zip(two, four[:2], strict=False):
        assert x.seed == y.seed
        np.testing.assert_array_equal(x.audio, y.audio)
