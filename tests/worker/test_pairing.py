"""Two groups per generate call (issue 24) on a CPU: a take's codes are the same whether its
group runs alone in the pair shape or beside any partner (another prompt of the same bucket,
other seeds, another budget, either half), for Local and Delay; the check is sharp enough to
see the naive left-padded batch move a row's bits; and through the runner, a group's takes are
the same alone and paired, with the partner named in its rows."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from bestofn.fakes.moss import random_state_dict, tiny_config
from bestofn.moss.checkpoint import model_from_state_dict
from bestofn.moss.engine import MossLocalEngine
from bestofn.moss.engine_shell import PairRequest, pair_bucket
from bestofn.moss.prompt import left_pad
from bestofn.moss.sampling import SamplingParams

CFG = tiny_config(vocab_size=264)
P = SamplingParams(temperature=1.0, top_p=0.9, top_k=8, text_temperature=0.3)
N = 6  # rows per half


@pytest.fixture(scope="module")
def engine():
    model = model_from_state_dict(CFG, random_state_dict(CFG, 3), "cpu", torch.float32)
    return MossLocalEngine(model, use_cuda_graphs=False, compile=False)


def _prompt(cfg, T: int, seed: int, last: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((T, 1 + cfg.n_vq), cfg.audio_pad_code)
    ids[:, 0] = torch.randint(0, 200, (T,), generator=g)
    ids[0, 0] = cfg.im_start_token_id
    ids[-1, 0] = last
    return ids


def _local(T, seed, seeds, budget):
    return PairRequest(_prompt(CFG, T, seed, CFG.audio_start_token_id), seeds, budget)


A = _local(20, 1, list(range(100, 100 + N)), 30)
B = _local(40, 2, list(range(200, 200 + N)), 60)  # longer prompt, longer budget
C = _local(9, 3, list(range(300, 300 + N - 2)), 10)  # a partial half, a short budget


def _same(x, y) -> bool:
    return x.stopped == y.stopped and all(
        torch.equal(a, b) for a, b in zip(x.codes, y.codes, strict=True)
    )


def _decode_kv(engine, rows: slice, start: int, n: int) -> torch.Tensor:
    """K/V of ``rows`` in the last state used, slots [start, start + n)."""
    s = next(reversed(engine._states.values()))
    kv = s.cache.kv if s.cache.kv is not None else s.cache.k
    return kv[:, rows, :, start : start + n].clone()


def test_local_takes_do_not_depend_on_the_partner(engine):
    assert pair_bucket(20) == pair_bucket(40) == pair_bucket(9) == 64
    alone = engine.generate_pair([A], N, P)[0]
    T = pair_bucket(20)
    kv_alone = _decode_kv(engine, slice(0, N), T - 20, 20 + 8)  # prompt + first 8 frames
    beside_b = engine.generate_pair([A, B], N, P)[0]
    after_c = engine.generate_pair([C, A], N, P)[1]  # A in the second half
    kv_second = _decode_kv(engine, slice(N, 2 * N), T - 20, 20 + 8)
    lengths = [len(c) for c in alone.codes]
    assert min(lengths) < max(lengths) and any(alone.stopped) and not all(alone.stopped)
    assert _same(alone, beside_b) and _same(alone, after_c)
    # not only the codes: every bit of A's keys and values, prompt and decode alike
    assert torch.equal(kv_alone, kv_second)
    # seeds matter (the check can fail): other seeds give other takes
    other = engine.generate_pair([PairRequest(A.prompt, [s + 1 for s in A.seeds], 30)], N, P)[0]
    assert not _same(alone, other)
    # each partner got what it gets alone, too (budgets differ: B runs on after A stopped)
    assert _same(engine.generate_pair([B], N, P)[0], engine.generate_pair([A, B], N, P)[1])
    assert _same(engine.generate_pair([C], N, P)[0], engine.generate_pair([C, A], N, P)[0])


def test_the_naive_left_padded_batch_moves_the_bits(engine):
    """What the pair shape avoids, on this CPU: A and B left-padded into one batch of their own
    length. Codes may still agree on a tiny model; A's keys and values do not, bit for bit."""
    engine.generate_pair([A], N, P)
    T = pair_bucket(20)
    kv_alone = _decode_kv(engine, slice(0, N), T - 20, 20 + 8)
    ids, mask = left_pad([A.prompt] * N + [B.prompt] * N, CFG)
    engine.generate(ids, mask, list(A.seeds) + list(B.seeds), 60, P)
    kv_naive = _decode_kv(engine, slice(0, N), 40 - 20, 20 + 8)  # A's prompt ends at slot 40
    assert not torch.equal(kv_naive, kv_alone)
    assert (kv_naive - kv_alone).abs().max() < 1e-4  # the same values, other rounding


def test_pairs_refuse_what_would_break_them(engine):
    with pytest.raises(ValueError, match="different buckets"):
        engine.generate_pair([A, _local(70, 4, [1], 5)], N, P)
    with pytest.raises(ValueError, match="half holds"):
        engine.generate_pair([_local(20, 1, list(range(N + 1)), 5)], N, P)


def test_delay_takes_do_not_depend_on_the_partner():
    from bestofn.fakes.moss_delay import random_state_dict as delay_weights
    from bestofn.fakes.moss_delay import tiny_config as delay_config
    from bestofn.moss.delay import delay_model_from_state_dict
    from bestofn.moss.delay_engine import DelayBudget, MossDelayEngine

    cfg = delay_config()
    model = delay_model_from_state_dict(cfg, delay_weights(cfg, seed=3))
    eng = MossDelayEngine(model, use_cuda_graphs=False, compile=False)
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=8, text_temperature=1.5)
    end = cfg.im_start_token_id + 7  # a plain token: the prompt ends outside audio

    def req(T, seed, seeds, frames):
        budget = DelayBudget(max_frames=frames, min_frames=2)
        return PairRequest(_prompt(cfg, T, seed, end), seeds, budget)

    a = req(20, 1, list(range(100, 104)), 12)
    b = req(40, 2, list(range(200, 204)), 30)
    c = req(9, 3, list(range(300, 303)), 5)
    alone = eng.generate_pair([a], 4, p)[0]
    assert alone.codes and all(len(x) >= 2 for x in alone.codes)
    assert _same(alone, eng.generate_pair([a, b], 4, p)[0])
    assert _same(alone, eng.generate_pair([c, a], 4, p)[1])
    assert _same(eng.generate_pair([b], 4, p)[0], eng.generate_pair([a, b], 4, p)[1])
    with pytest.raises(ValueError, match="different rules"):  # min_frames 0 against 2
        eng.generate_pair([a, PairRequest(b.prompt, [1], DelayBudget(max_frames=12))], 4, p)


# ---- the generator and the runner ----------------------------------------------------------


@pytest.fixture(scope="module")
def codec_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from bestofn.fakes import moss_codec

    return moss_codec.write(tmp_path_factory.mktemp("codec") / "codec", "tiny")


def _generator(codec_dir, pair: bool):
    from bestofn.fakes.moss import build

    return build("cpu", size="tiny", seed=5, codec_dir=str(codec_dir), batch_size=4,
                 min_frames=4, max_frames=16, pair_groups=pair)  # fmt: skip


def _spec(emotion, prompt_id, text, n=4):
    from bestofn.util.spec import GroupSpec

    return GroupSpec(emotion, prompt_id, text, n_takes=n)


def test_generator_pairs_groups_and_its_own_chunks(codec_dir):
    gen = _generator(codec_dir, pair=True)
    a, b = _spec("calm", "p1", "Hello there."), _spec("sad", "p2", "Good night, all.")
    key = (4, pair_bucket(len(gen.prompt(a))))  # the half, the prompt bucket
    assert gen.pairs_groups and gen.pair_key(a) == gen.pair_key(b) == key
    alone = gen.generate_codes(a)
    paired = gen.generate_codes_paired([b, a])
    assert alone[1] == paired[1][1] and alone[2] == paired[1][2]
    assert all(torch.equal(x, y) for x, y in zip(alone[0], paired[1][0], strict=True))
    # a group of more takes than a half: no cross-group key, its chunks pair with each other,
    # and its first takes are those of the 4-take group with the same seeds' prefix
    big = _spec("calm", "p1", "Hello there.", n=7)
    assert gen.pair_key(big) is None
    codes, _, _ = gen.generate_codes(big)
    assert len(codes) == 7
    assert all(torch.equal(x, y) for x, y in zip(codes[:4], alone[0], strict=True))
    assert _generator(codec_dir, pair=False).pair_key(a) is None
    assert gen.provenance()["settings"]["pair_groups"] is True


def _backends(gen):
    from bestofn.backends import registry
    from bestofn.core.pipeline import Backends

    models = {"generator": {"backend": "moss-fast"}}
    restorer = registry.build("restorer", "identity", {}, "cpu")
    return Backends(gen, restorer, [registry.build("scorer", "duration", {}, "cpu")], models)


def _run_together(runner, jobs) -> None:
    """Queue ``jobs`` behind a held generate gate, so the first finds the others waiting."""
    threads = [threading.Thread(target=runner.run, args=(job,)) for job in jobs]
    with runner.gate:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while runner.gate.waiting < len(jobs) - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
    for t in threads:
        t.join(120)


def test_runner_gives_a_group_the_same_takes_alone_and_paired(codec_dir, tmp_path):
    from bestofn.core.runner import GroupJob, Runner

    a = _spec("calm", "p1", "Hello there.")
    b = _spec("sad", "p2", "Good night, all.")
    c = _spec("angry", "p3", "Who goes there?")
    runner = Runner(_backends(_generator(codec_dir, pair=True)), "cpu", "full")
    assert runner.describe()["pairs"] is True

    def job(spec, name):
        return GroupJob(spec, tmp_path / name / spec.prompt_id, paths_relative_to=tmp_path)

    alone = job(a, "alone")
    runner.run(alone)
    with_b = [job(a, "ab"), job(b, "ab")]
    _run_together(runner, with_b)
    with_c = [job(c, "ca"), job(a, "ca")]  # a as the partner this time
    _run_together(runner, with_c)
    assert runner.groups_paired == 4

    def audio(j):
        return [t.audio for t in j.work.takes]

    for paired in (with_b[0], with_c[1]):
        assert all(np.array_equal(x, y) for x, y in zip(audio(alone), audio(paired), strict=True))
    rows = {
        name: pq.read_table(tmp_path / name / "p1/scores.parquet") for name in ("alone", "ab", "ca")
    }
    assert rows["alone"].column("paired_with").to_pylist() == [""] * 4
    assert rows["ab"].column("paired_with").to_pylist() == ["sad/p2"] * 4
    assert rows["ca"].column("paired_with").to_pylist() == ["angry/p3"] * 4
    for name in ("ab", "ca"):
        assert rows[name].column("n_frames").equals(rows["alone"].column("n_frames"))
        assert rows[name].column("duration_s").equals(rows["alone"].column("duration_s"))
    # the shares of the shared call add up to its time
    gen_s = [j.work.timer.wall["generate"] for j in with_b]
    assert gen_s[0] > 0 and gen_s[0] == pytest.approx(gen_s[1])
    # pairing off: each group alone, at its own batch. On this CPU the bits agree with the pair
    # shape too; on CUDA the GEMM shapes differ, so pair_groups is a kernel path (config/README)
    off = Runner(_backends(_generator(codec_dir, pair=False)), "cpu", "off")
    assert off.describe()["pairs"] is False
    plain = job(a, "off")
    off.run(plain)
    assert all(np.array_equal(x, y) for x, y in zip(audio(alone), audio(plain), strict=True))


def test_delay_generator_pairs_with_the_same_takes(tmp_path):
    from bestofn.backends.moss_fast import MossFastGenerator
    from bestofn.fakes import moss_delay

    opts = moss_delay.write(tmp_path)
    opts.pop("codec_dir")  # codes only
    gen = MossFastGenerator(**opts, pair_groups=True, batch_size=3, min_frames=3, max_frames=10,
                            delay_min_frames=2, hash_weights=False)  # fmt: skip
    a, b = _spec("calm", "p1", "Hello there.", n=3), _spec("sad", "p2", "Good night all.", n=3)
    assert gen.is_delay and gen.pair_key(a) == gen.pair_key(b) is not None
    alone, paired = gen.generate_codes(a), gen.generate_codes_paired([b, a])[1]
    assert alone[1] == paired[1] and alone[2] == paired[2]
    assert all(torch.equal(x, y) for x, y in zip(alone[0], paired[0], strict=True))


def test_a_group_waits_for_a_partner_while_the_gpu_restores_and_scores(codec_dir, tmp_path):
    """Groups reach a worker one at a time: with a group ahead still being restored and
    scored (here: the test holds that phase), the next waits in generate for a partner."""
    from bestofn.core.runner import GroupJob, Runner

    runner = Runner(_backends(_generator(codec_dir, pair=True)), "cpu", "full")
    a, b = _spec("calm", "p1", "Hello there."), _spec("sad", "p2", "Good night, all.")
    jobs = [
        GroupJob(spec, tmp_path / spec.prompt_id, paths_relative_to=tmp_path) for spec in (a, b)
    ]
    threads = [threading.Thread(target=runner.run, args=(j,)) for j in jobs]
    with runner._score_gate:  # a group ahead, being scored
        threads[0].start()
        time.sleep(0.3)  # a is in generate, with no partner queued yet
        threads[1].start()
        deadline = time.monotonic() + 60
        while runner.groups_paired < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    for t in threads:
        t.join(120)
    assert runner.groups_paired == 2 and jobs[0].work.paired_with == "sad/p2"


def test_a_group_that_finds_the_gpu_idle_waits_briefly_for_a_partner(codec_dir, tmp_path):
    """A worker's first groups arrive a few ms apart: with nothing ahead, the first waits up to
    PAIR_IDLE_WAIT_S for a partner (and pairs with one that comes 50 ms later); with none
    coming, it starts after that wait, not after PAIR_WAIT_S."""
    from bestofn.core.runner import PAIR_IDLE_WAIT_S, PAIR_WAIT_S, GroupJob, Runner

    runner = Runner(_backends(_generator(codec_dir, pair=True)), "cpu", "full")
    a, b = _spec("calm", "p1", "Hello there."), _spec("sad", "p2", "Good night, all.")
    runner.run(GroupJob(a, tmp_path / "warm" / "p1", paths_relative_to=tmp_path))  # warm-up
    assert runner.groups_paired == 0
    jobs = [GroupJob(s, tmp_path / s.prompt_id, paths_relative_to=tmp_path) for s in (a, b)]
    threads = [threading.Thread(target=runner.run, args=(j,)) for j in jobs]
    threads[0].start()
    time.sleep(0.05)  # a is in generate, the GPU idle, b not yet queued
    threads[1].start()
    for t in threads:
        t.join(120)
    assert runner.groups_paired == 2 and jobs[0].work.paired_with == "sad/p2"
    lone = GroupJob(_spec("angry", "p3", "Who goes there?"), tmp_path / "p3",
                    paths_relative_to=tmp_path)  # fmt: skip
    t0 = time.monotonic()
    runner._partner(lone)
    waited = time.monotonic() - t0
    assert PAIR_IDLE_WAIT_S <= waited < PAIR_WAIT_S / 2
