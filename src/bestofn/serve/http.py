"""`bestofn serve`: an OpenAI-compatible speech endpoint in front of the warm worker.

    POST /v1/audio/speech   {model, input, voice, response_format, stream_format, speed,
                            instructions, seed} -> audio, streamed as it is rendered
    GET  /v1/models         the served model ids
    GET  /v1/audio/voices   the voices: "default" and every emotion of the emotions sheet
    GET  /health            the worker (running or not), batching, time to first audio, RTF

Every answer, errors included, is JSON: a method an endpoint does not take (DELETE, PUT, an
unknown word) is a 405 naming the ones it does in ``Allow``; a request line or header the
stdlib's parser refuses is its 400/414/431/505 in the same shape, never the stdlib's HTML page.
HEAD is GET without the body.

Lazy: the server itself loads no model. The first request starts the same warm worker the
workflow uses (``bestofn.worker.client.group_job.ensure_worker``: same state directory, same worker
key),
later requests reuse it; the worker exits after ``runtime.idle_timeout_s`` idle (freeing the
GPU) and the next request starts it again. A changed config (or emotions sheet) is read again
on the next request; a different worker key replaces the worker.

Safe by default: it listens on loopback only. Any other address needs an API key (``--api-key``
or BESTOFN_API_KEY); clients send it as ``Authorization: Bearer KEY``, and without one the
server refuses to start. Request bodies are bounded (64 KiB), requests in flight too.

A request is checked as a sheet row is (empty text, more than ``max_words`` words, an unknown
voice: 400 with the reason) before it reaches the worker. ``voice`` names a configured emotion
(its reference voice and description) or the voice id ``default`` (the generator's own voice),
never a file (``bestofn.serve.service``). The worker batches requests that arrive together
(``bestofn.worker.speech_batcher``); with moss-fast, requests that arrive while a batch decodes
join it at its next sync (every 4 frames: continuous batching, ``bestofn.moss.continuous``)."""

from __future__ import annotations

import base64
import contextlib
import hmac
import http.client
import json
import logging
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bestofn.core import speech as speech_io
from bestofn.serve.service import (
    API_KEY_ENV,
    CLIENT_TIMEOUT_S,
    MAX_BODY,
    UPSTREAM_TIMEOUT_S,
    ApiError,
    Service,
    Snapshot,
    bind_refusal,
    is_loopback,
)

__all__ = ["Service", "SpeechServer", "bind_refusal", "is_loopback", "main"]

log = logging.getLogger("bestofn.serve.http")

# Each endpoint and the methods it takes: anything else there is a 405 with this ``Allow``.
ROUTES = {
    "/v1/audio/speech": ("POST",),
    "/v1/models": ("GET", "HEAD"),
    "/v1/audio/voices": ("GET", "HEAD"),
    "/health": ("GET", "HEAD"),
}


class Handler(BaseHTTPRequestHandler):
    server_version = "bestofn-serve"
    protocol_version = "HTTP/1.1"
    timeout = CLIENT_TIMEOUT_S

    def log_message(self, fmt, *args):
        log.debug("%s %s", self.address_string(), fmt % args)

    @property
    def service(self) -> Service:
        return self.server.service

    # ---- plumbing ----------------------------------------------------------------------------

    def _send_json(self, status: int, body: dict, extra: dict | None = None) -> None:
        data = json.dumps(body).encode()
        extra = dict(extra or {})
        if self.close_connection:  # a body left unread: tell the client not to reuse it
            extra.setdefault("Connection", "close")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, TimeoutError):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":  # a HEAD answer has the headers of GET's, no body
                self.wfile.write(data)
            self.wfile.flush()

    def send_error(self, code, message=None, explain=None):
        """The stdlib's own refusals (a request line it cannot parse, a line or header too
        long, a bad version) in the service's JSON shape instead of its HTML page."""
        self.close_connection = True  # the stdlib stops reading this connection after these
        if self.request_version == "HTTP/0.9":  # a line the parser could not read at all: the
            self.request_version = "HTTP/1.0"  # stdlib would send a bare body, no status line
        message = message or self.responses.get(code, ("error",))[0]
        log.debug("%s refused: %d %s", self.address_string(), code, message)
        if code < 200 or code in (204, 205, 304):  # no body allowed
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, TimeoutError):
                self.send_response(code, message)
                self.send_header("Connection", "close")
                self.end_headers()
            return
        self._send_json(code, ApiError(code, message).body(), {"Connection": "close"})

    def parse_request(self) -> bool:
        """The stdlib's parse, then every method but GET, HEAD and POST answered here (the
        stdlib would answer an HTML 501 for a method the handler has no ``do_`` for)."""
        if not super().parse_request():
            return False
        if self.command in ("GET", "HEAD", "POST"):
            return True
        if self._authorized():
            self._drain()
            self._wrong_method(self.path.split("?", 1)[0])
        return False  # answered: the stdlib's loop reads the next request

    def _wrong_method(self, path: str) -> None:
        """404 for a path the service does not have, else 405 naming the methods it takes."""
        allowed = ROUTES.get(path)
        if allowed is None:
            self._error(ApiError(404, f"no such endpoint {self.command} {path}"))
            return
        e = ApiError(405, f"{path} does not take {self.command}; it takes {', '.join(allowed)}")
        self._send_json(405, e.body(), {"Allow": ", ".join(allowed)})

    def _error(self, e: ApiError) -> None:
        extra = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        if e.status in (411, 413):
            self.close_connection = True  # the body was not read
            extra = {**(extra or {}), "Connection": "close"}
        self._send_json(e.status, e.body(), extra)

    def _authorized(self) -> bool:
        key = self.server.api_key
        if not key:
            return True
        got = self.headers.get("Authorization", "")
        scheme, _, token = got.partition(" ")
        token = token.strip().encode()
        ok = scheme.lower() == "bearer" and hmac.compare_digest(token, key.encode())
        if not ok:
            self._drain()
            self._error(ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)"))
        return ok

    def _drain(self) -> None:
        """Read a (bounded) body that will not be used, so the connection stays in step."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if 0 < length <= MAX_BODY:
            with contextlib.suppress(OSError):
                self.rfile.read(length)
        elif length != 0 or self.headers.get("Transfer-Encoding"):
            self.close_connection = True

    def _json_body(self) -> dict:
        if self.headers.get("Transfer-Encoding"):
            raise ApiError(411, "send the body with a Content-Length (no chunked uploads)")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise ApiError(411, "bad Content-Length") from None
        if length > MAX_BODY:
            raise ApiError(413, f"body of {length} bytes; at most {MAX_BODY}")
        if length <= 0:
            raise ApiError(400, "empty body; send a JSON object")
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "body must be a JSON object")
        return body

    # ---- endpoints ---------------------------------------------------------------------------

    def do_GET(self):
        if not self._authorized():
            return
        self._drain()  # a GET may carry a body; read it so the next request stays in step
        path = self.path.split("?", 1)[0]
        if "GET" not in ROUTES.get(path, ("GET",)):
            self._wrong_method(path)
            return
        svc = self.service
        if path == "/health":
            self._send_json(200, self.server.health())
        elif path == "/v1/models":
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "bestofn"}
                    for m in svc.snap.model_ids]  # fmt: skip
            self._send_json(200, {"object": "list", "data": data})
        elif path == "/v1/audio/voices":
            voices = [{"id": v.id, "emotion": v.emotion or None, "description": v.description,
                       "has_reference_audio": v.reference_audio is not None}
                      for v in svc.snap.voices.values()]  # fmt: skip
            self._send_json(200, {"object": "list", "data": voices})
        else:
            self._error(ApiError(404, f"no such endpoint {self.command} {path}"))

    do_HEAD = do_GET

    def do_POST(self):
        if not self._authorized():
            return
        path = self.path.split("?", 1)[0]
        if path != "/v1/audio/speech":
            self._drain()
            self._wrong_method(path)
            return
        gate = self.server.slots
        if not gate.acquire(blocking=False):
            self._drain()
            self._error(ApiError(503, f"busy: {self.server.max_concurrency} requests in flight"))
            return
        metrics = self.service.metrics
        with metrics.lock:
            metrics.in_flight += 1
        try:
            self._speech()
        finally:
            with metrics.lock:
                metrics.in_flight -= 1
            gate.release()

    def _speech(self) -> None:
        svc = self.service
        t0 = time.perf_counter()
        rec = {"at": time.time(), "voice": None, "words": None, "format": None,
               "stream_format": None, "ttfa_s": None, "wall_s": None, "audio_s": 0.0,
               "rtf": None, "outcome": "error", "status": None, "cold": False}  # fmt: skip
        try:
            body = self._json_body()
            snap = svc.current()
            wbody, fmt, stream_format, voice = svc.check(body, snap)
            rec.update(voice=voice.id, words=len(wbody["input"].split()), format=fmt,
                       stream_format=stream_format)  # fmt: skip
            self._relay(snap, wbody, fmt, stream_format, rec, t0)
        except ApiError as e:
            rec["status"] = e.status
            self._error(e)
        except Exception as e:  # a bug: answer it, keep serving
            log.exception("speech request failed")
            rec["status"] = 500
            self._error(ApiError(500, f"{type(e).__name__}: {e}"))
        finally:
            rec["wall_s"] = time.perf_counter() - t0
            if rec["outcome"] == "ok" and rec["audio_s"] > 0:
                rec["rtf"] = rec["wall_s"] / rec["audio_s"]
            svc.metrics.record(rec)
            ttfa = "-" if rec["ttfa_s"] is None else f"{rec['ttfa_s'] * 1000:.0f} ms"
            rtf = "-" if rec["rtf"] is None else f"{rec['rtf']:.3f}"
            log.info(
                "speech %s voice=%s words=%s format=%s/%s ttfa=%s audio=%.2f s wall=%.2f s "
                "rtf=%s", rec["outcome"], rec["voice"], rec["words"], rec["format"],
                rec["stream_format"], ttfa, rec["audio_s"], rec["wall_s"], rtf,
            )  # fmt: skip

    def _upstream(self, snap: Snapshot, wbody: dict, rec: dict):
        """(connection, response) from the worker, starting or replacing it as needed (then
        ``rec["cold"]``: this request waited for a worker to start)."""
        from bestofn.worker.uds_http import UnixHTTPConnection

        payload = json.dumps(wbody).encode()
        for attempt in range(3):
            conn = UnixHTTPConnection(snap.socket_path, timeout=UPSTREAM_TIMEOUT_S)
            try:
                conn.request("POST", "/v1/audio/speech", body=payload,
                             headers={"Content-Type": "application/json"})  # fmt: skip
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                if attempt == 2:
                    raise ApiError(503, f"the worker does not answer ({e})") from None
                rec["cold"] = True
                self.service.ensure_worker(snap)  # lazy start (or a worker that just left)
                continue
            if resp.status in (409, 503) and attempt < 2:  # another spec, stopping or dying
                resp.read()
                conn.close()
                rec["cold"] = True
                self.service.ensure_worker(snap)
                continue
            return conn, resp
        raise AssertionError("unreachable")

    def _relay(self, snap, wbody, fmt, stream_format, rec, t0) -> None:
        conn, resp = self._upstream(snap, wbody, rec)
        try:
            if resp.status != 200:
                raw = resp.read()
                try:
                    message = json.loads(raw).get("error", raw.decode(errors="replace"))
                except (ValueError, AttributeError):
                    message = raw.decode(errors="replace")
                status = resp.status if 400 <= resp.status < 600 else 502
                raise ApiError(status, f"worker: {message}")
            rate = int(resp.getheader("X-Sample-Rate") or 0)
            channels = int(resp.getheader("X-Channels") or 1)
            self._pump(resp, fmt, stream_format, rate, channels, rec, t0, wbody)
        finally:
            conn.close()  # a client that left: the worker's next write fails and its job stops

    def _pump(self, resp, fmt, stream_format, rate, channels, rec, t0, wbody) -> None:
        sse = stream_format == "sse"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if sse else resp.getheader(
            "Content-Type", speech_io.CONTENT_TYPES[fmt]))  # fmt: skip
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Sample-Rate", str(rate))
        self.send_header("X-Channels", str(channels))
        if sse:
            self.send_header("Cache-Control", "no-cache")
        n_bytes = 0
        try:
            self.end_headers()
            while True:
                try:
                    data = resp.read1(1 << 16)
                except (http.client.HTTPException, OSError) as e:  # the worker cut the stream
                    log.error("worker stream broke after %d bytes: %s", n_bytes, e)
                    self.close_connection = True  # no terminating chunk: the client sees it
                    rec["status"] = 502
                    return
                if not data:
                    break
                if rec["ttfa_s"] is None:
                    rec["ttfa_s"] = time.perf_counter() - t0
                n_bytes += len(data)
                if sse:
                    event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                    data = b"data: " + json.dumps(event).encode() + b"\n\n"
                self._chunk(data)
            if fmt == "flac":
                audio_s = float(resp.getheader("X-Audio-Seconds") or 0.0)
            else:
                audio_s = speech_io.bytes_to_seconds(fmt, n_bytes, rate, channels)
            if sse:
                usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                         "audio_seconds": round(audio_s, 6)}  # fmt: skip
                done = {"type": "speech.audio.done", "usage": usage}
                self._chunk(b"data: " + json.dumps(done).encode() + b"\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
            rec["outcome"] = "client_left"
            log.info("client left mid-stream after %d bytes; its render is cancelled", n_bytes)
            return
        rec.update(outcome="ok", status=200, audio_s=audio_s)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class SpeechServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, host: str, port: int, service: Service, api_key: str | None,
                 max_concurrency: int = 256):  # fmt: skip
        refusal = bind_refusal(host, api_key)
        if refusal:
            raise PermissionError(refusal)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.service, self.api_key = service, api_key or None
        self.max_concurrency = max_concurrency
        self.slots = threading.BoundedSemaphore(max_concurrency)
        self.started = time.monotonic()
        # The listen backlog (socketserver's default is 5): 128 clients connecting at once
        # overflowed it and some got "connection reset by peer" (seen on an H200 run).
        self.request_queue_size = max(128, max_concurrency)
        super().__init__((host.strip("[]"), port), Handler)

    def health(self) -> dict:
        svc = self.service
        snap = svc.snap
        worker = svc.worker_health()
        return {
            "status": "ok",
            "config": str(svc.config_path),
            "generator": snap.models["generator"]["backend"],
            "models": list(snap.model_ids),
            "worker_key": snap.key,
            "worker_running": bool(worker and worker["status"] == "ok"),
            "worker": worker,
            "worker_starts": svc.worker_starts,
            "idle_timeout_s": snap.runtime.idle_timeout_s,
            "state_dir": str(snap.pool.dir),
            "slot": snap.slot,
            "auth": bool(self.api_key),
            "uptime_s": round(time.monotonic() - self.started, 3),
            "speech": svc.metrics.summary(),
        }


def main(args) -> int:
    """`bestofn serve` (args from the CLI)."""
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    refusal = bind_refusal(args.host, api_key)
    if refusal:  # before anything else: nothing is read, nothing listens
        print(f"bestofn serve: {refusal}", file=sys.stderr)
        return 2
    from bestofn.core.plan import PlanError

    try:
        service = Service(
            args.config, args.base, args.slot, args.idle_timeout, args.max_batch,
            args.batch_window_ms,
        )  # fmt: skip
    except (PlanError, ValueError, OSError) as e:
        print(f"bestofn serve: error: {e}", file=sys.stderr)
        return 2
    try:
        server = SpeechServer(args.host, args.port, service, api_key, args.max_concurrency)
    except OSError as e:
        print(f"bestofn serve: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in host else host
    print(
        f"bestofn serve: listening on http://{shown}:{port} (config {args.config}; models "
        f"load on the first request; worker idle timeout {service.snap.runtime.idle_timeout_s:g} "
        f"s; auth {'on' if api_key else 'off'})",
        flush=True,
    )
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
