"""``GET /metrics``: the service's counters in Prometheus' text exposition format (version
0.0.4: ``# HELP`` / ``# TYPE`` lines, then ``name{labels} value``), written here: a dozen series
do not need a client library."""

from __future__ import annotations

from bestofn.serve.service import TTFA_BUCKETS, Metrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


class _Text:
    def __init__(self):
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value: float, **labels) -> None:
        inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{inner}}} {_num(value)}" if inner else f"{name} {_num(value)}")


def render(metrics: Metrics, *, in_flight: int, draining: bool, worker: dict | None,
           worker_starts: int, uptime_s: float) -> str:  # fmt: skip
    """The exposition text. ``worker``: the worker's /health (None: no worker running)."""
    t = _Text()
    with metrics.lock:
        answers = sorted(metrics.http_answers.items())
        outcomes = {"ok": metrics.served, "failed": metrics.failed,
                    "client_left": metrics.client_left}  # fmt: skip
        audio_s = metrics.audio_s
        ttfa = {cold: (list(metrics.ttfa_counts[cold]), metrics.ttfa_sum[cold],
                       metrics.ttfa_n[cold]) for cold in (False, True)}  # fmt: skip
    t.family("bestofn_http_requests_total", "counter", "HTTP answers by endpoint and status")
    for (endpoint, status), n in answers:
        t.sample("bestofn_http_requests_total", n, endpoint=endpoint, code=status)
    t.family("bestofn_speech_requests_total", "counter", "speech requests by outcome")
    for outcome, n in outcomes.items():
        t.sample("bestofn_speech_requests_total", n, outcome=outcome)
    t.family("bestofn_speech_audio_seconds_total", "counter", "audio seconds sent in full")
    t.sample("bestofn_speech_audio_seconds_total", round(audio_s, 6))
    t.family(
        "bestofn_speech_ttfa_seconds", "histogram",
        "time to first audio of answered requests; cold: the request started the worker",
    )  # fmt: skip
    for cold, (counts, total, n) in ttfa.items():
        c = str(cold).lower()
        for edge, count in zip(TTFA_BUCKETS, counts, strict=True):
            t.sample("bestofn_speech_ttfa_seconds_bucket", count, cold=c, le=f"{edge:g}")
        t.sample("bestofn_speech_ttfa_seconds_bucket", n, cold=c, le="+Inf")
        t.sample("bestofn_speech_ttfa_seconds_sum", round(total, 6), cold=c)
        t.sample("bestofn_speech_ttfa_seconds_count", n, cold=c)
    t.family("bestofn_speech_in_flight", "gauge", "speech requests being answered here")
    t.sample("bestofn_speech_in_flight", in_flight)
    t.family("bestofn_worker_queue_depth", "gauge", "requests waiting in the worker's queue")
    t.sample("bestofn_worker_queue_depth", (worker or {}).get("queue_length") or 0)
    t.family("bestofn_worker_up", "gauge", "1 while the warm worker runs and answers")
    t.sample("bestofn_worker_up", int(bool(worker and worker.get("status") == "ok")))
    t.family("bestofn_worker_busy", "gauge", "1 while the worker renders")
    t.sample("bestofn_worker_busy", int(bool(worker and worker.get("busy"))))
    t.family("bestofn_worker_serves_this_config", "gauge", "1 if the worker's key is the config's")
    t.sample("bestofn_worker_serves_this_config",
             int(bool(worker and worker.get("serves_this_config"))))  # fmt: skip
    t.family("bestofn_worker_starts_total", "counter", "workers this server started")
    t.sample("bestofn_worker_starts_total", worker_starts)
    t.family("bestofn_draining", "gauge", "1 once a SIGTERM asked the server to stop")
    t.sample("bestofn_draining", int(draining))
    t.family("bestofn_uptime_seconds", "gauge", "seconds since the server started")
    t.sample("bestofn_uptime_seconds", round(uptime_s, 3))
    return "\n".join(t.lines) + "\n"
