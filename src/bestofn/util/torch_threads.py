"""torch's CPU thread count, fixed while a group's stages run.

Some CPU kernels give other last bits with another intra-op thread count (oneDNN's
convolutions in Sidon's DAC decoder: 1 vs 2 threads changed ~0.2% of the 16-bit samples of a
take). And torch keeps that count per thread: ``torch.set_num_threads`` sets the calling
thread's OpenMP and MKL counts plus a process-wide value that a thread copies at its first
parallel op, and never again. A thread whose first op falls inside another thread's temporary
change (``resemblyzer_sim``'s one-thread window, a library, a test fixture) keeps the changed
count; a ``set_num_threads`` made before a thread's first op is undone by that first op.
So the same group could give other takes in a group job's main thread than in a worker's
request thread. :func:`torch_threads` sets the calling thread's count for a block, whatever
that thread's history, and gives it back after.
"""

from __future__ import annotations

import contextlib
import os
import sys


def default_cpu_threads() -> int:
    """The intra-op thread count a group's stages run with: ``OMP_NUM_THREADS`` when set (as
    torch itself reads it), else the CPUs this process may use. A function of the process's
    environment, never of what ran before in it."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def torch_threads(n: int):
    """The calling thread runs torch on ``n`` intra-op threads in the block (0: left alone),
    then gets its own count back. Nothing happens where torch is not imported (the backends
    that use torch import it when they are built, before any stage runs)."""
    torch = sys.modules.get("torch")
    if not n or torch is None:
        yield
        return
    # get_num_threads first: it runs this thread's one-time init, which would otherwise reset
    # the count to the process-wide value at the block's first parallel op
    before = torch.get_num_threads()
    if before != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
