"""bestofn.util.torch_threads: a group's stages run on the same torch intra-op thread count in any
thread, whatever that thread's history (torch keeps the count per thread, copied from a
process-wide value at a thread's first parallel op)."""

from __future__ import annotations

import os
import threading

import pytest

from bestofn.util.torch_threads import default_cpu_threads, torch_threads

torch = pytest.importorskip("torch")


def _in_thread(fn):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(60)
    return out[0]


@pytest.fixture
def main_threads():
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_the_block_runs_on_n_threads_and_the_thread_gets_its_count_back(main_threads):
    torch.set_num_threads(3)
    with torch_threads(2):
        torch.ones(1 << 16).sum()  # a parallel op
        inside = torch.get_num_threads()
    assert (inside, torch.get_num_threads()) == (2, 3)
    with torch_threads(0):  # 0: left alone
        assert torch.get_num_threads() == 3


def test_another_threads_change_does_not_reach_into_the_block(main_threads):
    """A thread's first parallel op copies the process-wide value: a count set before it would
    be undone when another thread changes that value in between."""
    torch.set_num_threads(3)
    entered, changed = threading.Event(), threading.Event()

    def first_torch_use_in_the_block():
        with torch_threads(2):
            entered.set()
            changed.wait(60)
            torch.ones(1 << 20).sum()  # its first parallel op
            return torch.get_num_threads()

    out: list = []
    t = threading.Thread(target=lambda: out.append(first_torch_use_in_the_block()))
    t.start()
    entered.wait(60)
    torch.set_num_threads(1)  # another thread, meanwhile
    changed.set()
    t.join(60)
    assert out == [2]


def test_a_thread_that_started_inside_another_threads_change_is_fixed(main_threads):
    """The CI state: a thread's first torch call fell inside another thread's temporary change
    (as resemblyzer_sim's one-thread window) and keeps that count; new threads do not."""
    changed, done = threading.Event(), threading.Event()

    def other():
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        changed.set()
        done.wait(60)
        torch.set_num_threads(before)

    def late_starter():
        changed.wait(60)
        stuck = torch.get_num_threads()  # its first torch call, inside the window
        done.set()
        with torch_threads(4):
            fixed = torch.get_num_threads()
        return stuck, fixed, torch.get_num_threads()

    t = threading.Thread(target=other)
    t.start()
    stuck, fixed, after = _in_thread(late_starter)
    t.join(60)
    assert (stuck, fixed, after) == (1, 4, 1)


def test_default_cpu_threads_follows_the_environment(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert default_cpu_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert default_cpu_threads() == len(os.sched_getaffinity(0))

    from bestofn.core.pipeline import Backends

    assert Backends(None, None, [], {}).cpu_threads == default_cpu_threads()
    assert Backends(None, None, [], {}, cpu_threads=5).cpu_threads == 5
