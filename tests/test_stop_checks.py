"""The decode loop's stop check read late (``EngineShell.stop_lag``, on CUDA by default): the
host reads whether every row has stopped from a record ``stop_lag`` steps old, so the GPU's
queue never drains at a check. On a CPU the same logic runs with plain tensors: the takes are
the ones of a loop that reads at once, and the loop ends exactly the lag later."""

from __future__ import annotations

import pytest
import torch

from bestofn.fakes.moss import random_state_dict, tiny_config
from bestofn.moss.checkpoint import model_from_state_dict
from bestofn.moss.engine import MossLocalEngine
from bestofn.moss.engine_shell import LAGGED_CHECK_EVERY, PairRequest
from bestofn.moss.sampling import SamplingParams

CFG = tiny_config(vocab_size=264)
P = SamplingParams(temperature=1.0, top_p=0.9, top_k=8, text_temperature=1.0)
BUDGET = 200  # far above these takes (the last of the five stops after 54 frames)


@pytest.fixture(scope="module")
def model():
    return model_from_state_dict(CFG, random_state_dict(CFG, 3), "cpu", torch.float32)


def _engine(model, **kw):
    return MossLocalEngine(model, use_cuda_graphs=False, compile=False, **kw)


def _prompts(n: int, T: int = 12):
    g = torch.Generator().manual_seed(7)
    ids = torch.full((n, T, 1 + CFG.n_vq), CFG.audio_pad_code)
    ids[:, :, 0] = torch.randint(0, 200, (n, T), generator=g)
    ids[:, 0, 0] = CFG.im_start_token_id
    ids[:, -1, 0] = CFG.audio_start_token_id
    return ids


def _same(x, y) -> bool:
    return x.stopped == y.stopped and all(
        torch.equal(a, b) for a, b in zip(x.codes, y.codes, strict=True)
    )


def test_a_late_read_gives_the_same_takes_and_ends_the_lag_later(model):
    ids, seeds = _prompts(5), list(range(60, 65))
    # sync_every 1 with no lag: the loop ends at the first step after the last row stopped
    exact = _engine(model, stop_lag=0, sync_every=1).generate(ids, None, seeds, BUDGET, P)
    assert all(exact.stopped) and exact.frames < BUDGET - 16, "the fixture's takes must stop"
    at_once = _engine(model, stop_lag=0).generate(ids, None, seeds, BUDGET, P)  # every 8
    late = _engine(model, stop_lag=4).generate(ids, None, seeds, BUDGET, P)
    assert _same(exact, at_once) and _same(exact, late)
    assert exact.frames <= at_once.frames < exact.frames + 8
    # checks every LAGGED_CHECK_EVERY steps, each read 4 steps after it was recorded
    assert exact.frames + 4 <= late.frames < exact.frames + 4 + LAGGED_CHECK_EVERY


def test_a_late_read_never_runs_past_the_budget(model):
    ids, seeds = _prompts(3), [60, 61, 62]
    short = 6  # the first take runs 54 frames with no budget (the test above)
    late = _engine(model, stop_lag=4).generate(ids, None, seeds, short, P)
    at_once = _engine(model, stop_lag=0).generate(ids, None, seeds, short, P)
    assert late.frames == at_once.frames == short
    assert _same(late, at_once) and len(late.codes[0]) == short and not late.stopped[0]


def test_pairs_keep_their_takes_under_a_late_read(model):
    ids = _prompts(2, T=20)
    a = PairRequest(ids[0], list(range(100, 104)), 60)
    b = PairRequest(ids[1], list(range(200, 203)), 25)  # a partial half, its own budget
    late = _engine(model, stop_lag=4).generate_pair([a, b], 4, P)
    at_once = _engine(model, stop_lag=0).generate_pair([a, b], 4, P)
    assert all(_same(x, y) for x, y in zip(late, at_once, strict=True))


def test_a_stream_reads_at_once_whatever_the_lag(model):
    ids, seeds = _prompts(3), [5, 6, 7]
    ends = []
    for lag in (0, 4):
        steps = list(_engine(model, stop_lag=lag).stream(ids, None, seeds, BUDGET, P, every=4))
        assert steps[-1].last
        ends.append((steps[-1].start + steps[-1].codes.shape[1], steps[-1].n_frames.tolist()))
    assert ends[0] == ends[1]  # the stream's end does not wait for a lagged record


def test_the_lag_defaults_to_none_on_the_cpu(model):
    assert _engine(model).stop_lag == 0
    assert _engine(model, stop_lag=4).stop_lag == 4
