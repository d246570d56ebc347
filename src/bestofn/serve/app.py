"""The ASGI app of `bestofn serve` (Starlette; ``bestofn.serve.http`` runs it on uvicorn).

    POST /v1/audio/speech   OpenAI's request -> audio, streamed as it is rendered
    GET  /v1/models         the served model ids
    GET  /v1/audio/voices   "default" and every emotion of the emotions sheet
    GET  /health            the worker (running or not), batching, time to first audio, RTF
    GET  /metrics           Prometheus text: answers by status, TTFA, audio seconds, queue depth,
                            worker state

Every answer, errors included, is JSON in OpenAI's error shape (``ApiError``): a method an
endpoint does not take is a 405 naming the ones it does in ``Allow``; HEAD is GET without the
body. In front of the routes, in this order: a server that is draining (SIGTERM) answers 503;
an HTTP version other than 1.0/1.1 is a 505; a path over ``MAX_TARGET`` bytes a 414, headers
over ``MAX_HEADERS`` a 431; with an API key, a request without ``Authorization: Bearer KEY``
is a 401. Speech requests beyond ``max_concurrency`` in flight
get a 429 with ``Retry-After``. A body is at most ``MAX_BODY`` bytes (413) and must arrive
within ``body_timeout_s`` (408); an answer a client does not read within ``write_timeout_s``
is cut.

The server loads no model: a speech request starts the workflow's warm worker when none runs
(``Service.ensure_worker``), and is relayed to it over its Unix socket (``Upstream``)."""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import logging
import time
from dataclasses import dataclass, field

import anyio
import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bestofn.core import speech as speech_io
from bestofn.serve import encode, metrics
from bestofn.serve.service import (
    CONTENT_TYPES,
    MAX_BODY,
    UPSTREAM_TIMEOUT_S,
    ApiError,
    Service,
    Snapshot,
)
from bestofn.serve.upstream import Upstream, UpstreamBroken

log = logging.getLogger("bestofn.serve")

# Each endpoint and the methods it takes, in the order ``Allow`` names them.
ROUTES = {
    "/v1/audio/speech": ("POST",),
    "/v1/models": ("GET", "HEAD"),
    "/v1/audio/voices": ("GET", "HEAD"),
    "/health": ("GET", "HEAD"),
    "/metrics": ("GET", "HEAD"),
}
WAV_HEADER = 44  # the worker's streamed WAV: a 44-byte PCM16 header, then samples
MAX_TARGET = 8192  # bytes of a request's path and query: no endpoint here needs more
# bytes of a request's headers, as h11 bounds a head that arrives in pieces (one that arrives
# in one read is parsed whole: bounded here)
MAX_HEADERS = 16 * 1024


@dataclass
class Limits:
    """The service's bounds (the `bestofn serve` options; these defaults are theirs)."""

    max_concurrency: int = 256  # speech requests in flight; more get 429
    body_timeout_s: float = 30.0  # a request body must arrive within this
    write_timeout_s: float = 60.0  # one write to a client that does not read
    retry_after_s: int = 1  # the 429's and the draining 503's Retry-After


@dataclass
class State:
    """What the app's requests share. One event loop runs them all: no locks."""

    api_key: str | None = None
    draining: bool = False
    active: int = 0  # requests being answered, any endpoint
    speech_in_flight: int = 0
    started: float = field(default_factory=time.monotonic)
    limiter: anyio.CapacityLimiter | None = None  # threads for the blocking service calls


def error_response(e: ApiError) -> JSONResponse:
    headers = dict(e.headers)
    if e.status == 401:
        headers.setdefault("WWW-Authenticate", "Bearer")
    return JSONResponse(e.body(), e.status, headers=headers)


def endpoint_label(path: str) -> str:
    """The endpoint a path counts under in /metrics (unknown paths together: bounded labels)."""
    return path if path in ROUTES else "other"


async def drain(request: Request, limits: Limits) -> bool:
    """Read a body that will not be used, so the connection stays in step; False: too big or
    too slow (then the answer closes the connection)."""
    declared = request.headers.get("content-length")
    if declared in (None, "0") and not request.headers.get("transfer-encoding"):
        return True
    if declared is not None and int(declared) > MAX_BODY:
        return False
    n = 0
    try:
        with anyio.fail_after(limits.body_timeout_s):
            async for part in request.stream():
                n += len(part)
                if n > MAX_BODY:
                    return False
    except (TimeoutError, ClientDisconnect):
        return False
    return True


async def read_json(request: Request, limits: Limits) -> dict:
    """The request's JSON object: at most MAX_BODY bytes, within ``body_timeout_s``."""
    close = {"Connection": "close"}
    declared = request.headers.get("content-length")
    if declared is not None and int(declared) > MAX_BODY:  # h11 has checked it is a number
        raise ApiError(413, f"body of {declared} bytes; at most {MAX_BODY}", headers=close)
    raw = bytearray()
    try:
        with anyio.fail_after(limits.body_timeout_s):
            async for part in request.stream():
                raw += part
                if len(raw) > MAX_BODY:
                    raise ApiError(413, f"body over {MAX_BODY} bytes", headers=close)
    except TimeoutError:
        raise ApiError(
            408, f"the body did not arrive within {limits.body_timeout_s:g} s", headers=close
        ) from None
    if not raw:
        raise ApiError(400, "empty body; send a JSON object")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "body must be a JSON object")
    return body


class Gate:
    """Pure ASGI, in front of the routes: draining, HTTP version, API key; counts every answer
    by endpoint and status for /metrics."""

    def __init__(self, app, service: Service, state: State, limits: Limits):
        self.app, self.service, self.state, self.limits = app, service, state, limits

    def _authorized(self, scope) -> bool:
        key = self.state.api_key
        if not key:
            return True
        got = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = got.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), key.encode()
        )

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: list[int] = []

        async def counted(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        st = self.state
        st.active += 1
        try:
            refusal = None
            if st.draining:
                refusal = ApiError(
                    503, "the server is shutting down; send the request elsewhere",
                    headers={"Connection": "close", "Retry-After": str(self.limits.retry_after_s)},
                )  # fmt: skip
            elif scope.get("http_version") not in ("1.0", "1.1"):
                refusal = ApiError(
                    505, f"HTTP/{scope.get('http_version')} is not served; use HTTP/1.1",
                    headers={"Connection": "close"},
                )  # fmt: skip
            elif len(scope.get("raw_path", b"")) + len(scope.get("query_string", b"")) > MAX_TARGET:
                refusal = ApiError(
                    414, f"request target over {MAX_TARGET} bytes", headers={"Connection": "close"}
                )
            elif sum(len(k) + len(v) + 4 for k, v in scope["headers"]) > MAX_HEADERS:
                refusal = ApiError(
                    431, f"headers over {MAX_HEADERS} bytes", headers={"Connection": "close"}
                )
            elif not self._authorized(scope):
                refusal = ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)")
            if refusal is None:
                await self.app(scope, receive, counted)
                return
            if refusal.status == 401 and not await drain(Request(scope, receive), self.limits):
                refusal.headers["Connection"] = "close"
            await error_response(refusal)(scope, receive, counted)
        finally:
            st.active -= 1
            self.service.metrics.answered(endpoint_label(scope["path"]), (status or [500])[0])


class Speech:
    """``POST /v1/audio/speech`` (an ASGI endpoint: the answer streams as the worker renders)."""

    def __init__(self, service: Service, state: State, limits: Limits):
        self.service, self.state, self.limits = service, state, limits

    async def _blocking(self, fn, *args):
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.state.limiter)

    async def __call__(self, scope, receive, send):
        st, svc = self.state, self.service
        request = Request(scope, receive)
        if st.speech_in_flight >= self.limits.max_concurrency:
            retry = {"Retry-After": str(self.limits.retry_after_s)}
            if not await drain(request, self.limits):
                retry["Connection"] = "close"
            e = ApiError(429, f"busy: {self.limits.max_concurrency} requests in flight; retry "
                         f"after {self.limits.retry_after_s} s", headers=retry)  # fmt: skip
            await error_response(e)(scope, receive, send)
            return
        st.speech_in_flight += 1
        svc.metrics.in_flight = st.speech_in_flight
        t0 = time.perf_counter()
        rec = {"at": time.time(), "voice": None, "words": None, "format": None,
               "stream_format": None, "ttfa_s": None, "wall_s": None, "audio_s": 0.0,
               "rtf": None, "outcome": "error", "status": None, "cold": False}  # fmt: skip
        try:
            try:
                body = await read_json(request, self.limits)
                snap = await self._blocking(svc.current)
                wbody, fmt, stream_format, voice = svc.check(body, snap)
                rec.update(voice=voice.id, words=len(wbody["input"].split()), format=fmt,
                           stream_format=stream_format)  # fmt: skip
                up = await self._upstream(snap, wbody, rec)
            except ClientDisconnect:
                rec["outcome"] = "client_left"
                return
            except ApiError as e:
                rec["status"] = e.status
                await error_response(e)(scope, receive, send)
                return
            try:
                await self._relay(up, fmt, stream_format, rec, t0, receive, send)
            finally:
                up.close()  # a client that left: the worker's next write fails, its job stops
        except Exception as e:  # a bug: answered if nothing was sent yet; the server goes on
            log.exception("speech request failed")
            if rec["status"] is None:
                rec["status"] = 500
                with contextlib.suppress(Exception):
                    await error_response(ApiError(500, f"{type(e).__name__}: {e}"))(
                        scope, receive, send
                    )
        finally:
            st.speech_in_flight -= 1
            svc.metrics.in_flight = st.speech_in_flight
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

    async def _upstream(self, snap: Snapshot, wbody: dict, rec: dict) -> Upstream:
        """The worker's answer, starting or replacing the worker as needed (then
        ``rec["cold"]``: this request waited for a worker to start)."""
        for attempt in range(3):
            try:
                up = await Upstream.post(snap.socket_path, wbody, UPSTREAM_TIMEOUT_S)
            except (OSError, UpstreamBroken, TimeoutError) as e:
                if attempt == 2:
                    raise ApiError(503, f"the worker does not answer ({e})") from None
                rec["cold"] = True
                await self._blocking(self.service.ensure_worker, snap)  # lazy start
                continue
            if up.status in (409, 503) and attempt < 2:  # another spec, stopping or dying
                up.close()
                rec["cold"] = True
                await self._blocking(self.service.ensure_worker, snap)
                continue
            if up.status != 200:
                try:
                    raw = await up.body()
                except UpstreamBroken:
                    raw = b""
                up.close()
                try:
                    message = json.loads(raw).get("error", raw.decode(errors="replace"))
                except (ValueError, AttributeError):
                    message = raw.decode(errors="replace")
                status = up.status if 400 <= up.status < 600 else 502
                raise ApiError(status, f"worker: {message}")
            return up
        raise AssertionError("unreachable")

    async def _relay(self, up: Upstream, fmt, stream_format, rec, t0, receive, send) -> None:
        """Send the worker's audio to the client as it comes (encoding mp3, opus, aac here). A
        client that leaves or stops reading ends it; a worker stream that breaks is cut, with
        no last chunk: the client sees the answer is incomplete."""
        sse = stream_format == "sse"
        rate = int(up.headers.get("x-sample-rate") or 0)
        channels = int(up.headers.get("x-channels") or 1)
        encoder = encode.StreamEncoder(fmt, rate, channels) if fmt in encode.FORMATS else None
        content_type = "text/event-stream" if sse else CONTENT_TYPES[fmt]
        headers = [(b"content-type", content_type.encode()),
                   (b"x-sample-rate", str(encoder.rate if encoder else rate).encode()),
                   (b"x-channels", str(channels).encode())]  # fmt: skip
        if sse:
            headers.append((b"cache-control", b"no-cache"))
        state = {"bytes": 0, "left": False, "broken": False}
        pcm_tail = bytearray()  # the worker's WAV samples not yet encoded (a partial frame)
        skip = WAV_HEADER if encoder else 0

        async def out(data: bytes, more: bool = True, event: bool = False) -> None:
            """Send audio bytes (an SSE delta event in SSE), or ``event``: an SSE line as is."""
            if data and not event and rec["ttfa_s"] is None:
                rec["ttfa_s"] = time.perf_counter() - t0
            if sse and data and not event:
                event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                data = b"data: " + json.dumps(event).encode() + b"\n\n"
            if not data and more:
                return
            with anyio.fail_after(self.limits.write_timeout_s):
                await send({"type": "http.response.body", "body": data, "more_body": more})

        def to_float(data: bytes) -> np.ndarray:
            pcm_tail.extend(data)
            usable = len(pcm_tail) - len(pcm_tail) % (2 * channels)
            a = np.frombuffer(bytes(pcm_tail[:usable]), "<i2").astype(np.float32) / 32767.0
            del pcm_tail[:usable]
            return a.reshape(-1, channels) if channels > 1 else a

        def encode_chunk(data: bytes) -> bytes:
            return encoder.chunk(to_float(data))

        async def pump(scope: anyio.CancelScope) -> None:
            nonlocal skip
            try:
                async for data in up.chunks():
                    state["bytes"] += len(data)
                    if encoder is not None:
                        if skip:
                            cut = min(skip, len(data))
                            skip, data = skip - cut, data[cut:]
                        # in a thread: the encoders release the GIL, so many streams encode
                        # on several cores while the event loop keeps relaying
                        data = await anyio.to_thread.run_sync(
                            encode_chunk, data, limiter=self.state.limiter
                        )
                    await out(data)
                scope.cancel()  # the worker is done: stop watching the client
                if encoder is not None:
                    await out(
                        await anyio.to_thread.run_sync(encoder.finish, limiter=self.state.limiter)
                    )
                    audio_s = encoder.seconds
                elif fmt == "flac":
                    audio_s = float(up.headers.get("x-audio-seconds") or 0.0)
                else:
                    audio_s = speech_io.bytes_to_seconds(fmt, state["bytes"], rate, channels)
                if sse:
                    usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                             "audio_seconds": round(audio_s, 6)}  # fmt: skip
                    done = {"type": "speech.audio.done", "usage": usage}
                    await out(b"data: " + json.dumps(done).encode() + b"\n\n", event=True)
                await out(b"", more=False)
                rec.update(outcome="ok", status=200, audio_s=audio_s)
            except UpstreamBroken as e:
                log.error("worker stream broke after %d bytes: %s", state["bytes"], e)
                state["broken"] = True
            except TimeoutError:
                log.info("a client did not read for %g s; its answer is cut",
                         self.limits.write_timeout_s)  # fmt: skip
                state["left"] = True
            finally:
                scope.cancel()

        async def watch(scope: anyio.CancelScope) -> None:
            with scope:
                while (await receive())["type"] != "http.disconnect":
                    pass
                state["left"] = True
                tg.cancel_scope.cancel()

        try:
            with anyio.fail_after(self.limits.write_timeout_s):
                await send({"type": "http.response.start", "status": 200, "headers": headers})
        except TimeoutError:
            state["left"] = True
        if not state["left"]:
            async with anyio.create_task_group() as tg:
                watching = anyio.CancelScope()
                tg.start_soon(watch, watching)
                await pump(watching)
        if state["broken"]:
            rec["status"] = 502
        elif state["left"] and rec["outcome"] != "ok":
            rec["outcome"] = "client_left"
            log.info("client left mid-stream after %d bytes; its render is cancelled",
                     state["bytes"])  # fmt: skip


def build_app(service: Service, state: State, limits: Limits) -> Starlette:
    async def health(request: Request) -> Response:
        worker = await anyio.to_thread.run_sync(service.worker_health, limiter=state.limiter)
        snap = service.snap
        return JSONResponse({
            "status": "draining" if state.draining else "ok",
            "config": str(service.config_path),
            "generator": snap.models["generator"]["backend"],
            "models": list(snap.model_ids),
            "worker_key": snap.key,
            "worker_running": bool(worker and worker["status"] == "ok"),
            "worker": worker,
            "worker_starts": service.worker_starts,
            "idle_timeout_s": snap.runtime.idle_timeout_s,
            "state_dir": str(snap.pool.dir),
            "slot": snap.slot,
            "auth": bool(state.api_key),
            "uptime_s": round(time.monotonic() - state.started, 3),
            "speech": service.metrics.summary(),
        })  # fmt: skip

    async def models(request: Request) -> Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "bestofn"}
                for m in service.snap.model_ids]  # fmt: skip
        return JSONResponse({"object": "list", "data": data})

    async def voices(request: Request) -> Response:
        data = [{"id": v.id, "emotion": v.emotion or None, "description": v.description,
                 "has_reference_audio": v.reference_audio is not None}
                for v in service.snap.voices.values()]  # fmt: skip
        return JSONResponse({"object": "list", "data": data})

    async def prometheus(request: Request) -> Response:
        worker = await anyio.to_thread.run_sync(service.worker_health, limiter=state.limiter)
        text = metrics.render(
            service.metrics, in_flight=state.speech_in_flight, draining=state.draining,
            worker=worker, worker_starts=service.worker_starts,
            uptime_s=time.monotonic() - state.started,
        )  # fmt: skip
        return Response(text, media_type=metrics.CONTENT_TYPE)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        """Starlette's own 404 and 405, in the service's shape."""
        method, path = request.method, request.url.path
        headers = {} if await drain(request, limits) else {"Connection": "close"}
        allowed = ROUTES.get(path)
        if exc.status_code == 405 and allowed:
            headers["Allow"] = ", ".join(allowed)
            e = ApiError(405, f"{path} does not take {method}; it takes {', '.join(allowed)}")
        elif exc.status_code == 404:
            e = ApiError(404, f"no such endpoint {method} {path}")
        else:
            e = ApiError(exc.status_code, str(exc.detail))
        e.headers.update(headers)
        return error_response(e)

    async def api_error(request: Request, exc: ApiError) -> Response:
        return error_response(exc)

    async def lifespan(app):
        state.limiter = anyio.CapacityLimiter(limits.max_concurrency + 16)
        yield

    routes = [
        Route("/v1/audio/speech", Speech(service, state, limits), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/audio/voices", voices, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes, lifespan=lifespan,
        exception_handlers={HTTPException: http_error, ApiError: api_error},
    )  # fmt: skip
    app.router.redirect_slashes = False  # "/health/" is no endpoint: a JSON 404, not a redirect
    return Gate(app, service, state, limits)
