"""`bestofn worker`: one long-lived process per slot (GPU). Loads the configured models once,
then serves over a Unix socket that only its owner can reach:

  GET  /health              models loaded, load count, groups served, queue, uptime, hash
  POST /v1/groups           run one group (same pipeline and atomic write as a group job)
  POST /v1/audio/speech     OpenAI-style single render: {model, input, voice, response_format}
  POST /v1/shutdown         finish the group in flight, then exit

Groups run one at a time (the GPU is the bottleneck); further requests wait in a FIFO queue,
so with two clients per slot the next group is already waiting when one finishes. The worker
exits by itself after ``idle_timeout_s`` with nothing running or queued."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import soundfile as sf

from bestofn.pipeline import Backends, load_backends, run_group
from bestofn.spec import GroupSpec

log = logging.getLogger("bestofn.worker")

MAX_BODY = 1 << 20  # requests are small JSON documents


class BadRequest(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


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
    ):
        self.models_hash = models_hash
        self.results_dir = results_dir.resolve()
        self.device = device
        self.slot = slot
        self.idle_timeout_s = idle_timeout_s
        self.flac_subtype = flac_subtype
        self.started = time.monotonic()
        self.backends: Backends = load_backends(models, device=device)
        self.load_count = 1
        self.groups_served = 0
        self.speech_served = 0
        self.gate = FifoGate()
        self.in_flight = 0
        self.last_active = time.monotonic()  # end of the last job (or readiness)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        log.info("slot %s: models loaded in %.1f s on %s", slot, self.backends.load_s, device)

    def health(self) -> dict:
        return {
            "status": "stopping" if self.stopping.is_set() else "ok",
            "pid": os.getpid(),
            "slot": self.slot,
            "device": self.device,
            "models_hash": self.models_hash,
            "models_loaded": True,
            "load_count": self.load_count,
            "load_s": self.backends.load_s,
            "groups_served": self.groups_served,
            "speech_served": self.speech_served,
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

    def run_group(self, body: dict) -> dict:
        if body.get("models_hash") != self.models_hash:
            raise BadRequest(
                409,
                f"worker serves models {self.models_hash}, request wants {body.get('models_hash')}",
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
        with self._active():
            with self.gate:
                idle = time.monotonic() - self.last_active
                first = self.groups_served == 0
                try:
                    timings = run_group(
                        spec,
                        self.backends,
                        out,
                        flac_subtype=self.flac_subtype,
                        charged_load_s=self.backends.load_s if first else 0.0,
                        worker_idle_s=idle,
                        device=self.device,
                        worker_slot=self.slot,
                    )
                finally:
                    self.last_active = time.monotonic()
                self.groups_served += 1
        return {"group_id": spec.group_id, "out": str(out), "timings": timings, "idle_s": idle}

    def speech(self, body: dict) -> tuple[bytes, str]:
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise BadRequest(400, "'input' must be a non-empty string")
        fmt = body.get("response_format", "wav")
        if fmt not in ("wav", "flac"):
            raise BadRequest(400, f"response_format {fmt!r} not supported; use wav or flac")
        model = body.get("model", self.backends.generator.name)
        if model not in (self.backends.generator.name, "bestofn"):
            raise BadRequest(
                400, f"model {model!r} is not served here ({self.backends.generator.name})"
            )
        voice = body.get("voice") or None
        if voice in ("default", "alloy"):
            voice = None
        if voice is not None and not Path(voice).is_file():
            raise BadRequest(400, f"voice {voice!r} is neither 'default' nor an audio file")
        seed = body.get("seed", 0)
        if not isinstance(seed, int) or seed < 0:
            raise BadRequest(400, "'seed' must be a non-negative integer")
        spec = GroupSpec("speech", "api", " ".join(text.split()), 1, seed, reference_audio=voice)
        with self._active(), self.gate:
            takes = self.backends.generator.generate(spec)
            audios, sr = self.backends.restorer.restore(
                [t.audio for t in takes], self.backends.generator.sample_rate
            )
            self.last_active = time.monotonic()
            self.speech_served += 1
        buf = io.BytesIO()
        sf.write(buf, audios[0], sr, format=fmt.upper(), subtype="PCM_16")
        return buf.getvalue(), f"audio/{fmt}"

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

    def do_GET(self):
        if self.path == "/health":
            self._send(200, self.worker.health())
        else:
            self._send(404, {"error": f"no such endpoint GET {self.path}"})

    def do_POST(self):
        try:
            if self.path == "/v1/groups":
                if self.worker.stopping.is_set():
                    raise BadRequest(503, "worker is stopping")
                self._send(200, self.worker.run_group(self._json_body()))
            elif self.path == "/v1/audio/speech":
                data, ctype = self.worker.speech(self._json_body())
                self._send(200, data, ctype)
            elif self.path == "/v1/shutdown":
                self._send(200, {"status": "stopping"})
                self.server.begin_shutdown()
            else:
                self._send(404, {"error": f"no such endpoint POST {self.path}"})
        except BadRequest as e:
            self._send(e.status, {"error": str(e)})
        except Exception as e:  # a failed group: report it, keep serving
            log.exception("request %s failed", self.path)
            self._send(500, {"error": f"{type(e).__name__}: {e}"})


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

    def begin_shutdown(self):
        def stop():
            self.worker.stopping.set()
            with self.worker.gate:  # let the group in flight (and those queued) finish
                pass
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
) -> None:
    worker = Worker(
        models, models_hash, Path(results_dir), device, slot, idle_timeout_s, flac_subtype
    )
    server = WorkerServer(socket_path, worker)
    server.reap_when_idle()
    log.info("slot %s: serving on %s", slot, socket_path)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        if os.path.exists(socket_path):
            os.unlink(socket_path)
        log.info("slot %s: stopped after %d groups", slot, worker.groups_served)
