"""`bestofn serve`: its options (bestofn.serve.http runs it)."""

from __future__ import annotations

from bestofn.util.parser import config_options


def _serve(args) -> int:
    from bestofn.serve.http import main as serve_main

    return serve_main(args)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="OpenAI-compatible speech endpoint (POST /v1/audio/speech) on the warm worker",
        description="POST /v1/audio/speech (OpenAI's request shape), GET /v1/models, "
        "/v1/audio/voices and /health. Loads no model until the first request, which starts "
        "the workflow's warm worker; it exits after the idle timeout. Loopback only unless an "
        "API key is set.",
    )
    p.add_argument("--host", default="127.0.0.1", help="any non-loopback address needs a key")
    p.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    config_options(p, "directory that config paths are relative to")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (or BESTOFN_API_KEY)")
    p.add_argument("--slot", type=int, default=0, help="the worker slot (GPU) to serve from")
    p.add_argument(
        "--idle-timeout", type=float, help="seconds before an idle worker exits "
        "(default: the config's runtime.idle_timeout_s)",
    )  # fmt: skip
    p.add_argument("--max-batch", type=int, help="largest speech batch of a worker it starts "
                   "(default: the config's runtime.speech_max_batch)")  # fmt: skip
    p.add_argument("--batch-window-ms", type=float, help="batching window of a worker it "
                   "starts (default: the config's runtime.speech_batch_window_ms)")  # fmt: skip
    p.add_argument("--max-concurrency", type=int, default=256,
                   help="speech requests in flight; more get 429 with Retry-After")  # fmt: skip
    p.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--ssl-keyfile", help="the certificate's private key (PEM)")
    p.add_argument("--keep-alive", type=float, default=5.0,
                   help="seconds an idle connection stays open between requests")  # fmt: skip
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds for a request's line and headers to arrive")  # fmt: skip
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds for a request's body to arrive")  # fmt: skip
    p.add_argument("--write-timeout", type=float, default=60.0,
                   help="seconds a client may leave the answer unread (then cut)")  # fmt: skip
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="on SIGTERM: seconds for requests in flight to end (new: 503)")  # fmt: skip
    p.set_defaults(func=_serve)
