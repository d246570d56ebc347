"""`bestofn worker`: one long-lived process per slot (GPU). Loads the configured models once,
then serves over a Unix socket that only its owner can reach:

  GET  /health              models loaded, load count, groups served, queue, uptime, hash
  POST /v1/groups           run one group (same pipeline and atomic write as a group job)
  POST /v1/audio/speech     OpenAI-style single render, streamed as it is produced (see
                            ``Worker.speech_job``); requests arriving together are batched
  POST /v1/shutdown         finish the group in flight, then exit

Groups take the GPU one at a time (the GPU is the bottleneck); further requests wait in a FIFO
queue, so with two clients per slot the next group is already waiting when one finishes. With
``runtime.overlap`` (``bestofn.pipeline.OVERLAP_MODES``; ``host`` by default on CUDA) a group
leaves the gate after its GPU stages and is written (FLACs, parquet, its scorers' deferred text
work) in its own request thread while the next group runs on the GPU; ``full`` also has the
next group generate while one is restored and scored (a second gate and CUDA stream). The worker
exits by itself after ``idle_timeout_s`` with nothing running or queued.

A worker never serves after a fatal device error (``fatal_device_error``): it answers that
request with a 500 that says it is exiting, answers every queued or later request with a 503,
and exits the process (``EXIT_FATAL``) as soon as those answers are out. The group was not
published (nothing is written before the whole group is scored), and the client's retry
starts a fresh worker: ``/health`` says ``"status": "dying"`` until the process is gone.

Speech (``bestofn serve`` is its HTTP front): a request becomes a ``SpeechJob``; the
``SpeechBatcher`` thread collects the jobs that arrive within a short window of the first one,
up to a largest batch (both from the environment of the process that starts the worker:
BESTOFN_SPEECH_BATCH_WINDOW_MS, default 5, and BESTOFN_SPEECH_MAX_BATCH, default 64),
and renders them in one ``bestofn.speech.stream_batch`` call, in the same FIFO gate as groups.
With moss-fast, jobs that arrive while it renders join that call at its next sync (every 4
frames, continuous batching through ``bestofn.speech.Feed``), up to the largest batch at once.
Each job's chunks go to its own queue, which the request's thread sends as HTTP chunks (wav,
pcm) or as one body (flac). A client that leaves mid-stream cancels only its job: the batch
goes on for the others (and stops early once every job in it is cancelled or complete);
nothing ever blocks on a client that is gone. Speech is the generator's audio: the restorer
and scorers are for groups."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import numpy as np

from bestofn import speech as speech_io
from bestofn.pipeline import (
    EMPTY_TAKE_S,
    Backends,
    generate_stage,
    load_backends,
    resolve_overlap,
    restore_stage,
    score_stage,
    write_stage,
)
from bestofn.spec import GroupSpec

log = logging.getLogger("bestofn.worker")

MAX_BODY = 1 << 20  # requests are small JSON documents
SPEECH_WINDOW_MS = 5.0  # default batching window (BESTOFN_SPEECH_BATCH_WINDOW_MS)
SPEECH_MAX_BATCH = 64  # default largest speech batch (BESTOFN_SPEECH_MAX_BATCH)
SPEECH_WAIT_S = 0.5  # a speech request's thread looks this often whether the worker is dying
EXIT_FATAL = 70  # exit status after a fatal device error (EX_SOFTWARE)
EXIT_GRACE_S = 30.0  # at most this long to get the answers out before exiting anyway

# Messages of errors after which the CUDA context (or the device) cannot be trusted. A CUDA
# kernel fault is "sticky": every later CUDA call in the process fails or, worse, computes
# garbage, so the only recovery is a new process. torch raises them as torch.AcceleratorError
# ("CUDA error: ..."); NeMo, cuDNN, cuBLAS and onnxruntime's CUDA provider raise RuntimeError
# or their own types with these messages.
_FATAL_MESSAGES = (
    "cuda error",  # any cudaError_t that torch reports (C10_CUDA_CHECK), OOM excepted below
    "device-side assert",
    "illegal memory access",
    "an illegal instruction",
    "misaligned address",
    "unspecified launch failure",
    "cuda failure",  # onnxruntime's CUDA execution provider
    "cudnn_status_execution_failed",
    "cudnn_status_internal_error",
    "cublas_status_execution_failed",
    "cublas_status_internal_error",
    "uncorrectable ecc error",
    "cuda driver",
    "nccl error",
)


def fatal_device_error(exc: BaseException) -> str | None:
    """Why ``exc`` (or an exception it was raised from) leaves the device unusable, else None.

    Fatal: torch.AcceleratorError and every error whose message names a CUDA error, a
    device-side assert, an illegal address or instruction, a launch failure, or a cuDNN /
    cuBLAS execution or internal failure. Those are sticky: the process's CUDA context is
    poisoned, so a worker that went on would fail (or silently corrupt) every later group.
    An unknown "CUDA error: ..." counts as fatal: a needless restart costs one model load,
    serving from a broken context costs every later group.

    Not fatal: running out of memory (torch.OutOfMemoryError, "CUDA out of memory", "CUDA
    error: out of memory"). An allocation that failed never ran a kernel; the context stays
    valid and the memory of the failed group is released when its tensors go, so the worker
    frees its cache and keeps serving (the group itself fails and is retried). Errors without
    a device in them (a bad option, a scorer bug) are not fatal either."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        names = {t.__name__ for t in type(e).__mro__}
        text = str(e).lower()
        oom = "OutOfMemoryError" in names or "out of memory" in text
        if not oom and ("AcceleratorError" in names or any(m in text for m in _FATAL_MESSAGES)):
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            return f"{type(e).__name__}: {first}"
        e = e.__cause__ or e.__context__
    return None


class BadRequest(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


class GroupStageError(RuntimeError):
    """A stage of a group failed; the message names the group and the stage, the cause is
    chained (``fatal_device_error`` looks through it)."""


class FifoGate:
    """A lock that admits waiters in arrival order and counts them (the queue length)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def __enter__(self):
        with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._cond.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc):
        with self._cond:
            self._serving += 1
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        with self._cond:
            return max(0, self._next_ticket - self._serving - 1)

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._next_ticket > self._serving


_END = object()  # a job's queue: its last chunk was delivered


class SpeechJob:
    """One speech request inside the worker: its spec, and the queue its chunks arrive in."""

    def __init__(self, spec: GroupSpec, fmt: str):
        self.spec, self.fmt = spec, fmt
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # ndarray, _END or an exception
        self.cancelled = threading.Event()  # the client left: drop its chunks
        self.done = False  # batcher side: _END or an error was delivered
        self.ended: BaseException | bool = False  # reader side: True or the error it got
        self.submitted = time.monotonic()

    def put(self, item) -> None:
        if not self.done:
            self.events.put(item)
            self.done = item is _END or isinstance(item, BaseException)

    def get(self, worker: Worker):
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
            if item is _END:
                self.ended = True
                return None
            if isinstance(item, BaseException):
                self.ended = item
                raise item
            return item


class SpeechBatcher:
    """Collects speech jobs into batches and renders each batch in one generator call (one
    thread, started with the first job)."""

    def __init__(self, worker: Worker, window_s: float, max_batch: int):
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
                with worker._device_guard():
                    feed = speech_io.Feed(  # moss-fast: later requests join this decode
                        lambda n: self._join(batch, n),
                        lambda i: batch[i].cancelled.is_set(),
                        self.max_batch,
                    )
                    chunks = speech_io.stream_batch(
                        worker.backends.generator, [j.spec for j in batch], feed
                    )
                    try:
                        for i, audio, last in chunks:
                            batch[i].put(audio)
                            if last:
                                batch[i].put(_END)
                            if all(j.cancelled.is_set() or j.done for j in batch):
                                break  # every client left (or got all): stop rendering
                    finally:
                        chunks.close()
                for job in batch:  # a generator that forgot a request must not hang it
                    job.put(RuntimeError("the generator ended without finishing this request"))
                worker.speech_served += len(batch)
            except Exception as e:
                log.exception("speech batch of %d failed", len(batch))
                if fatal_device_error(e) is None:
                    _release_cached_memory()
                for job in batch:
                    job.put(e)
            finally:
                worker.last_active = time.monotonic()
                with self.cond:
                    self.batches += 1
                    self.jobs += len(batch)
                    self.largest = max(self.largest, len(batch))


class Worker:
    def __init__(
        self,
        models: dict,
        models_hash: str,
        results_dir: Path,
        device: str,
        slot: int,
        idle_timeout_s: float,
        flac_subtype: str = "PCM_16",
        worker_key: str | None = None,
        overlap: str | None = None,
    ):
        from bestofn.worker.contract import worker_key as key_of
        from bestofn.worker.contract import worker_spec

        self.models_hash = models_hash
        # The spec this worker serves; the group job that started it passes its key (which
        # also covers the physical GPU behind the slot); computed here when started by hand.
        visible = os.environ.get("CUDA_VISIBLE_DEVICES") if device.startswith("cuda") else None
        self.spec = worker_spec(models, device, flac_subtype, results_dir, visible)
        self.worker_key = worker_key or key_of(self.spec)
        self.results_dir = results_dir.resolve()
        self.device = device
        self.slot = slot
        self.idle_timeout_s = idle_timeout_s
        self.flac_subtype = flac_subtype
        self.started = time.monotonic()
        # runtime.overlap (bestofn.pipeline.OVERLAP_MODES), else BESTOFN_OVERLAP, else auto
        self.overlap = resolve_overlap(overlap or os.environ.get("BESTOFN_OVERLAP"), device)
        from bestofn.gpu_memory import cap_from_environment

        # runtime.gpu_memory_gb, before any model loads (a cap too large for the device: error)
        self.gpu_memory_cap = cap_from_environment(device)
        self.backends: Backends = load_backends(models, device=device)
        self._post_stream = None  # overlap 'full': restore + score on their own CUDA stream
        if device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(device)  # the weights are in place before any other stream
            if self.overlap == "full":
                self._post_stream = torch.cuda.Stream(device)
        # 'full': restore + score have their own gate, so the next group generates meanwhile
        self.post_gate = FifoGate() if self.overlap == "full" else None
        self.write_gate = FifoGate()  # groups are written in the order they were generated
        self.groups_started = 0
        self.gpu_stages = 0  # GPU stages running now (overlap: the worker is idle at 0)
        self.gpu_free_at = time.monotonic()
        self.load_count = 1
        self.groups_served = 0
        self.speech_served = 0
        self.gate = FifoGate()
        self.in_flight = 0
        self.last_active = time.monotonic()  # end of the last job (or readiness)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.fatal: str | None = None  # set once: the device error this worker dies of
        self.open_requests = 0  # POSTs not yet answered (the fatal exit waits for them)
        self.on_exit = None  # set by the server: cleanup before a fatal exit
        window_ms = float(os.environ.get("BESTOFN_SPEECH_BATCH_WINDOW_MS", SPEECH_WINDOW_MS))
        max_batch = int(os.environ.get("BESTOFN_SPEECH_MAX_BATCH", SPEECH_MAX_BATCH))
        self.speech_batcher = SpeechBatcher(self, window_ms / 1000.0, max_batch)
        log.info("slot %s: models loaded in %.1f s on %s", slot, self.backends.load_s, device)

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
            "load_s": self.backends.load_s,
            "overlap": self.overlap,
            "groups_served": self.groups_served,
            "speech_served": self.speech_served,
            "gpu_memory_cap": self.gpu_memory_cap,
            "speech_batching": self.speech_batcher.stats(),
            "queue_length": self.gate.waiting,
            "busy": self.gate.busy,
            "uptime_s": time.monotonic() - self.started,
            "results_dir": str(self.results_dir),
        }

    def _confined(self, out: str) -> Path:
        path = Path(out)
        path = (path if path.is_absolute() else Path.cwd() / path).resolve()
        if self.results_dir not in path.parents:
            raise BadRequest(
                403, f"out {out!r} is outside the results directory {self.results_dir}"
            )
        return path

    def refuse_if_dying(self) -> None:
        if self.fatal:
            raise BadRequest(
                503,
                f"worker pid {os.getpid()} is exiting after a fatal device error ({self.fatal}); "
                "nothing was run; a retry gets a fresh worker",
            )

    def run_group(self, body: dict) -> dict:
        if body.get("worker_key") != self.worker_key:
            raise BadRequest(
                409,
                f"worker serves spec {self.worker_key}, request wants {body.get('worker_key')} "
                "(models, device, flac_subtype and results directory must all match)",
            )
        try:
            spec = GroupSpec(**body["spec"])
        except (KeyError, TypeError) as e:
            raise BadRequest(400, f"bad group spec: {e}") from None
        if not isinstance(spec.n_takes, int) or spec.n_takes < 1:
            raise BadRequest(400, f"n_takes must be a positive integer, got {spec.n_takes!r}")
        if spec.reference_audio:
            ref = Path(spec.reference_audio)
            if not ref.is_file():
                raise BadRequest(400, f"reference_audio {spec.reference_audio!r} does not exist")
        out = self._confined(str(body.get("out", "")))
        workdir = body.get("workdir")
        with self._active():
            if self.overlap == "off":  # the whole group in the gate, one group at a time
                with self.gate:
                    work, idle, first = self._gpu_stages(spec, gated=True)
                    timings = self._write_stage(work, out, workdir, idle, first)
            else:  # the GPU stages in the gate; written while the next group runs on the GPU
                work, idle, first = self._gpu_stages(spec)
                with self.write_gate:
                    timings = self._write_stage(work, out, workdir, idle, first)
        return {"group_id": spec.group_id, "out": str(out), "timings": timings, "idle_s": idle}

    @contextlib.contextmanager
    def _stage(self, spec: GroupSpec, stage: str, gpu: bool = True):
        """A stage of a group: fatal device errors end the worker (``_device_guard``); every
        error names the group and the stage."""
        if gpu:
            with self.lock:
                self.gpu_stages += 1
        try:
            with self._device_guard() if gpu else contextlib.nullcontext():
                try:
                    yield
                except Exception as e:
                    raise GroupStageError(
                        f"group {spec.group_id}: {stage} failed: {type(e).__name__}: {e}"
                    ) from e
        finally:
            if gpu:
                with self.lock:
                    self.gpu_stages -= 1
                    self.gpu_free_at = time.monotonic()
            self.last_active = time.monotonic()

    def _gpu_stages(self, spec: GroupSpec, gated: bool = False):
        """Generate, restore and score (``overlap: full``: generate in the gate, restore and
        score in ``post_gate`` on their own CUDA stream). Returns (work, idle s, first).
        ``gated``: the caller holds the gate already (``overlap: off``)."""
        defer = self.overlap != "off"  # scorers' host work finishes in the write stage
        with contextlib.nullcontext() if gated else self.gate:
            self.refuse_if_dying()  # queued behind the group that broke the device
            now = time.monotonic()
            if self.overlap == "off":
                idle = now - self.last_active
            else:  # the GPU's own idle time: 0 while another group's stage runs
                with self.lock:
                    idle = 0.0 if self.gpu_stages else now - self.gpu_free_at
            first = self.groups_started == 0
            self.groups_started += 1
            with self._stage(spec, "generate"):
                work = generate_stage(spec, self.backends, self.device)
            if self.post_gate is None:
                with self._stage(spec, "restore/score"):
                    score_stage(restore_stage(work, self.backends), self.backends, defer)
                return work, idle, first
        with self.post_gate:
            self.refuse_if_dying()
            import torch

            with self._stage(spec, "restore/score"), torch.cuda.stream(self._post_stream):
                score_stage(restore_stage(work, self.backends), self.backends, defer)
        return work, idle, first

    def _write_stage(self, work, out: Path, workdir, idle: float, first: bool) -> dict:
        with self._stage(work.spec, "write", gpu=False):
            timings = write_stage(
                work,
                self.backends,
                out,
                flac_subtype=self.flac_subtype,
                charged_load_s=self.backends.load_s if first else 0.0,
                worker_idle_s=idle,
                worker_slot=self.slot,
                paths_relative_to=Path(workdir) if workdir else None,
                overlap=self.overlap,
            )
        self.groups_served += 1
        return timings

    def speech_job(self, body: dict) -> SpeechJob:
        """Check a speech request and make its job. Fields: ``input``, ``response_format``
        (wav, flac, pcm), ``model``, ``seed`` (default 0), ``voice`` ("default" or a label),
        ``emotion``, ``reference_audio`` (a file; this socket is owner-only), and
        ``emotion_description`` / ``negative_description``; ``worker_key``, when given, must be
        this worker's. Call inside ``_active()``: a stopping worker refuses with 503."""
        if self.stopping.is_set():
            raise BadRequest(503, "worker is stopping")
        key = body.get("worker_key")
        if key is not None and key != self.worker_key:
            raise BadRequest(409, f"worker serves spec {self.worker_key}, request wants {key}")
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise BadRequest(400, "'input' must be a non-empty string")
        fmt = body.get("response_format", "wav")
        if fmt not in speech_io.FORMATS:
            raise BadRequest(
                400, f"response_format {fmt!r} not supported; use {', '.join(speech_io.FORMATS)}"
            )
        model = body.get("model", self.backends.generator.name)
        if model not in (self.backends.generator.name, "bestofn"):
            raise BadRequest(
                400, f"model {model!r} is not served here ({self.backends.generator.name})"
            )
        seed = body.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
            raise BadRequest(400, "'seed' must be a non-negative integer")
        voice = body.get("voice") or "default"
        ref = body.get("reference_audio") or None
        if ref is not None and not Path(ref).is_file():
            raise BadRequest(400, f"reference_audio {ref!r} of voice {voice!r} does not exist")
        texts = {}
        for field in ("emotion", "emotion_description", "negative_description"):
            value = body.get(field) or ""
            if not isinstance(value, str):
                raise BadRequest(400, f"{field!r} must be a string")
            texts[field] = value
        spec = GroupSpec(
            texts["emotion"], "api", " ".join(text.split()), 1, seed,
            reference_audio=ref, emotion_description=texts["emotion_description"],
            negative_description=texts["negative_description"],
        )  # fmt: skip
        return SpeechJob(spec, fmt)

    @contextlib.contextmanager
    def _device_guard(self):
        """Inside the gate: a fatal device error marks the worker dying before the gate lets
        the next queued request in, so nothing else ever runs on the broken context."""
        try:
            yield
        except Exception as e:
            reason = fatal_device_error(e)
            if reason is not None:
                self.die(reason)
            raise

    @contextlib.contextmanager
    def _active(self):
        """Count a request as in flight (queued or running): the idle reaper waits for zero."""
        with self.lock:
            self.in_flight += 1
        try:
            yield
        finally:
            with self.lock:
                self.in_flight -= 1
            self.last_active = max(self.last_active, time.monotonic())

    def idle_for(self) -> float:
        with self.lock:
            if self.in_flight:
                return 0.0
        return time.monotonic() - self.last_active

    # ---- fatal device errors ---------------------------------------------------------------

    def die(self, reason: str) -> None:
        """Stop taking work and exit once every open request has its answer."""
        with self.lock:
            if self.fatal:
                return
            self.fatal = reason
        self.stopping.set()
        log.error(
            "slot %s: fatal device error (%s): answering open requests with errors, then "
            "exiting; the CUDA context of this process is not used again",
            self.slot,
            reason,
        )
        threading.Thread(target=self._exit_when_answered, daemon=True).start()

    def _exit_when_answered(self) -> None:
        deadline = time.monotonic() + EXIT_GRACE_S
        while time.monotonic() < deadline:
            with self.lock:
                if self.open_requests == 0:
                    break
            time.sleep(0.02)
        self.exit_now()

    def exit_now(self) -> None:
        """Leave at once: no interpreter shutdown, no CUDA teardown in a poisoned context."""
        with contextlib.suppress(Exception):
            if self.on_exit is not None:
                self.on_exit()
        log.error(
            "slot %s: worker pid %d exited after a fatal device error (%s), %d groups served",
            self.slot,
            os.getpid(),
            self.fatal,
            self.groups_served,
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_FATAL)


class Handler(BaseHTTPRequestHandler):
    server_version = "bestofn-worker"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # route through logging, not stderr
        log.info("%s %s", self.command, fmt % args)

    @property
    def worker(self) -> Worker:
        return self.server.worker

    def _send(self, status: int, body, ctype: str = "application/json"):
        data = json.dumps(body).encode() if ctype == "application/json" else body
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client went away (e.g. its job was killed); the work is done regardless.
            log.warning("client left before the response to %s", self.path)

    def _json_body(self) -> dict:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BadRequest(400, "bad Content-Length") from None
        if length <= 0 or length > MAX_BODY:
            raise BadRequest(
                400 if length <= 0 else 413, f"body length {length} not in 1..{MAX_BODY}"
            )
        try:
            body = json.loads(self.rfile.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(400, f"body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise BadRequest(400, "body must be a JSON object")
        return body

    def _speech(self, body: dict) -> None:
        """Render one request through the batcher; send its audio as it comes. Errors before
        the first chunk are ordinary error answers; after it the connection is cut (the
        response is then visibly incomplete: no terminating chunk)."""
        worker = self.worker
        with worker._active():
            job = worker.speech_job(body)
            worker.speech_batcher.submit(job)
            try:
                self._stream_job(job)
            finally:
                job.cancelled.set()  # finished or not, nothing more is wanted

    def _stream_job(self, job: SpeechJob) -> None:
        worker = self.worker
        gen = worker.backends.generator
        first = job.get(worker)  # raises (-> an error answer) before anything is sent
        layout: tuple = ()  # channels of the (empty) chunks skipped: () mono, (2,) stereo
        while first is not None and first.shape[0] == 0:
            layout = first.shape[1:]
            first = job.get(worker)
        if first is None:  # no audio at all: a short silence, as an empty take is published
            # (the end was read: the job's get() says None from now on, it never waits again)
            n = max(1, int(round(EMPTY_TAKE_S * gen.sample_rate)))
            first = np.zeros((n, *layout), np.float32)
        channels = 1 if first.ndim == 1 else first.shape[1]
        enc = speech_io.Encoder(job.fmt, gen.sample_rate, channels)
        if job.fmt not in speech_io.STREAMED_FORMATS:  # flac: one body, once complete
            enc.chunk(first)
            while (audio := job.get(worker)) is not None:
                enc.chunk(audio)
            data = enc.finish()
            self.send_response(200)
            self.send_header("Content-Type", speech_io.CONTENT_TYPES[job.fmt])
            self.send_header("Content-Length", str(len(data)))
            self._audio_headers(enc)
            self.send_header("X-Audio-Seconds", f"{enc.seconds:.6f}")
            self.end_headers()
            self._write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", speech_io.CONTENT_TYPES[job.fmt])
        self.send_header("Transfer-Encoding", "chunked")
        self._audio_headers(enc)
        self.end_headers()
        audio = first
        try:
            while audio is not None:
                self._write_chunk(enc.chunk(audio))
                audio = job.get(worker)
            self._write_chunk(enc.finish())
            self._write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            log.warning("speech client left mid-stream after %.2f s of audio", enc.seconds)
        except Exception:
            self.close_connection = True  # cut: the client sees the stream did not end
            log.exception("speech render failed mid-stream after %.2f s of audio", enc.seconds)

    def _audio_headers(self, enc: speech_io.Encoder) -> None:
        self.send_header("X-Sample-Rate", str(enc.rate))
        self.send_header("X-Channels", str(enc.channels))

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def _write_chunk(self, data: bytes) -> None:
        if data:
            self._write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def _drain_body(self) -> None:
        with contextlib.suppress(ValueError):
            length = int(self.headers.get("Content-Length") or 0)
            if 0 < length <= MAX_BODY:
                self.rfile.read(length)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, self.worker.health())
        else:
            self._send(404, {"error": f"no such endpoint GET {self.path}"})

    def do_POST(self):
        worker = self.worker
        with worker.lock:
            worker.open_requests += 1
        try:
            self._post()
        finally:
            with worker.lock:
                worker.open_requests -= 1

    def _post(self):
        worker = self.worker
        try:
            if self.path in ("/v1/groups", "/v1/audio/speech"):
                worker.refuse_if_dying()
            if self.path == "/v1/groups":
                if worker.stopping.is_set():
                    raise BadRequest(503, "worker is stopping")
                self._send(200, worker.run_group(self._json_body()))
            elif self.path == "/v1/audio/speech":
                self._speech(self._json_body())
            elif self.path == "/v1/shutdown":
                self._drain_body()  # a body left unread would parse as the next request
                self._send(200, {"status": "stopping"})
                self.server.begin_shutdown()
            else:
                self._send(404, {"error": f"no such endpoint POST {self.path}"})
        except BadRequest as e:
            self._send(e.status, {"error": str(e), "worker_exiting": bool(worker.fatal)})
        except Exception as e:
            reason = fatal_device_error(e)
            if reason is None:  # a failed group: report it, keep serving
                log.exception("request %s failed", self.path)
                _release_cached_memory()
                self._send(500, {"error": f"{type(e).__name__}: {e}"})
                return
            log.exception("request %s hit a fatal device error", self.path)
            worker.die(reason)
            self._send(
                500,
                {
                    "error": f"fatal device error in worker pid {os.getpid()}: {reason}. The "
                    "worker is exiting and the group was not published; a retry gets a fresh "
                    "worker",
                    "fatal": reason,
                    "worker_exiting": True,
                    "pid": os.getpid(),
                },
            )


def _release_cached_memory() -> None:
    """After a failed request (e.g. out of memory), give the failed group's cached blocks
    back, so the next group starts from the same free memory as a fresh worker."""
    torch = sys.modules.get("torch")  # never import torch just for this
    if torch is not None:
        with contextlib.suppress(Exception):
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()


class WorkerServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, socket_path: str, worker: Worker):
        self.worker = worker
        self.socket_path = socket_path
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


def serve(
    socket_path: str,
    models: dict,
    models_hash: str,
    results_dir: str,
    device: str,
    slot: int,
    idle_timeout_s: float,
    flac_subtype: str = "PCM_16",
    worker_key: str | None = None,
    overlap: str | None = None,
) -> None:
    worker = Worker(
        models, models_hash, Path(results_dir), device, slot, idle_timeout_s, flac_subtype,
        worker_key, overlap,
    )  # fmt: skip
    server = WorkerServer(socket_path, worker)
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
