"""A worker's fatal-error lifecycle: which errors leave the device unusable, and how a worker
that met one stops serving and exits.

A worker never serves after a fatal device error (``fatal_device_error``): it answers that
request with a 500 that says it is exiting, answers every queued or later request with a 503,
and exits the process (``EXIT_FATAL``) as soon as those answers are out. The group was not
published (nothing is written before the whole group is scored), and the client's retry
starts a fresh worker: ``/health`` says ``"status": "dying"`` until the process is gone."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time

from bestofn.worker.requests import BadRequest

log = logging.getLogger("bestofn.worker")

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


def release_cached_memory() -> None:
    """After a failed request (e.g. out of memory), give the failed group's cached blocks
    back, so the next group starts from the same free memory as a fresh worker."""
    torch = sys.modules.get("torch")  # never import torch just for this
    if torch is not None:
        with contextlib.suppress(Exception):
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()


class FatalErrorLifecycle:
    """The worker's side of a fatal device error (mixed into ``Worker``): mark it dying inside
    the gate, refuse what is queued, exit once every open request has its answer."""

    slot: int
    groups_served: int

    def _init_lifecycle(self) -> None:
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.fatal: str | None = None  # set once: the device error this worker dies of
        self.open_requests = 0  # POSTs not yet answered (the fatal exit waits for them)
        self.on_exit = None  # set by the server: cleanup before a fatal exit

    @contextlib.contextmanager
    def answering(self):
        """Count a request as open until it is answered: a fatal exit waits for zero."""
        with self.lock:
            self.open_requests += 1
        try:
            yield
        finally:
            with self.lock:
                self.open_requests -= 1

    def refuse_if_dying(self) -> None:
        if self.fatal:
            raise BadRequest(
                503,
                f"worker pid {os.getpid()} is exiting after a fatal device error ({self.fatal}); "
                "nothing was run; a retry gets a fresh worker",
            )

    def on_device_error(self, e: BaseException) -> None:
        """Inside the gate: a fatal device error marks the worker dying before the gate lets
        the next queued request in, so nothing else ever runs on the broken context."""
        reason = fatal_device_error(e)
        if reason is not None:
            self.die(reason)

    @contextlib.contextmanager
    def device_guard(self):
        try:
            yield
        except Exception as e:
            self.on_device_error(e)
            raise

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
