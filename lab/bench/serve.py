"""`python -m lab.bench serve`: time to first audio and audio-seconds per second of a
running `bestofn serve`, at several concurrency levels.

Each level sends ``--requests`` renders (default 4 x the concurrency, at least 16) from
``concurrency`` client threads, each a streamed ``pcm`` request (24 kHz, 16-bit mono) with its
own seed, over a fresh HTTP connection. Per request: time to first audio (first body byte after
the request is sent), wall time, audio seconds (bytes / 48000). Per level: audio-seconds per
second (all the audio / the level's wall time), TTFA mean / p50 / p95, per-request RTF (wall /
audio), failures (a request not answered in full within ``--timeout`` seconds, connect to last
byte, is cut and fails). ``--warmup`` requests first (at concurrency 1) start the worker, so
the load is reported apart and the levels measure a warm worker. Before each level, unless
``--no-level-warmup``, ``concurrency`` requests at that concurrency run unmeasured: a batch size
the worker has not run yet costs a compile and CUDA-graph captures (load cost, as in
``bestofn ab``); their wall time is reported as the level's ``warmup_s``.

    bestofn serve --config CONFIG --max-batch 128 &
    python -m lab.bench serve --url http://127.0.0.1:8000 --concurrency 1,16,64,128

Loopback only (the address is checked): this is a load test of your own server.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

from bestofn.serve.service import is_loopback

TEXTS = (
    "The train leaves at nine, so please be on time and bring the tickets with you.",
    "I cannot believe you kept this a secret from me for so long, after everything.",
    "We finally finished the project, and it works better than any of us had hoped.",
    "Put the box down slowly, step away from the door, and tell me what you saw.",
)


def one_request(host, port, body: dict, key: str | None, timeout: float) -> dict:
    """One streamed request, ``timeout`` seconds at most in all: connect, the answer and the
    whole body (a deadline, not a per-read timeout: a stream that trickles or stalls is cut
    when it passes, and the request counts as failed)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.perf_counter()
    ttfa, n = None, 0
    expired = threading.Event()
    timer = None

    def cut() -> None:  # unblocks any read in progress: shutdown wakes a blocked recv()
        expired.set()
        with contextlib.suppress(OSError, AttributeError):
            sock.shutdown(socket.SHUT_RDWR)

    try:
        conn.connect()
        sock = conn.sock  # the response reads it even after conn lets it go
        timer = threading.Timer(max(0.0, timeout - (time.perf_counter() - t0)), cut)
        timer.daemon = True
        timer.start()
        conn.request("POST", "/v1/audio/speech", body=json.dumps(body).encode(), headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            return {"ok": False, "error": f"{resp.status}: {resp.read()[:300]!r}"}
        while data := resp.read1(1 << 16):
            if ttfa is None:
                ttfa = time.perf_counter() - t0
            n += len(data)
            if expired.is_set():
                break
    except (OSError, http.client.HTTPException) as e:
        if not expired.is_set():
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    finally:
        if timer is not None:
            timer.cancel()
        conn.close()
    if expired.is_set():
        return {"ok": False, "error": f"timed out: no complete answer within {timeout:g} s "
                f"({n} bytes)"}  # fmt: skip
    wall = time.perf_counter() - t0
    audio = n / 2 / 24000
    return {"ok": True, "ttfa_s": ttfa, "wall_s": wall, "audio_s": audio,
            "rtf": wall / audio if audio else None}  # fmt: skip


def run_level(host, port, args, concurrency: int, n_requests: int, seed0: int) -> dict:
    results: list[dict] = []
    lock = threading.Lock()
    counter = iter(range(n_requests))

    def worker():
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            body = {"model": args.model, "voice": args.voice, "input": TEXTS[i % len(TEXTS)]
                    if args.text is None else args.text, "response_format": "pcm",
                    "seed": seed0 + i}  # fmt: skip
            r = one_request(host, port, body, args.api_key, args.timeout)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.timeout * n_requests)
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    ttfa = sorted(r["ttfa_s"] * 1000 for r in ok if r["ttfa_s"] is not None)
    rtf = [r["rtf"] for r in ok if r["rtf"] is not None]
    audio = sum(r["audio_s"] for r in ok)

    def pct(v, q):
        return round(v[min(len(v) - 1, int(q * len(v)))], 1) if v else None

    return {
        "concurrency": concurrency,
        "requests": n_requests,
        "ok": len(ok),
        "failed": len(results) - len(ok) + (n_requests - len(results)),
        "errors": sorted({r["error"] for r in results if not r["ok"]})[:3],
        "wall_s": round(wall, 3),
        "audio_s": round(audio, 3),
        "audio_s_per_s": round(audio / wall, 2) if wall else None,
        "ttfa_ms_mean": round(statistics.fmean(ttfa), 1) if ttfa else None,
        "ttfa_ms_p50": pct(ttfa, 0.5),
        "ttfa_ms_p95": pct(ttfa, 0.95),
        "rtf_mean": round(statistics.fmean(rtf), 4) if rtf else None,
    }


def hardware() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().replace("\n", "; ")
    except (OSError, subprocess.SubprocessError):
        pass
    import os

    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name}, {os.cpu_count()} cores (no GPU)"


def server_health(host, port, key: str | None) -> dict:
    try:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("GET", "/health", headers={"Authorization": f"Bearer {key}"} if key else {})
        health = json.loads(conn.getresponse().read())
        conn.close()
        return health
    except (OSError, ValueError, http.client.HTTPException):
        return {}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.bench serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key")
    ap.add_argument("--concurrency", default="1,16,64,128", help="comma-separated levels")
    ap.add_argument("--requests", type=int, help="per level (default: max(MIN, ROUNDS x level))")
    ap.add_argument("--min-requests", type=int, default=16,
                    help="the fewest requests at a level (with --requests unset)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=4,
                    help="requests per client at each level (with --requests unset)")  # fmt: skip
    ap.add_argument("--warmup", type=int, default=2, help="requests before measuring")
    ap.add_argument(
        "--no-level-warmup",
        dest="level_warmup",
        action="store_false",
        help="measure each level from its first request (compile and graph capture included)",
    )
    ap.add_argument("--model", default="bestofn")
    ap.add_argument("--voice", default="default")
    ap.add_argument("--text", help="one text for every request (default: 4 sentences)")
    ap.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="deadline per request: its whole answer within this many seconds, or it fails",
    )
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    url = urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    if not is_loopback(host):
        print(f"refusing to load-test {host}: loopback addresses only", file=sys.stderr)
        return 2
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    t0 = time.perf_counter()
    warm = [
        one_request(host, port, {"model": args.model, "voice": args.voice,
                                 "input": TEXTS[0] if args.text is None else args.text,
                                 "response_format": "pcm", "seed": 10**6 + i},
                    args.api_key, args.timeout)
        for i in range(args.warmup)
    ]  # fmt: skip
    bad = [w for w in warm if not w["ok"]]
    if bad:
        print(f"warmup failed: {bad[0]['error']}", file=sys.stderr)
        return 1
    report = {
        "command": "python -m lab.bench serve " + " ".join(argv),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "hardware": hardware(),
        "warmup_s": round(time.perf_counter() - t0, 3),
        "levels": [],
    }
    health = server_health(host, port, args.api_key)
    report["generator"] = health.get("generator")
    report["worker_device"] = (health.get("worker") or {}).get("device")
    report["gpu_memory_cap"] = (health.get("worker") or {}).get("gpu_memory_cap")
    print(f"# {report['date']}  {report['hardware']}  generator {report.get('generator')}")
    print("| concurrency | requests | ok | audio-s/s | TTFA mean ms | p50 | p95 | RTF mean |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k, c in enumerate(levels):
        n = args.requests or max(args.min_requests, args.rounds * c)
        warm_s = None
        if args.level_warmup:
            t1 = time.perf_counter()
            run_level(host, port, args, c, c, seed0=k * 100_000 + 50_000)
            warm_s = round(time.perf_counter() - t1, 3)
        row = run_level(host, port, args, c, n, seed0=k * 100_000)
        row["warmup_s"] = warm_s
        report["levels"].append(row)
        print(f"| {c} | {n} | {row['ok']} | {row['audio_s_per_s']} | {row['ttfa_ms_mean']} | "
              f"{row['ttfa_ms_p50']} | {row['ttfa_ms_p95']} | {row['rtf_mean']} |",
              flush=True)  # fmt: skip
        if row["errors"]:
            print(f"#   errors: {row['errors']}")
    # the worker's view after the levels: batches, requests that joined a running decode
    report["speech_batching"] = (server_health(host, port, args.api_key).get("worker") or {}).get(
        "speech_batching"
    )
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all(r["failed"] == 0 for r in report["levels"]) else 1
