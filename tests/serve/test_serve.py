"""`bestofn serve` on loopback with the embedded generator (piper), driven by the real `openai`
client: non-streaming and streaming renders, 8 concurrent requests batched in the worker, bad
requests, a client that leaves mid-stream, lazy start / idle reap / config change seen through
/health, and the refusal to listen beyond loopback without an API key. Every wait is bounded."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time

import openai
import pytest
import soundfile as sf
import yaml
from helpers import Server, make_project, moss_speak, speak, write_tsv

from bestofn.serve.http import bind_refusal
from bestofn.worker.client.group_job import _pid_alive

pytestmark = pytest.mark.slow  # `bestofn serve` and its workers started per module

KEY = "test-key"
LONG = " ".join(f"Sentence number {i} is here." for i in range(1, 9))  # 40 words, 8 sentences


def decoded(data: bytes):
    audio, sr = sf.read(io.BytesIO(data), dtype="float32")
    assert sr == 22050 and audio.ndim == 1 and audio.shape[0] > sr // 4 and abs(audio).max() > 0
    return audio


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(make_project(tmp_path_factory.mktemp("serve")), key=KEY)
    yield srv
    srv.close()


def test_nonstreaming_and_streaming_renders(server):
    client = server.client()
    text = "Good morning. The train leaves at nine."
    whole = speak(client, text)
    decoded(whole)
    with client.audio.speech.with_streaming_response.create(
        model="bestofn", voice="calm", input=text, response_format="wav"
    ) as resp:
        assert resp.headers["content-type"] == "audio/wav"
        chunks = list(resp.iter_bytes())
    assert len(chunks) >= 2, "two sentences arrive as they are rendered"
    assert b"".join(chunks) == whole  # same request, same seed: same audio
    # raw 24 kHz 16-bit mono, as OpenAI's pcm
    with client.audio.speech.with_streaming_response.create(
        model="piper", voice="happy", input=text, response_format="pcm"
    ) as resp:
        assert resp.headers["x-sample-rate"] == "24000"
        pcm = resp.read()
    assert len(pcm) % 2 == 0 and 1.0 < len(pcm) / 2 / 24000 < 10.0
    # server-sent events carry the same bytes, base64, then a done event
    with client.audio.speech.with_streaming_response.create(
        model="bestofn", voice="calm", input=text, response_format="wav", stream_format="sse"
    ) as resp:
        events = [json.loads(x[6:]) for x in resp.text().split("\n\n") if x.startswith("data: ")]
    assert [e["type"] for e in events[-1:]] == ["speech.audio.done"]
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == whole
    flac = speak(client, text, fmt="flac")
    assert decoded(flac).shape[0] == decoded(whole).shape[0]
    status, models = server.get("/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["piper", "bestofn"]
    h = server.health()
    assert h["speech"]["ttfa_ms"]["n"] >= 1 and h["speech"]["rtf"]["mean"] > 0


def test_speech_batching_is_the_configs_runtime_unless_the_command_line_says(server, tmp_path):
    """runtime.speech_max_batch / speech_batch_window_ms (schema defaults 64 and 5 ms) reach
    the worker on its command line; `bestofn serve --max-batch/--batch-window-ms` override
    the config for the worker it starts."""
    from bestofn.serve.http import Service

    speak(server.client(), "Warm up.")
    h = server.health()["worker"]["speech_batching"]
    assert (h["max_batch"], h["window_ms"]) == (64, 5.0)
    root = make_project(tmp_path / "p", speech_max_batch=3, speech_batch_window_ms=1.5)
    rt = Service(root / "config/config.yaml", root).snap.runtime
    assert (rt.speech_max_batch, rt.speech_batch_window_ms) == (3, 1.5)
    rt = Service(root / "config/config.yaml", root, 0, None, 7, 2.5).snap.runtime
    assert (rt.speech_max_batch, rt.speech_batch_window_ms, rt.idle_timeout_s) == (7, 2.5, 120)


def test_eight_concurrent_requests_are_batched_and_batch_independent(server):
    client = server.client()
    jobs = [(f"Request number {i} is ready.", "calm" if i % 2 else "happy", i) for i in range(8)]
    speak(client, "Warm up.")  # the worker is warm: the 8 arrive together
    before = server.health()["worker"]["speech_batching"]
    with cf.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda j: speak(client, j[0], j[1], seed=j[2]), jobs))
    for data in outs:
        decoded(data)
    assert len(set(outs)) == 8
    after = server.health()["worker"]["speech_batching"]
    assert after["requests"] - before["requests"] == 8
    assert after["batches"] - before["batches"] < 8, "requests arriving together share a batch"
    assert after["largest_batch"] >= 2
    text, voice, seed = jobs[5]
    assert speak(client, text, voice, seed=seed) == outs[5]  # alone: as inside the batch


@pytest.mark.parametrize(
    "change, status, reason",
    [
        ({"input": "  "}, 400, "empty or whitespace"),
        ({"input": "word " * 41}, 400, "more than max_words=40"),
        ({"voice": "alloy"}, 400, "unknown voice 'alloy'"),
        ({"voice": "config/voices/ref.flac"}, 400, "looks like a file path"),
        ({"voice": "/etc/passwd"}, 400, "looks like a file path"),
        ({"response_format": "ogg"}, 400, "use one of mp3, opus, aac, wav, flac, pcm"),
        ({"model": "tts-1"}, 400, "not served here"),
        ({"speed": 2.0}, 400, "only 1.0"),
        ({"extra_body": {"seed": -1}}, 400, "seed"),
        ({"extra_body": {"sample_rate": 8000}}, 400, "unknown field"),
    ],
)
def test_bad_requests_get_4xx_with_a_reason(server, change, status, reason):
    kw = {"model": "bestofn", "voice": "calm", "input": "Hello.", "response_format": "wav"}
    kw.update(change)
    with pytest.raises(openai.APIStatusError) as err:
        server.client().audio.speech.create(**kw)
    assert err.value.status_code == status and reason in err.value.message


def test_auth_body_limits_and_unknown_paths(server):
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").audio.speech.create(
            model="bestofn", voice="calm", input="Hi."
        )  # fmt: skip
    assert server.get("/health", key="wrong")[0] == 401
    assert server.get("/v1/nothing")[0] == 404
    for body, status in ((b"{not json", 400), (b"[1]", 400), (b"x" * (65 * 1024), 413)):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("POST", "/v1/audio/speech", body=body,
                     headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == status, resp.read()
        conn.close()
    assert server.health()["status"] == "ok"


def request(conn, method: str, path: str, body: bytes | None = None, key: str | None = KEY):
    """One raw request on ``conn``: (status, headers, body bytes)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp, resp.read()


def error_message(status: int, data: bytes) -> str:
    """The message of an error answer, which must be the service's JSON, not an HTML page."""
    body = json.loads(data)
    assert set(body) == {"error"} and body["error"]["type"], (status, body)
    return body["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("DELETE", "/v1/audio/speech", "POST"), ("PUT", "/v1/audio/speech", "POST"),
     ("PATCH", "/v1/audio/speech", "POST"), ("OPTIONS", "/v1/audio/speech", "POST"),
     ("BREW", "/v1/audio/speech", "POST"), ("get", "/v1/audio/speech", "POST"),
     ("GET", "/v1/audio/speech", "POST"), ("POST", "/health", "GET, HEAD"),
     ("DELETE", "/v1/models", "GET, HEAD"), ("PUT", "/v1/audio/voices?x=1", "GET, HEAD")],
)  # fmt: skip
def test_a_method_an_endpoint_does_not_take_is_a_json_405_naming_the_allowed(
    server, method, path, allow
):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        status, resp, data = request(conn, method, path, body=b'{"input": "Hi."}')
        assert (status, resp.getheader("Allow")) == (405, allow), data
        assert resp.getheader("Content-Type") == "application/json"
        assert method in error_message(status, data)
        # the body was read: the same connection answers the next request in step
        status, _, data = request(conn, "GET", "/health")
        assert status == 200 and json.loads(data)["status"] == "ok"
    finally:
        conn.close()


def test_unknown_paths_auth_and_head_answer_json_on_any_method(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        status, resp, data = request(conn, "DELETE", "/v1/nothing")
        assert status == 404 and "DELETE /v1/nothing" in error_message(status, data)
        status, resp, data = request(conn, "DELETE", "/v1/audio/speech", key="wrong")
        assert status == 401 and resp.getheader("Allow") is None
        assert "API key" in error_message(status, data)
        status, resp, data = request(conn, "HEAD", "/health")  # GET's headers, no body
        assert (status, data) == (200, b"")
        assert resp.getheader("Content-Type") == "application/json"
        assert int(resp.getheader("Content-Length")) > 0
        status, resp, data = request(conn, "HEAD", "/v1/audio/speech")
        assert (status, resp.getheader("Allow"), data) == (405, "POST", b"")
        status, _, data = request(conn, "GET", "/v1/models")  # still in step after the HEADs
        assert status == 200 and json.loads(data)["data"]
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("line", "status"),
    [(b"GARBAGE", 400), (b"GET / HTTP/x.y", 400), (b"GET / HTTP/9.9", 505),
     (b"GET /" + b"a" * 70000 + b" HTTP/1.1", 414), (b"GET /" + b"a" * 10000, 400),
     (b"GET / HTTP/1.1\r\nX: " + b"b" * 70000, 431), (b"\x00\xff junk here now", 400)],
)  # fmt: skip
def test_a_request_line_the_parser_refuses_is_answered_in_json(server, line, status):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(line + b"\r\nHost: x\r\n\r\n")
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        data = resp.read()
    assert resp.status == status, data
    assert resp.getheader("Content-Type") == "application/json"
    assert resp.getheader("Connection") == "close"
    assert error_message(resp.status, data) and len(data) < 1000


def test_client_leaving_mid_stream_does_not_wedge_the_worker(server):
    client = server.client()
    speak(client, "Warm up.")
    pid = server.health()["worker"]["pid"]
    left = server.health()["speech"]["client_left"]
    body = json.dumps({"model": "bestofn", "voice": "calm", "input": LONG,
                       "response_format": "pcm"}).encode()  # fmt: skip
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    first = sock.recv(4096)
    assert first.startswith(b"HTTP/1.1 200")
    # leave at once, with a reset (SO_LINGER 0): the next write to us fails
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()
    t0 = time.monotonic()
    decoded(speak(client, "Still here."))
    assert time.monotonic() - t0 < 60
    h = server.wait_health(lambda h: h["speech"]["client_left"] > left, timeout=60)
    assert h["worker"]["pid"] == pid and h["worker"]["status"] == "ok"
    server.wait_health(lambda h: not h["worker"]["busy"] and h["speech"]["in_flight"] == 0)


def test_lazy_start_idle_reap_and_config_change(tmp_path):
    root = make_project(tmp_path / "p", idle_timeout_s=2.0)
    srv = Server(root)
    try:
        h = srv.health()
        assert not h["worker_running"] and h["worker"] is None and h["worker_starts"] == 0
        client = srv.client()
        decoded(speak(client, "First."))
        h = srv.health()
        assert h["worker_running"] and h["worker_starts"] == 1
        first = h["worker"]["pid"]
        # idle past the timeout: the worker exits by itself (its memory, a GPU's too, is freed)
        srv.wait_health(lambda h: not h["worker_running"], timeout=60)
        deadline = time.monotonic() + 20
        while _pid_alive(first) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _pid_alive(first)
        decoded(speak(client, "Second."))
        h = srv.health()
        assert h["worker_running"] and h["worker_starts"] == 2 and h["worker"]["pid"] != first
        # a request's metrics are recorded once its last byte is sent: the client can ask first
        srv.wait_health(lambda h: h["speech"]["cold_ttfa_ms"]["n"] == 2, timeout=10)
        # a changed config (another generator setting): a new worker key, a new worker
        config = yaml.safe_load((root / "config/config.yaml").read_text())
        config["models"]["generator"]["options"] = {"noise_scale": 0.5}
        (root / "config/config.yaml").write_text(yaml.safe_dump(config))
        decoded(speak(client, "Third."))
        h2 = srv.health()
        assert h2["worker_key"] != h["worker_key"] and h2["worker"]["serves_this_config"]
        assert h2["worker"]["models_hash"] != h["worker"]["models_hash"]
        assert h2["worker_starts"] == 3
    finally:
        srv.close()


def test_fatal_device_error_answers_500_and_the_next_request_gets_a_fresh_worker(tmp_path):
    root = make_project(tmp_path / "p")
    config = yaml.safe_load((root / "config/config.yaml").read_text())
    marker = root / "fault.marker"
    config["models"]["generator"] = {
        "backend": "lab.faults:FatalOnceGenerator", "options": {"marker": str(marker)}
    }  # fmt: skip
    (root / "config/config.yaml").write_text(yaml.safe_dump(config))
    srv = Server(root)
    try:
        client = srv.client()
        with pytest.raises(openai.InternalServerError, match="fatal device error"):
            speak(client, "Break it.", fmt="pcm")
        broken = json.loads(marker.read_text())["pid"]
        assert len(speak(client, "Now it works.", fmt="pcm")) == 2 * 12000  # 0.5 s at 24 kHz
        h = srv.health()
        assert h["worker"]["pid"] != broken and h["worker_starts"] == 2
        assert not _pid_alive(broken)
    finally:
        srv.close()


def test_listening_beyond_loopback_needs_an_api_key(tmp_path):
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert bind_refusal(host, None) is None
    for host in ("0.0.0.0", "::", "192.168.1.10", "myhost.example"):
        assert "refusing to listen" in bind_refusal(host, None)
        assert bind_refusal(host, "a-key") is None
    env = {k: v for k, v in os.environ.items() if k != "BESTOFN_API_KEY"}
    run = subprocess.run(
        [sys.executable, "-m", "bestofn.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
        cwd=make_project(tmp_path / "p"), capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert run.returncode == 2
    assert "refusing to listen on '0.0.0.0' without an API key" in run.stderr
    assert "BESTOFN_API_KEY" in run.stderr and "listening" not in run.stdout


# ---- moss-fast behind `bestofn serve` (tiny random model) ---------------------------------------

MOSS_TEXTS = (
    "The train leaves at nine, so please be on time.",
    "I cannot believe you kept this a secret from me.",
    "We finally finished the project.",
    "Put the box down slowly and step away.",
)


@pytest.fixture(scope="module")
def moss_server(tmp_path_factory):
    """moss-fast on the tiny random checkpoint, with "stop" at probability 0.2 at every frame:
    some takes are empty (the stop head fires at frame 0; which ones depends on the seed alone,
    the stop logit being the bias's), the others last a few frames to a few chunks. A 200 ms
    batching window: requests sent together share a batch."""
    from bestofn.fakes import moss

    root = tmp_path_factory.mktemp("serve-moss")
    options = moss.write(root / "weights", "tiny", seed=0, p_stop=0.2)
    write_tsv(root / "emotions.tsv", ["emotion", "description"], [["calm", "A calm voice."]])
    write_tsv(root / "prompts.tsv", ["prompt_id", "text"], [["p1", "Hello."]])
    config = {
        "emotions": "emotions.tsv", "prompts": "prompts.tsv", "results": "results",
        "takes": 1, "device": "cpu",
        "models": {"generator": {"backend": "moss-fast", "options": options}},
        "runtime": {"idle_timeout_s": 120},
        "selection": {"filter": "true", "score": "0"},
    }  # fmt: skip
    (root / "speech.yaml").write_text(yaml.safe_dump(config))
    srv = Server(root, "--config", "speech.yaml", "--batch-window-ms", "200")
    yield srv
    srv.close()


def test_moss_fast_requests_all_complete_empty_takes_included(moss_server):
    """Every request is answered, those whose take is empty (0.25 s of silence, as the workflow
    publishes an empty take) included, alone and inside a batch. The worker used to consume an
    empty take's end of stream while skipping its empty chunks, then wait for one more chunk
    for ever: that request hung, and the bench's next one never reached the worker."""
    texts = MOSS_TEXTS
    seq = [moss_speak(moss_server, texts[i % 4], seed=i) for i in range(8)]  # pcm, 24 kHz
    empty = [i for i, d in enumerate(seq) if not any(d)]
    assert empty and len(empty) < 8, "some takes are empty, some are not"
    for i in empty:
        assert len(seq[i]) == 2 * 6000  # 0.25 s of 16-bit mono at 24 kHz
    assert max(len(d) for d in seq) > 2 * 24000 * 0.32, "a take longer than the first chunk"
    for seed in (empty[0], next(i for i in range(8) if i not in empty)):  # wav and flac too
        wav, flac = (
            sf.read(io.BytesIO(moss_speak(moss_server, texts[seed % 4], seed, fmt)),
                    dtype="float32")
            for fmt in ("wav", "flac")
        )  # fmt: skip
        assert wav[1] == flac[1] == 48000 and wav[0].shape == flac[0].shape
        assert wav[0].ndim == 2 and wav[0].shape[1] == 2  # the codec's stereo, silence too
        assert (seed in empty) == (not wav[0].any())
        assert wav[0].shape[0] / 48000 == pytest.approx(len(seq[seed]) / 2 / 24000, abs=1e-3)
    # four together, one batch: an empty take (a row that stops at its first frame) among
    # rows that go on; each as long as it was alone
    jobs = [(texts[empty[0] % 4], empty[0])] + [(texts[i], 100 + i) for i in range(3)]
    before = moss_server.health()["worker"]["speech_batching"]
    with cf.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(moss_speak, moss_server, t, s) for t, s in jobs]
        together = [f.result(timeout=120) for f in futures]
    # the worker counts a batch once its render has ended, the server a request once it has
    # answered it: both may come a moment after the clients have their last bytes
    h = moss_server.wait_health(
        lambda h: (
            h["worker"]["speech_batching"]["requests"] - before["requests"] >= 4
            and h["speech"]["served"] >= 16
        )
    )
    after = h["worker"]["speech_batching"]
    assert after["requests"] - before["requests"] == 4 and after["largest_batch"] >= 2
    assert together[0] == seq[empty[0]]
    assert all(len(d) > 0 for d in together)
    assert h["speech"]["served"] == 16 and h["speech"]["failed"] == 0
    moss_server.wait_health(lambda h: not h["worker"]["busy"] and h["speech"]["in_flight"] == 0)


@pytest.mark.parametrize("mode", ["stall", "trickle"])
def test_bench_request_timeout_is_a_deadline(mode):
    """`python -m lab.bench serve --timeout`: a stream that stalls after its first chunk,
    or trickles two bytes every 50 ms for ever (no single read ever times out), fails once
    the request's deadline passes."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from lab.bench.serve import one_request

    stop = threading.Event()

    class Endless(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                while not stop.is_set():
                    self.wfile.write(b"2\r\n\x00\x00\r\n")
                    self.wfile.flush()
                    stop.wait(0.05 if mode == "trickle" else 60)
            except OSError:
                pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        t0 = time.monotonic()
        r = one_request("127.0.0.1", httpd.server_address[1], {"input": "x"}, None, timeout=1.0)
        took = time.monotonic() - t0
    finally:
        stop.set()
        httpd.shutdown()
        httpd.server_close()
    assert not r["ok"] and "timed out" in r["error"], r
    assert 0.9 < took < 10


def test_speech_job_end_is_sticky():
    """A reader that already got a job's end (or its error) gets it again at once: the batcher
    delivers one end per job, so waiting for another would wait for ever."""
    import numpy as np

    from bestofn.util.spec import GroupSpec
    from bestofn.worker.speech_batcher import END, SpeechJob

    worker = type("W", (), {"fatal": None})()
    job = SpeechJob(GroupSpec("", "api", "Hi.", 1, 0), "pcm")
    job.put(np.zeros(0, np.float32))
    job.put(END)
    job.put(np.ones(3, np.float32))  # after the end: dropped
    assert job.get(worker).shape == (0,)
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(job.get(worker) for _ in range(3)),
                              daemon=True)  # fmt: skip
    reader.start()
    reader.join(10)
    assert got == [None, None, None]
    failed = SpeechJob(GroupSpec("", "api", "Hi.", 1, 0), "pcm")
    failed.put(RuntimeError("boom"))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="boom"):
            failed.get(worker)
