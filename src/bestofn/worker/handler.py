"""The worker's HTTP handler: the endpoints of ``bestofn.worker.server`` over its Unix socket.

  GET  /health              models loaded, load count, groups served, queue, uptime, hash
  POST /v1/groups           run one group (the runner's stages and atomic write)
  POST /v1/audio/speech     OpenAI-style single render, streamed as it is produced; requests
                            arriving together are batched (``bestofn.worker.speech_batcher``)
  POST /v1/shutdown         finish the group in flight, then exit

Speech chunks go out as HTTP chunks (wav, pcm) or as one body (flac). Errors before the first
chunk are ordinary error answers; after it the connection is cut. A fatal device error is
answered with a 500 that says the worker is exiting (``bestofn.worker.lifecycle``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from contextlib import AbstractContextManager
from http.server import BaseHTTPRequestHandler
from typing import Protocol

import numpy as np

from bestofn.core import speech as speech_io
from bestofn.core.pipeline import EMPTY_TAKE_S
from bestofn.worker.lifecycle import fatal_device_error, release_cached_memory
from bestofn.worker.requests import BadRequest
from bestofn.worker.speech_batcher import SpeechJob

log = logging.getLogger("bestofn.worker")

MAX_BODY = 1 << 20  # requests are small JSON documents


class HandledWorker(Protocol):
    """What the handler uses of the worker (``bestofn.worker.server.Worker``), all of it."""

    fatal: str | None  # the device error it dies of
    stopping: threading.Event
    sample_rate: int  # of the generator's audio

    def answering(self) -> AbstractContextManager: ...  # a POST, until it is answered
    def active(self) -> AbstractContextManager: ...  # a request queued or running
    def refuse_if_dying(self) -> None: ...  # raises BadRequest(503)
    def die(self, reason: str) -> None: ...
    def health(self) -> dict: ...
    def run_group(self, body: dict) -> dict: ...
    def speak(self, body: dict) -> SpeechJob: ...  # checked and queued for the batcher


class Handler(BaseHTTPRequestHandler):
    server_version = "bestofn-worker"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # route through logging, not stderr
        log.info("%s %s", self.command, fmt % args)

    @property
    def worker(self) -> HandledWorker:
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
        with worker.active():
            job = worker.speak(body)
            try:
                self._stream_job(job)
            finally:
                job.cancelled.set()  # finished or not, nothing more is wanted

    def _stream_job(self, job: SpeechJob) -> None:
        worker = self.worker
        first = job.get(worker)  # raises (-> an error answer) before anything is sent
        layout: tuple = ()  # channels of the (empty) chunks skipped: () mono, (2,) stereo
        while first is not None and first.shape[0] == 0:
            layout = first.shape[1:]
            first = job.get(worker)
        if first is None:  # no audio at all: a short silence, as an empty take is published
            # (the end was read: the job's get() says None from now on, it never waits again)
            n = max(1, int(round(EMPTY_TAKE_S * worker.sample_rate)))
            first = np.zeros((n, *layout), np.float32)
        channels = 1 if first.ndim == 1 else first.shape[1]
        enc = speech_io.Encoder(job.fmt, worker.sample_rate, channels)
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
        with self.worker.answering():
            self._post()

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
                release_cached_memory()
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
