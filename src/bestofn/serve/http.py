"""`bestofn serve`: the OpenAI-compatible speech endpoint (``bestofn.serve.app``, Starlette) on
uvicorn, in front of the warm worker.

uvicorn parses HTTP (h11), keeps connections alive for ``--keep-alive`` seconds between
requests, and serves TLS with ``--ssl-certfile``/``--ssl-keyfile``. Added here, on uvicorn's
h11 protocol (``GuardedH11``):

- a request head (line and headers) must arrive within ``--header-timeout`` seconds of the
  connection opening or of the previous answer (a slow client is cut: 408 if it sent part of
  a head); uvicorn itself bounds idle keep-alive time, not a head that trickles in;
- a request the parser refuses is answered in the service's JSON shape (uvicorn's is plain
  text), with h11's status (400, or 431 for a line or headers over 16 KiB).

Graceful stop (``DrainingServer``): on SIGTERM or SIGINT the server answers every new
request 503 (``Retry-After``, ``Connection: close``) while those in flight finish, for
``--graceful-timeout`` seconds at most, then stops; a second signal stops it at once.

Safe by default: it listens on loopback only. Any other address needs an API key (``--api-key``
or BESTOFN_API_KEY), sent as ``Authorization: Bearer KEY``; without one the server refuses to
start. The server loads no model: the first request starts the workflow's warm worker, which
exits after ``runtime.idle_timeout_s`` idle; the next request starts it again."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from bestofn.serve.app import Limits, State, build_app
from bestofn.serve.service import API_KEY_ENV, ApiError, Service, bind_refusal, is_loopback

__all__ = ["Service", "bind_refusal", "is_loopback", "main"]

log = logging.getLogger("bestofn.serve")


def _raw_json_answer(status: int, reason: str, message: str) -> bytes:
    body = json.dumps(ApiError(status, message).body()).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on request heads and JSON parse refusals.
    ``config.header_timeout_s``: the deadline (set by ``main``)."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_deadline = None
        self._seen_cycle = None
        self._refusal: h11.RemoteProtocolError | None = None
        parse = self.conn.next_event

        def next_event():  # remember why h11 refused a request, for the answer's status
            try:
                return parse()
            except h11.RemoteProtocolError as e:
                self._refusal = e
                raise

        self.conn.next_event = next_event
        self._await_head()

    def _await_head(self) -> None:
        self._stop_waiting()
        timeout = getattr(self.config, "header_timeout_s", 10.0)
        self._head_deadline = self.loop.call_later(timeout, self._head_too_slow)

    def _stop_waiting(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not self._seen_cycle:  # a request's head arrived
            self._seen_cycle = self.cycle
            self._stop_waiting()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.cycle is self._seen_cycle:
            self._await_head()  # the next request's head (unless one is already in)

    def connection_lost(self, exc) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing():
            return
        partial, _ = self.conn.trailing_data
        if partial and self.conn.their_state is h11.IDLE:  # part of a head, never finished
            timeout = getattr(self.config, "header_timeout_s", 10.0)
            log.info("a request head did not arrive within %g s; connection closed", timeout)
            self.transport.write(
                _raw_json_answer(408, "Request Timeout",
                                 f"the request head did not arrive within {timeout:g} s")
            )  # fmt: skip
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        e = self._refusal
        status = getattr(e, "error_status_hint", 400) if e is not None else 400
        status = status if 400 <= status < 600 else 400
        reason = {400: "Bad Request", 431: "Request Header Fields Too Large"}.get(status, "Error")
        why = str(e) if e is not None else msg
        why = why if len(why) <= 200 else why[:200] + "..."  # h11 quotes the whole line
        self._stop_waiting()
        self.transport.write(_raw_json_answer(status, reason, f"malformed request: {why}"))
        self.transport.close()


class DrainingServer(uvicorn.Server):
    """uvicorn's server that drains on the first SIGTERM/SIGINT (new requests: 503) before it
    stops, and exits 0 when it stopped that way."""

    def __init__(self, config: uvicorn.Config, state: State, graceful_timeout_s: float,
                 banner: str):  # fmt: skip
        super().__init__(config)
        self.state, self.graceful_timeout_s, self.banner = state, graceful_timeout_s, banner
        self.drain_until: float | None = None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            scheme = "https" if self.config.is_ssl else "http"
            print(f"bestofn serve: listening on {scheme}://{shown}:{port} {self.banner}",
                  flush=True)  # fmt: skip

    def handle_exit(self, sig, frame) -> None:
        # not recorded for uvicorn to raise again once stopped: a drained stop exits 0
        if self.drain_until is not None:  # a second signal: stop now, as uvicorn would
            self.should_exit = self.force_exit = True
            return
        self.state.draining = True
        self.drain_until = time.monotonic() + self.graceful_timeout_s

    async def on_tick(self, counter: int) -> bool:
        if self.drain_until is not None and not self.should_exit:
            # the request that asks counts itself: only requests in flight besides are waited on
            if self.state.active == 0 or time.monotonic() >= self.drain_until:
                if self.state.active:
                    log.warning("graceful timeout: %d request(s) still in flight are cut",
                                self.state.active)  # fmt: skip
                self.should_exit = True
        return await super().on_tick(counter)


def main(args) -> int:
    """`bestofn serve` (args from the CLI)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    refusal = bind_refusal(args.host, api_key)
    if refusal:  # before anything else: nothing is read, nothing listens
        print(f"bestofn serve: {refusal}", file=sys.stderr)
        return 2
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        print("bestofn serve: error: TLS needs both --ssl-certfile and --ssl-keyfile",
              file=sys.stderr)  # fmt: skip
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
    limits = Limits(
        max_concurrency=args.max_concurrency, body_timeout_s=args.body_timeout,
        write_timeout_s=args.write_timeout,
    )  # fmt: skip
    state = State(api_key=api_key)
    config = uvicorn.Config(
        build_app(service, state, limits), host=args.host.strip("[]"), port=args.port,
        http=GuardedH11, lifespan="on", log_config=None, access_log=False,
        timeout_keep_alive=args.keep_alive, timeout_graceful_shutdown=5,
        backlog=max(2048, args.max_concurrency), ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile, server_header=False,
    )  # fmt: skip
    config.header_timeout_s = args.header_timeout
    try:
        config.load()  # the TLS files are read here
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
        print(f"bestofn serve: error: TLS: {e}", file=sys.stderr)
        return 2
    banner = (
        f"(config {args.config}; models load on the first request; worker idle timeout "
        f"{service.snap.runtime.idle_timeout_s:g} s; auth {'on' if api_key else 'off'}; TLS "
        f"{'on' if args.ssl_certfile else 'off'})"
    )
    server = DrainingServer(config, state, args.graceful_timeout, banner)
    try:
        server.run()
    except SystemExit:  # uvicorn could not listen (it logged why)
        print(f"bestofn serve: cannot listen on {args.host}:{args.port}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
