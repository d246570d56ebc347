"""The continuous decoder when the device cannot hold more rows: a state allocation that runs
out of memory sizes the state down to the rows that fit, requests past them wait for rows to
free, and every request still gets the frames it gets alone (tiny random model, CPU; the
allocation's CUDA out-of-memory error is raised by a stand-in state class)."""

from __future__ import annotations

import pytest
import torch

from bestofn.moss import continuous
from bestofn.moss.continuous import ContinuousDecoder, Join
from bestofn.util.spec import GroupSpec

TEXTS = ["one two three four five", "Hi there.", "It is late now.", "See you at nine.",
         "A b c d e f"]  # fmt: skip


@pytest.fixture(scope="module")
def gen():
    from bestofn.fakes.moss import build, stop_head_tensors

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: threads only add overhead on a shared CPU
    g = build("cpu", size="tiny", min_frames=6, max_frames=40, min_tokens=1, budget_scale=1.0,
              budget_offset=0)  # fmt: skip
    with torch.no_grad():  # takes stop at random frames: rows free at different syncs
        t = stop_head_tensors(g.config, 0.06, seed=3)
        g.model.local_ln_f.weight.mul_(t["local_transformer.ln_f.weight"])
        g.model.local_ln_f.bias.copy_(t["local_transformer.ln_f.bias"])
        g.model.stop_head.copy_(t["local_text_lm_head.weight"])
    yield g
    torch.set_num_threads(threads)


def decode(g, decoder: ContinuousDecoder, which: list[int], max_batch: int) -> dict:
    """Requests ``which`` (indices into TEXTS) pulled as rows allow; each one's frames."""
    specs = {i: GroupSpec("calm", "api", TEXTS[i], 1, 100 + i) for i in which}
    todo = [Join(i, g.prompt(s), s.base_seed, g.budget.frames(s.text)) for i, s in specs.items()]
    frames: dict[int, list] = {i: [] for i in which}
    finished = set()

    def pull(room):
        out, todo[:] = todo[:room], todo[room:]
        return out

    for block in decoder.run(pull, g.params, None, 4, max_batch):
        for u in block:
            frames[u.key].append(u.codes)
            assert u.key not in finished
            if u.finished:
                finished.add(u.key)
    assert finished == set(which)
    return {i: torch.cat(f) for i, f in frames.items()}


def rows_that_fit(monkeypatch, limit: int) -> list[int]:
    """States of more than ``limit`` rows fail as a full GPU does; returns the batches asked."""
    asked = []

    class Bounded(continuous.RowState):
        def __init__(self, model, batch, max_len, cap):
            asked.append(batch)
            if batch > limit:
                raise torch.OutOfMemoryError(f"CUDA out of memory (stand-in: {batch} rows)")
            super().__init__(model, batch, max_len, cap)

    monkeypatch.setattr(continuous, "RowState", Bounded)
    return asked


def test_rows_past_the_memory_wait_and_keep_their_frames(gen, monkeypatch):
    every = list(range(len(TEXTS)))
    alone = {i: decode(gen, ContinuousDecoder(gen.engine), [i], 1)[i] for i in every}
    assert len({len(f) for f in alone.values()}) > 2, "takes of several lengths"
    asked = rows_that_fit(monkeypatch, 2)
    decoder = ContinuousDecoder(gen.engine)
    got = decode(gen, decoder, every, max_batch=8)
    assert asked[:3] == [8, 8, 4] and 2 in asked, "sized down: 8 (then again after evicting), 4, 2"
    assert decoder.row_limit == 2
    assert all(s.batch <= 2 for s in decoder._states.values())
    for i in every:
        assert torch.equal(got[i], alone[i]), f"request {i}"
    # remembered: a later run of this decoder asks for no more rows than fit
    asked.clear()
    decode(gen, decoder, every[:3], max_batch=8)
    assert max(asked, default=0) <= 2


def test_no_row_fitting_is_the_out_of_memory_error(gen, monkeypatch):
    rows_that_fit(monkeypatch, 0)
    with pytest.raises(torch.OutOfMemoryError, match="stand-in: 1 rows"):
        decode(gen, ContinuousDecoder(gen.engine), [0, 1], max_batch=2)


@pytest.mark.parametrize("side_by_side", [False, True])
def test_a_grown_cache_gets_every_slot_of_the_rows_it_keeps(side_by_side):
    """``BackboneCache.copy_rows`` (the decode state growing with rows occupied): the rows kept
    get every slot of every layer, K and V, bit for bit; the other rows stay as they were."""
    from bestofn.moss.kv_cache import BackboneCache

    g = torch.Generator().manual_seed(0)
    old = BackboneCache(3, 4, 2, 16, 8, torch.float32, "cpu", kv_side_by_side=side_by_side)
    new = BackboneCache(3, 8, 2, 32, 8, torch.float32, "cpu", kv_side_by_side=side_by_side)
    for t in (old.k, old.v, new.k, new.v):
        t.copy_(torch.randn(t.shape, generator=g))
    before_k, before_v = new.k.clone(), new.v.clone()
    kept = torch.tensor([0, 2, 3])
    new.copy_rows(kept, old, kept)
    for mine, theirs, before in ((new.k, old.k, before_k), (new.v, old.v, before_v)):
        assert torch.equal(mine[:, kept, :, :16], theirs[:, kept])
        assert torch.equal(mine[:, kept, :, 16:], before[:, kept, :, 16:])
        others = torch.tensor([1, 4, 5, 6, 7])
        assert torch.equal(mine[:, others], before[:, others])
