"""Speech requests inside the worker: a request becomes a ``SpeechJob``; the ``SpeechBatcher``
thread collects the jobs that arrive within a short window of the first one, up to a largest
batch (config ``runtime.speech_batch_window_ms`` and ``runtime.speech_max_batch``, passed in
by the worker), and renders them in one ``bestofn.core.speech.stream_batch`` call, in the runner's
first gate (the one groups generate in).

With moss-fast, jobs that arrive while it renders join that call at its next sync (every 4
frames, continuous batching through ``bestofn.core.speech.Feed``), up to the largest batch at once.
Each job's chunks go to its own queue, which the request's thread reads. A client that leaves
mid-stream cancels only its job: the batch goes on for the others (and stops early once every
job in it is cancelled or complete); nothing ever blocks on a client that is gone. Speech is
the generator's audio: the restorer and scorers are for groups."""

from __future__ import annotations

import logging
import queue
import threading
import time
from contextlib import AbstractContextManager
from typing import Protocol

from bestofn.core import speech as speech_io
from bestofn.util.spec import GroupSpec
from bestofn.worker.lifecycle import fatal_device_error, release_cached_memory
from bestofn.worker.requests import BadRequest

log = logging.getLogger("bestofn.worker")

SPEECH_WAIT_S = 0.5  # a speech request's thread looks this often whether the worker is dying


END = object()  # a job's queue: its last chunk was delivered


class SpeechHost(Protocol):
    """What the batcher and its jobs use of the worker (``bestofn.worker.server.Worker``)."""

    fatal: str | None  # the device error it dies of

    @property
    def gate(self) -> AbstractContextManager: ...  # the runner's first gate: groups generate in it
    @property
    def generator(self): ...
    def refuse_if_dying(self) -> None: ...  # raises BadRequest(503)
    def device_guard(self) -> AbstractContextManager: ...  # a fatal device error: dying
    def count_speech(self, n: int) -> None: ...  # n requests rendered
    def touch(self) -> None: ...  # the worker was active now (the idle clock)


class SpeechJob:
    """One speech request inside the worker: its spec, and the queue its chunks arrive in."""

    def __init__(self, spec: GroupSpec, fmt: str):
        self.spec, self.fmt = spec, fmt
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # ndarray, END or an exception
        self.cancelled = threading.Event()  # the client left: drop its chunks
        self.done = False  # batcher side: END or an error was delivered
        self.ended: BaseException | bool = False  # reader side: True or the error it got
        self.submitted = time.monotonic()

    def put(self, item) -> None:
        if not self.done:
            self.events.put(item)
            self.done = item is END or isinstance(item, BaseException)

    def get(self, worker: SpeechHost):
        """The next chunk (ndarray) or None at the end; raises the render's error.

        The end is sticky: once this returned None (or raised), every later call does the
        same at once. The batcher delivers one end per job, so waiting for another would
        wait for ever (a reader that skipped empty chunks up to the end of an empty take)."""
        if self.ended is True:
            return None
        if self.ended:
            raise self.ended
        while True:
            try:
                item = self.events.get(timeout=SPEECH_WAIT_S)
            except queue.Empty:
                if not worker.fatal:
                    continue
                try:  # the batch that broke the device delivers its own error first
                    item = self.events.get(timeout=2 * SPEECH_WAIT_S)
                except queue.Empty:
                    worker.refuse_if_dying()  # queued behind a fatal error: 503, retry
            if item is END:
                self.ended = True
                return None
            if isinstance(item, BaseException):
                self.ended = item
                raise item
            return item


class SpeechBatcher:
    """Collects speech jobs into batches and renders each batch in one generator call (one
    thread, started with the first job)."""

    def __init__(self, worker: SpeechHost, window_s: float, max_batch: int):
        self.worker, self.window_s, self.max_batch = worker, window_s, max(1, max_batch)
        self.cond = threading.Condition()
        self.pending: list[SpeechJob] = []
        self.batches = 0
        self.jobs = 0
        self.largest = 0
        self.joined = 0  # jobs that joined a render already running
        self._thread: threading.Thread | None = None

    def submit(self, job: SpeechJob) -> None:
        with self.cond:
            self.pending.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="speech")
                self._thread.start()
            self.cond.notify_all()

    def stats(self) -> dict:
        with self.cond:
            return {
                "batches": self.batches,
                "requests": self.jobs,
                "largest_batch": self.largest,
                "mean_batch": round(self.jobs / self.batches, 3) if self.batches else None,
                "joined_running": self.joined,
                "pending": len(self.pending),
                "window_ms": self.window_s * 1000.0,
                "max_batch": self.max_batch,
            }

    def _next_batch(self) -> list[SpeechJob]:
        with self.cond:
            while not self.pending:
                self.cond.wait()
            deadline = self.pending[0].submitted + self.window_s
            while len(self.pending) < self.max_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            batch = [j for j in self.pending[: self.max_batch] if not j.cancelled.is_set()]
            del self.pending[: self.max_batch]
            return batch

    def _join(self, batch: list[SpeechJob], n: int) -> list:
        """Up to ``n`` jobs that arrived while ``batch`` renders: they join it (continuous
        batching; their indices follow the batch's)."""
        with self.cond:
            new = [j for j in self.pending[:n] if not j.cancelled.is_set()]
            del self.pending[:n]
            self.joined += len(new)
        batch.extend(new)
        return [j.spec for j in new]

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch:
                try:
                    self._run(batch)
                except BaseException as e:  # never leave a request waiting for chunks
                    for job in batch:
                        job.put(e)

    def _run(self, batch: list[SpeechJob]) -> None:
        worker = self.worker
        with worker.gate:
            try:
                worker.refuse_if_dying()
            except BadRequest as e:
                for job in batch:
                    job.put(e)
                return
            try:
                with worker.device_guard():
                    feed = speech_io.Feed(  # moss-fast: later requests join this decode
                        lambda n: self._join(batch, n),
                        lambda i: batch[i].cancelled.is_set(),
                        self.max_batch,
                    )
                    chunks = speech_io.stream_batch(worker.generator, [j.spec for j in batch], feed)
                    try:
                        for i, audio, last in chunks:
                            batch[i].put(audio)
                            if last:
                                batch[i].put(END)
                            if all(j.cancelled.is_set() or j.done for j in batch):
                                break  # every client left (or got all): stop rendering
                    finally:
                        chunks.close()
                for job in batch:  # a generator that forgot a request must not hang it
                    job.put(RuntimeError("the generator ended without finishing this request"))
                worker.count_speech(len(batch))
            except Exception as e:
                log.exception("speech batch of %d failed", len(batch))
                if fatal_device_error(e) is None:
                    release_cached_memory()
                for job in batch:
                    job.put(e)
            finally:
                worker.touch()
                with self.cond:
                    self.batches += 1
                    self.jobs += len(batch)
                    self.largest = max(self.largest, len(batch))
