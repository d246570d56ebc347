"""The worker serves its connections on long-lived threads (bestofn.worker.server.RequestThreads):
one after another on the same thread, and a new thread only while every thread is busy."""

import threading

from bestofn.worker.server import RequestThreads


def test_requests_reuse_idle_threads_and_add_one_only_when_all_are_busy():
    ran, done = [], threading.Event()
    release = threading.Event()

    def handle(tag, block):
        ran.append((tag, threading.current_thread().name))
        if block:
            release.wait(10)
        done.set()

    pool = RequestThreads(handle, name="t")
    for tag in ("a", "b", "c"):  # one after another: the same thread each time
        done.clear()
        pool.submit(tag, False)
        assert done.wait(10)
    assert pool.started == 1 and {name for _, name in ran} == {"t-1"}

    # two held at once: the second needs a second thread; later ones reuse both
    pool.submit("slow1", True)
    pool.submit("slow2", True)
    for _ in range(200):
        if len(ran) == 5:
            break
        threading.Event().wait(0.01)
    assert pool.started == 2 and {name for tag, name in ran[3:]} == {"t-1", "t-2"}
    release.set()
    for _ in range(200):
        if pool._idle == 2:
            break
        threading.Event().wait(0.01)
    done.clear()
    pool.submit("d", False)
    assert done.wait(10) and pool.started == 2
