"""`bestofn serve` against hostile and unlucky clients, on loopback only: malformed bodies,
huge and lying Content-Lengths, slow clients (a head or body that trickles in, an idle
connection), unsupported methods, path tricks, missing or wrong keys; each gets the service's
JSON error and none takes the service down. Also: 429 with Retry-After beyond the concurrency
limit, Prometheus /metrics, a drained stop on SIGTERM, and TLS. Every loop and wait is bounded."""

from __future__ import annotations

import http.client
import io
import json
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

import anyio
import pytest
import soundfile as sf
from helpers import Server, make_project, speak

pytestmark = pytest.mark.slow  # `bestofn serve` and its workers started per module

KEY = "hardening-key"
LONG = " ".join(f"Sentence number {i} is here." for i in range(1, 9))  # 8 sentences
TIMEOUTS = ("--header-timeout", "1", "--body-timeout", "1", "--max-concurrency", "1")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(make_project(tmp_path_factory.mktemp("hard")), *TIMEOUTS, key=KEY)
    yield srv
    srv.close()


def raw(port: int, data: bytes, timeout: float = 10.0, pause: float = 0.0) -> bytes:
    """Send ``data`` on a fresh connection; everything the server sends back until it closes
    (or ``timeout``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        if pause:
            time.sleep(pause)
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                part = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not part:
                break
            out += part
    return out


def answer(data: bytes) -> tuple[int, dict, dict]:
    """(status, headers, JSON error body) of one raw answer; the body must be the service's
    JSON error shape."""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    err = json.loads(body)
    assert set(err) == {"error"} and err["error"]["message"] and err["error"]["type"], err
    return status, headers, err["error"]


def post_head(length: str | None, key: str = KEY, extra: str = "") -> bytes:
    cl = f"Content-Length: {length}\r\n" if length is not None else ""
    return (f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\n{cl}{extra}\r\n").encode()  # fmt: skip


def still_serving(srv: Server) -> None:
    assert srv.health()["status"] == "ok"


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [(b"{not json", 400, "not JSON"), (b"[1, 2]", 400, "JSON object"),
     (b"\xff\xfe\x00", 400, "not JSON"), (b"", 400, "empty body"),
     (b'{"input": 5, "model": "bestofn", "voice": "calm"}', 400, "'input' must be a string")],
)  # fmt: skip
def test_malformed_bodies_get_a_400_in_json(server, body, status, says):
    got, _, err = answer(raw(server.port, post_head(str(len(body))) + body, timeout=5))
    assert got == status and says in err["message"]
    still_serving(server)


def test_huge_and_lying_content_lengths(server):
    # a declared 1 TB body is refused from its head, before a byte of it is read
    t0 = time.monotonic()
    status, headers, err = answer(raw(server.port, post_head(str(10**12)), timeout=10))
    assert status == 413 and headers["connection"] == "close" and "at most" in err["message"]
    # a body over the cap sent in chunks (no length up front) is cut at the cap
    chunk = b"x" * 8192
    chunked = b"".join(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(10))
    data = post_head(None, extra="Transfer-Encoding: chunked\r\n") + chunked + b"0\r\n\r\n"
    status, headers, err = answer(raw(server.port, data, timeout=10))
    assert status == 413 and headers["connection"] == "close"
    # a body shorter than its Content-Length: 408 once the body timeout (1 s) passes
    status, headers, err = answer(raw(server.port, post_head("1000") + b'{"input"', timeout=10))
    assert status == 408 and "did not arrive" in err["message"]
    # a Content-Length that is not a number: the parser's own refusal, in JSON
    status, headers, err = answer(raw(server.port, post_head("12abc") + b"{}", timeout=10))
    assert status == 400 and headers["connection"] == "close"
    assert time.monotonic() - t0 < 20
    still_serving(server)


def test_slow_clients_are_cut_in_bounded_time(server):
    """A head that trickles in (slowloris) gets a 408 after the header timeout (1 s), whatever
    the pace; a connection that sends nothing is closed; neither holds the service."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        t0 = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        got = b""
        for i in range(40):  # a header byte every 0.1 s: each arrives well inside any timeout
            try:
                sock.sendall(b"X-Slow-%d: y\r\n" % i)
            except OSError:
                break
            time.sleep(0.1)
            sock.settimeout(0.01)
            try:
                got += sock.recv(4096)
            except (TimeoutError, BlockingIOError):
                pass
            except ConnectionResetError:
                break
            if got and b"\r\n\r\n" in got:
                break
        cut_after = time.monotonic() - t0
    status, headers, err = answer(got)
    assert status == 408 and "did not arrive" in err["message"] and cut_after < 3.5
    # idle: connected, nothing sent; the server closes it after the header timeout
    t0 = time.monotonic()
    assert raw(server.port, b"", timeout=10) == b"" and time.monotonic() - t0 < 5
    # many slow clients at once do not stop a normal request
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(50)]
    try:
        for s in socks:
            s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\n")
        still_serving(server)
    finally:
        for s in socks:
            s.close()


class _Worker:
    """A stand-in for the worker's answer: pcm chunks for ever, or a stream that breaks."""

    headers = {"x-sample-rate": "24000", "x-channels": "1"}

    def __init__(self, breaks: bool = False):
        self.breaks, self.closed = breaks, False

    async def chunks(self):
        from bestofn.serve.upstream import UpstreamBroken

        for _ in range(10_000):
            yield b"\x00\x01" * 2400
            await anyio.sleep(0.001)
            if self.breaks:
                raise UpstreamBroken("cut")

    def close(self):
        self.closed = True


@pytest.mark.parametrize("case", ["stops_reading", "worker_breaks"])
def test_relay_cuts_a_client_that_stops_reading_and_a_broken_worker_stream(case):
    """A client whose socket takes nothing more (the kernel's buffers between can hold a whole
    render, so this runs on the relay itself): its answer is cut after the write timeout and it
    counts as gone. A worker stream that breaks: the answer gets no last chunk, status 502."""
    from bestofn.serve.app import Limits, Speech, State

    sent: list[dict] = []

    async def send(message):
        sent.append(message)
        if case == "stops_reading" and message["type"] == "http.response.body":
            await anyio.sleep_forever()  # the client reads nothing: the write never ends

    async def receive():
        await anyio.sleep_forever()  # connected, silent

    speech = Speech(None, State(), Limits(write_timeout_s=0.5))
    rec = {"ttfa_s": None, "outcome": "error", "status": None, "audio_s": 0.0}
    t0 = time.monotonic()
    upstream = _Worker(breaks=case == "worker_breaks")

    async def relay():
        with anyio.fail_after(10):  # bounded even if the relay never gave up
            await speech._relay(upstream, "pcm", "audio", rec, time.perf_counter(), receive, send)

    anyio.run(relay)
    assert time.monotonic() - t0 < 5
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert not any(m.get("more_body") is False for m in sent), "no last chunk: visibly cut"
    if case == "stops_reading":
        assert rec["outcome"] == "client_left" and len(sent) == 2
    else:
        assert rec["status"] == 502 and rec["outcome"] == "error"


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [("TRACE", "/health", 405, "GET, HEAD"), ("DELETE", "/metrics", 405, "GET, HEAD"),
     ("GET", "/v1/audio/../health", 404, None), ("GET", "//health", 404, None),
     ("GET", "/health/", 404, None), ("GET", "/%2e%2e/%2e%2e/etc/passwd", 404, None),
     ("GET", "/v1/audio/speech%00", 404, None), ("GET", "/HEALTH", 404, None),
     ("POST", "/v1/audio/speech/../../health", 404, None)],
)  # fmt: skip
def test_unsupported_methods_and_path_tricks(server, method, path, status, allow):
    data = raw(server.port, f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
               f"{KEY}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())  # fmt: skip
    got, headers, err = answer(data)
    assert got == status and headers.get("allow") == allow
    still_serving(server)


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer ", f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}",
     f"bearer{KEY}", "Bearer \u00e9t\u00e9"],
)  # fmt: skip
def test_missing_or_wrong_keys_get_401_on_every_endpoint(server, authorization):
    for method, path in (("GET", "/health"), ("GET", "/metrics"), ("POST", "/v1/audio/speech"),
                         ("GET", "/nothing"), ("DELETE", "/v1/models")):  # fmt: skip
        auth = b"" if authorization is None else f"Authorization: {authorization}\r\n".encode()
        data = raw(server.port, f"{method} {path} HTTP/1.1\r\nHost: x\r\n".encode() + auth
                   + b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")  # fmt: skip
        status, headers, err = answer(data)
        assert status == 401 and headers["www-authenticate"] == "Bearer"
        assert err["type"] == "authentication_error" and "allow" not in headers
    still_serving(server)


def test_beyond_the_concurrency_limit_429_with_retry_after(server):
    """--max-concurrency 1: while one render streams, another speech request gets 429."""
    body = json.dumps({"model": "bestofn", "voice": "calm", "input": LONG,
                       "response_format": "pcm"}).encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(post_head(str(len(body))) + body)
        assert sock.recv(64).startswith(b"HTTP/1.1 200")  # the first is streaming
        short = json.dumps({"model": "bestofn", "voice": "calm", "input": "Hi."}).encode()
        status, headers, err = answer(raw(server.port, post_head(str(len(short))) + short))
        assert status == 429 and headers["retry-after"] == "1" and "busy" in err["message"]
        assert server.get("/health")[0] == 200  # the limit is on renders, not on /health
        sock.settimeout(60)
        while sock.recv(65536):  # the first one finishes
            pass
    server.wait_health(lambda h: h["speech"]["in_flight"] == 0, timeout=30)


METRIC_LINE = re.compile(r'^([a-z_]+)(\{([a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*)?\})? (\S+)$')


def scrape(srv: Server) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/plain")
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-z_]+ .+$", line), line
            continue
        m = METRIC_LINE.match(line)
        assert m, f"not Prometheus text: {line!r}"
        samples[line.rsplit(" ", 1)[0]] = float(m.group(5))
    return samples


def test_metrics_in_prometheus_text(server):
    before = scrape(server)
    ok = 'bestofn_http_requests_total{endpoint="/v1/audio/speech",code="200"}'
    bad = 'bestofn_http_requests_total{endpoint="/v1/audio/speech",code="400"}'
    speak(server.client(), "Counting this one.")
    with pytest.raises(Exception):  # noqa: B017 (the openai client's 400)
        server.client().audio.speech.create(model="bestofn", voice="nobody", input="Hi.")
    # recorded once the last byte is sent: the client may ask first
    deadline = time.monotonic() + 10
    while (after := scrape(server)).get(ok, 0) < before.get(ok, 0) + 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert after[bad] == before.get(bad, 0) + 1
    warm = 'bestofn_speech_ttfa_seconds_count{cold="false"}'
    assert after[warm] + after['bestofn_speech_ttfa_seconds_count{cold="true"}'] >= 1
    assert after['bestofn_speech_ttfa_seconds_bucket{cold="false",le="+Inf"}'] == after[warm]
    assert after["bestofn_speech_audio_seconds_total"] > before.get(
        "bestofn_speech_audio_seconds_total", 0
    )
    assert after["bestofn_worker_up"] == 1 and after["bestofn_worker_starts_total"] >= 1
    assert "bestofn_worker_queue_depth" in after and after["bestofn_draining"] == 0
    assert after["bestofn_speech_in_flight"] == 0


def test_sigterm_drains_in_flight_renders_and_refuses_new_ones(tmp_path):
    srv = Server(make_project(tmp_path / "p"), "--graceful-timeout", "60")
    try:
        speak(srv.client(), "Warm up.")
        body = json.dumps({"model": "bestofn", "voice": "calm", "input": LONG,
                           "response_format": "wav"}).encode()  # fmt: skip
        got: list[bytes] = []

        def long_render():
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
            conn.request("POST", "/v1/audio/speech", body=body,
                         headers={"Content-Type": "application/json"})  # fmt: skip
            resp = conn.getresponse()
            got.append(resp.read())  # IncompleteRead if the stream were cut
            conn.close()

        t = threading.Thread(target=long_render, daemon=True)
        t.start()
        srv.wait_health(lambda h: h["speech"]["in_flight"] == 1, timeout=30)
        srv.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while True:  # the signal is handled at once; new requests get 503
            status, headers, err = answer(raw(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
            if status == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status == 503 and headers["retry-after"] and "shutting down" in err["message"]
        t.join(60)
        audio, rate = sf.read(io.BytesIO(got[0]), dtype="float32")
        assert audio.shape[0] / rate > 5.0  # the whole render: 8 sentences
        assert srv.proc.wait(30) == 0
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", srv.port), timeout=5).close()
    finally:
        srv.close()


def test_tls_with_a_self_signed_certificate(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
         "-out", str(cert)], check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    root = make_project(tmp_path / "p")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bestofn.cli", "serve", "--port", "0", "--ssl-certfile",
         str(cert), "--ssl-keyfile", str(key)],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "listening on" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None
        port = int(line.split("https://127.0.0.1:")[1].split()[0])
        context = ssl.create_default_context(cafile=str(cert))
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
        conn.request("GET", "/v1/models")
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["data"]
        conn.close()
        # plain HTTP on the TLS port gets no answer of the service
        assert not raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", timeout=5).startswith(
            b"HTTP/1.1 200"
        )
        # a client that does not trust the certificate is refused by its own TLS
        with pytest.raises(ssl.SSLError):
            http.client.HTTPSConnection("127.0.0.1", port, timeout=10).request("GET", "/health")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def test_tls_needs_both_files(tmp_path):
    root = make_project(tmp_path / "p")
    run = subprocess.run(
        [sys.executable, "-m", "bestofn.cli", "serve", "--port", "0", "--ssl-certfile", "x.pem"],
        cwd=root, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and "both --ssl-certfile and --ssl-keyfile" in run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "bestofn.cli", "serve", "--port", "0", "--ssl-certfile", "x.pem",
         "--ssl-keyfile", "y.pem"], cwd=root, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and "error: TLS" in run.stderr and "Traceback" not in run.stderr
