"""`bestofn worker`: one long-lived process per slot (GPU). Loads the configured models once,
then serves over a Unix socket that only its owner can reach (endpoints:
``bestofn.worker.handler``).

Groups run through the one stage scheduler, ``bestofn.core.runner.Runner``: the GPU stages take the
gate one group at a time (the GPU is the bottleneck), further requests wait in a FIFO queue,
so with two clients per slot the next group is already waiting when one finishes. With
``runtime.overlap`` (``bestofn.core.runner.OVERLAP_MODES``; ``full`` by default on CUDA) a group
leaves the gate after its GPU stages and is written in its own request thread while the next
group runs on the GPU; ``full`` also has the next group generate while one is restored and
scored. The worker exits by itself after ``idle_timeout_s`` with nothing running or queued.

A fatal device error ends the worker (``bestofn.worker.lifecycle``). Speech requests
(``bestofn serve`` is their HTTP front) are batched by ``bestofn.worker.speech_batcher`` and
render in the runner's gate, between groups.

What the worker runs with is one ``bestofn.worker.options.WorkerOptions``. The handler and the
speech batcher see the worker through their own narrow protocols (``HandledWorker``,
``SpeechHost``), which ``Worker`` meets with a few public methods; neither imports this
module."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socketserver
import threading
import time
from pathlib import Path

from bestofn.core.pipeline import Backends, load_backends, stable_hash
from bestofn.core.runner import STREAM_PRIORITY, GroupJob, Runner, resolve_overlap
from bestofn.worker.handler import Handler
from bestofn.worker.lifecycle import (
    EXIT_GRACE_S,
    FatalErrorLifecycle,
    fatal_device_error,
    release_cached_memory,
)
from bestofn.worker.options import WorkerOptions
from bestofn.worker.requests import BadRequest, group_request, speech_request
from bestofn.worker.speech_batcher import SpeechBatcher, SpeechJob
from bestofn.worker.startup import group_stats, log_json, resolve_warm_up, trim_host_heap
from bestofn.worker.startup import warm_up as warm_up_group

log = logging.getLogger("bestofn.worker")


class Worker(FatalErrorLifecycle):
    """One slot's loaded models and runner, serving what ``models`` on ``device`` write below
    ``results_dir``; ``options``: how it runs (``bestofn.worker.options``).

    ``worker_key``: the key the group job that started it computed (it also covers the
    physical GPU behind the slot); computed here when started by hand. ``warm_up_spec``: the
    group to warm up on (``runtime.warm_up``). ``timeline``: the start so far (seconds since
    the process started, ``bestofn.worker.startup``)."""

    def __init__(
        self,
        models: dict,
        results_dir: Path,
        device: str,
        options: WorkerOptions | None = None,
        *,
        slot: int = 0,
        flac_subtype: str = "PCM_16",
        worker_key: str | None = None,
        warm_up_spec: dict | None = None,
        timeline: dict | None = None,
    ):
        from bestofn.util.gpu_memory import apply_cap
        from bestofn.worker.key import worker_key as key_of
        from bestofn.worker.key import worker_spec

        self._init_lifecycle()
        self.options = options = options or WorkerOptions()
        self.models_hash = stable_hash(models)
        self.generate_priority = options.generate_priority
        visible = os.environ.get("CUDA_VISIBLE_DEVICES") if device.startswith("cuda") else None
        serving = options.serving()
        self.spec = worker_spec(models, device, flac_subtype, results_dir, visible, serving)
        self.worker_key = worker_key or key_of(self.spec)
        self.results_dir = Path(results_dir).resolve()
        self.device = device
        self.slot = slot
        self.idle_timeout_s = float(options.idle_timeout_s)
        self.flac_subtype = flac_subtype
        self.started = time.monotonic()
        # runtime.gpu_memory_gb, before any model loads (a cap too large for the device: error)
        self.gpu_memory_cap = apply_cap(options.gpu_memory_gb, device)
        warm = resolve_warm_up(options.warm_up, device)
        self.timeline = dict(timeline or {})
        t_load = time.time()
        backends = load_backends(models, device=device, parallel=options.parallel_load)
        self.runner = Runner(
            backends, device, resolve_overlap(options.overlap, device),
            flac_subtype=flac_subtype, write_threads=options.write_threads, slot=slot,
            charge_load="first",
            generate_priority=STREAM_PRIORITY[self.generate_priority],
            admit=self.refuse_if_dying, on_error=self.on_device_error,
        ).setup()  # fmt: skip
        self.overlap = self.runner.overlap
        self.timeline.update(load_start_unix=t_load, load_end_unix=time.time())
        self.warm_up_s: dict | None = None
        if warm and warm_up_spec is not None:
            from bestofn.util.spec import GroupSpec

            try:
                self.warm_up_s = warm_up_group(self.runner, GroupSpec(**warm_up_spec))
            except Exception as e:  # the group itself will say what is wrong with it
                if fatal_device_error(e):
                    raise
                release_cached_memory()
                log.warning(
                    "slot %s: warm-up failed, the first group compiles instead: %s: %s",
                    slot,
                    type(e).__name__,
                    e,
                    exc_info=True,
                )  # where: the traceback
            # the first group is charged the warm-up too (its group_load_s): the cost of a
            # start stays in the throughput table, wherever the compiles now happen
            backends.load_s += time.time() - self.timeline["load_end_unix"]
        self.timeline["warm_up_end_unix"] = time.time()
        self.last_group: dict | None = None
        self.load_count = 1
        self.speech_served = 0
        self.in_flight = 0
        self.speech_batcher = SpeechBatcher(
            self, float(options.speech_batch_window_ms) / 1000.0, int(options.speech_max_batch)
        )
        loaded = self.backends.load_report.get("load_s", self.backends.load_s)
        log.info("slot %s: models loaded in %.1f s on %s", slot, loaded, device)
        log_json("load", self.backends.load_report)
        if self.warm_up_s is not None:
            log.info("slot %s: warmed up in %.1f s", slot, sum(self.warm_up_s.values()))

    # the runner holds the backends, the gate and the idle clock; the worker reads them there
    @property
    def backends(self) -> Backends:
        return self.runner.backends

    @backends.setter
    def backends(self, backends: Backends) -> None:  # tests share one set of loaded backends
        self.runner.backends = backends

    @property
    def gate(self):
        return self.runner.gate

    @property
    def groups_served(self) -> int:
        return self.runner.groups_done

    @property
    def last_active(self) -> float:
        return self.runner.last_active

    def health(self) -> dict:
        status = "dying" if self.fatal else "stopping" if self.stopping.is_set() else "ok"
        return {
            "status": status,
            "fatal_error": self.fatal,
            "pid": os.getpid(),
            "slot": self.slot,
            "device": self.device,
            "worker_key": self.worker_key,
            "spec": {k: v for k, v in self.spec.items() if k != "models"},
            "flac_subtype": self.flac_subtype,
            "models_hash": self.models_hash,
            "models_loaded": True,
            "load_count": self.load_count,
            "load_s": self.backends.load_s,  # charged to the first group: load + warm-up
            "load_report": self.backends.load_report,
            "start": self.start_report(),
            "last_group": self.last_group,
            "overlap": self.overlap,
            "stages": self.runner.describe()["stages"],
            "groups_served": self.groups_served,
            "speech_served": self.speech_served,
            "gpu_memory_cap": self.gpu_memory_cap,
            "speech_batching": self.speech_batcher.stats(),
            "queue_length": self.gate.waiting,
            "busy": self.gate.busy,
            "uptime_s": time.monotonic() - self.started,
            "results_dir": str(self.results_dir),
        }

    def start_report(self) -> dict:
        """The start in seconds from the process's start: imports, load, warm-up, ready."""
        t = self.timeline
        origin = t.get("process_start_unix") or t.get("main_unix") or t.get("load_start_unix")

        def since(key):
            return None if t.get(key) is None or origin is None else t[key] - origin

        return {
            "origin": "process start" if t.get("process_start_unix") else "worker main",
            "main_s": since("main_unix"),  # the interpreter and the command line are up
            "imports_done_s": since("imports_unix"),
            "load_done_s": since("load_end_unix"),
            "warm_up_done_s": since("warm_up_end_unix"),
            "ready_s": since("ready_unix"),
            "load_s": self.backends.load_report.get("load_s", self.backends.load_s),
            "warm_up_s": self.warm_up_s,
            "generate_priority": self.generate_priority,
            "process_start_unix": t.get("process_start_unix"),
        }

    def run_group(self, body: dict) -> dict:
        spec, out = group_request(body, self.worker_key, self.results_dir)
        workdir = body.get("workdir")
        job = GroupJob(spec, out, Path(workdir) if workdir else None)
        with self.active():
            timings = self.runner.run(job)
        trim_s = trim_host_heap()  # the group's freed buffers back to the OS: see its doc
        stats = group_stats(self.backends, self.device, self.groups_served)
        stats.update(group_id=spec.group_id, wall_s=timings.get("wall_s"), malloc_trim_s=trim_s)
        self.last_group = stats
        log_json("group-stats", stats)
        idle = job.idle_s
        return {"group_id": spec.group_id, "out": str(out), "timings": timings, "idle_s": idle}

    # ---- what the handler and the speech batcher use (their protocols: HandledWorker, SpeechHost)

    def speak(self, body: dict) -> SpeechJob:
        """Check a speech request (``bestofn.worker.requests.speech_request``), make its job and
        queue it for the batcher. Call inside ``active()``: a stopping worker refuses with 503."""
        if self.stopping.is_set():
            raise BadRequest(503, "worker is stopping")
        job = SpeechJob(*speech_request(body, self.worker_key, self.backends.generator.name))
        self.speech_batcher.submit(job)
        return job

    @property
    def sample_rate(self) -> int:
        return self.backends.generator.sample_rate

    @property
    def generator(self):
        return self.backends.generator

    def count_speech(self, n: int) -> None:
        self.speech_served += n

    def touch(self) -> None:
        self.runner.touch()

    @contextlib.contextmanager
    def active(self):
        """Count a request as in flight (queued or running): the idle reaper waits for zero."""
        with self.lock:
            self.in_flight += 1
        try:
            yield
        finally:
            with self.lock:
                self.in_flight -= 1
            self.runner.touch()

    def idle_for(self) -> float:
        with self.lock:
            if self.in_flight:
                return 0.0
        return time.monotonic() - self.last_active


class RequestThreads:
    """Long-lived daemon threads that serve the connections, one at a time each; a new thread
    only when every thread is busy, so there are as many as the most requests ever in flight.

    Why not a thread per connection (``socketserver.ThreadingMixIn``): every group then ran its
    CUDA work on a brand-new thread, and on the H200 soak glibc's count of live heap grew
    linearly with the groups, with Python's objects and the pinned cache flat and no such growth
    on the CPU (ledger figure soak.host_rss_growth); on pooled threads it stayed flat. Which
    library keeps that state per thread was not pinned down."""

    def __init__(self, handle, name: str = "bestofn-request"):
        self._handle, self._name = handle, name
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self.started = 0

    def submit(self, *args) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1  # an idle thread takes it
            else:
                self.started += 1
                threading.Thread(
                    target=self._loop, daemon=True, name=f"{self._name}-{self.started}"
                ).start()
        self._todo.put(args)

    def _loop(self) -> None:
        while True:
            args = self._todo.get()
            try:
                self._handle(*args)
            finally:
                with self._lock:
                    self._idle += 1


class WorkerServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False

    def process_request(self, request, client_address):
        # ThreadingMixIn's handling (errors logged, the socket closed) on a pooled thread
        self.request_threads.submit(request, client_address)

    def __init__(self, socket_path: str, worker: Worker):
        self.worker = worker
        self.socket_path = socket_path
        self.request_threads = RequestThreads(self.process_request_thread)
        if os.path.exists(socket_path):
            os.unlink(socket_path)
        old = os.umask(0o177)  # the socket is created 0600: owner only
        try:
            super().__init__(socket_path, Handler)
        finally:
            os.umask(old)
        os.chmod(socket_path, 0o600)
        self.socket_inode = os.stat(socket_path).st_ino
        worker.on_exit = self.unlink_socket

    def unlink_socket(self) -> None:
        """Remove our socket file, never a successor's that was bound at the same path."""
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.socket_path).st_ino == self.socket_inode:
                os.unlink(self.socket_path)

    def begin_shutdown(self):
        def stop():
            self.worker.stopping.set()
            with self.worker.gate:  # let the group in flight (and those queued) finish
                pass
            # ...and the answers still being sent (a speech stream outlives its batch)
            deadline = time.monotonic() + EXIT_GRACE_S
            while self.worker.in_flight and time.monotonic() < deadline:
                time.sleep(0.02)
            self.shutdown()

        threading.Thread(target=stop, daemon=True).start()

    def reap_when_idle(self, poll_s: float = 0.5):
        def loop():
            while not self.worker.stopping.is_set():
                if self.worker.idle_for() > self.worker.idle_timeout_s:
                    log.info("idle for %.0f s: exiting", self.worker.idle_timeout_s)
                    self.begin_shutdown()
                    return
                time.sleep(poll_s)

        threading.Thread(target=loop, daemon=True).start()


def serve(socket_path: str, worker: Worker) -> None:
    """Serve ``worker`` on ``socket_path`` until it is stopped, idle or dying."""
    slot = worker.slot
    server = WorkerServer(socket_path, worker)
    worker.timeline["ready_unix"] = time.time()  # the socket answers /health from now on
    log_json("worker-start", worker.start_report())
    server.reap_when_idle()
    log.info("slot %s: serving on %s (pid %d)", slot, socket_path, os.getpid())
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        if worker.fatal:  # never a normal interpreter exit from a poisoned CUDA context
            worker.exit_now()
        server.server_close()
        server.unlink_socket()
        log.info("slot %s: stopped after %d groups", slot, worker.groups_served)
