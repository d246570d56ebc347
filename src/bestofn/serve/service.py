"""The speech service behind `bestofn serve` (``bestofn.serve.app`` is its HTTP front): the config
and its voices, the warm worker it needs, the request checks, and the metrics.

A request is checked as a sheet row is (empty text, more than ``max_words`` words, an unknown
voice: 400 with the reason) before it reaches the worker. ``voice`` names a configured emotion
(its reference voice and description) or the voice id ``default`` (the generator's own voice),
never a file. The first request starts the same warm worker the workflow uses
(``bestofn.worker.client.group_job.ensure_worker``: same state directory, same worker key); a
changed
config (or emotions sheet) is read again on the next request."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import statistics
import threading
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path

from bestofn.core import speech as speech_io
from bestofn.serve import encode

log = logging.getLogger("bestofn.serve")

MAX_BODY = 64 * 1024  # a speech request is a small JSON document
KNOWN_FIELDS = (
    "model", "input", "voice", "response_format", "speed", "stream_format", "instructions",
    "seed", "stream",
)  # fmt: skip
STREAM_FORMATS = ("audio", "sse")
DEFAULT_VOICE = "default"
API_KEY_ENV = "BESTOFN_API_KEY"
UPSTREAM_TIMEOUT_S = 600.0  # one read from the worker (it may be finishing a group first)
# OpenAI's response formats: the worker encodes wav, flac and pcm; mp3, opus and aac are
# encoded here from the worker's wav (``bestofn.serve.encode``). mp3 is the default, as
# OpenAI's is.
DEFAULT_FORMAT = "mp3"
SERVED_FORMATS = (*encode.FORMATS, *speech_io.FORMATS)
CONTENT_TYPES = {**speech_io.CONTENT_TYPES, **encode.CONTENT_TYPES}


class ApiError(Exception):
    """An error answer in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.headers = dict(headers or {})

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        if self.status == 401:
            kind = "authentication_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": None}}  # fmt: skip


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost: it may resolve anywhere


def bind_refusal(host: str, api_key: str | None) -> str | None:
    """Why ``bestofn serve`` must not listen on ``host`` (None: it may)."""
    if is_loopback(host) or api_key:
        return None
    return (
        f"refusing to listen on {host!r} without an API key: any address but loopback "
        "(127.0.0.1, ::1, localhost) lets other machines use the models. Pass --api-key KEY "
        f"or set {API_KEY_ENV} (clients send 'Authorization: Bearer KEY'), or listen on "
        "127.0.0.1"
    )


@dataclass(frozen=True)
class Voice:
    id: str
    emotion: str  # "" for the default voice
    reference_audio: str | None  # absolute path, or None: the generator's own voice
    description: str
    negative_description: str


@dataclass(frozen=True)
class Snapshot:
    """What one version of the config says the service serves."""

    config: dict
    voices: dict[str, Voice]
    models: dict
    model_ids: tuple[str, ...]
    results: Path
    runtime: object  # bestofn.worker.client.runtime.Runtime
    pool: object  # bestofn.worker.client.runtime.SlotPool
    log_dir: Path
    key: str  # the worker key a request needs
    stamp: tuple  # (path, mtime, size) of the config and the emotions sheet it was read from
    slot: int = 0

    @property
    def socket_path(self) -> str:
        return self.pool.socket(self.slot)


def _stamp(paths: list[Path]) -> tuple:
    out = []
    for p in paths:
        try:
            st = p.stat()
            out.append((str(p), st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((str(p), None, None))
    return tuple(out)


# Time-to-first-audio histogram buckets (seconds) for /metrics: from a warm streamed render's
# first chunk to a cold start that loads the models.
TTFA_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Metrics:
    """Per-request time to first audio and real-time factor (the last ``keep`` in /health), and
    the running totals /metrics exports: HTTP answers by endpoint and status, speech requests
    by outcome, audio seconds, a TTFA histogram."""

    def __init__(self, keep: int = 200):
        self.lock = threading.Lock()
        self.recent: deque[dict] = deque(maxlen=keep)
        self.served = self.failed = self.client_left = self.in_flight = 0
        self.audio_s = 0.0
        self.http_answers: Counter[tuple[str, int]] = Counter()  # (endpoint, status)
        self.ttfa_counts = {cold: [0] * len(TTFA_BUCKETS) for cold in (False, True)}
        self.ttfa_sum = {False: 0.0, True: 0.0}
        self.ttfa_n = {False: 0, True: 0}

    def answered(self, endpoint: str, status: int) -> None:
        with self.lock:
            self.http_answers[(endpoint, status)] += 1

    def record(self, rec: dict) -> None:
        with self.lock:
            self.recent.append(rec)
            ttfa, cold = rec.get("ttfa_s"), bool(rec.get("cold"))
            if rec["outcome"] == "ok" and ttfa is not None:
                self.ttfa_n[cold] += 1
                self.ttfa_sum[cold] += ttfa
                for i, edge in enumerate(TTFA_BUCKETS):
                    if ttfa <= edge:
                        self.ttfa_counts[cold][i] += 1
            if rec["outcome"] == "ok":
                self.served += 1
                self.audio_s += rec["audio_s"]
            elif rec["outcome"] == "client_left":
                self.client_left += 1
            else:
                self.failed += 1

    def summary(self) -> dict:
        with self.lock:
            ok = [r for r in self.recent if r["outcome"] == "ok"]
            last = list(self.recent)[-10:]
            counts = {"served": self.served, "failed": self.failed,
                      "client_left": self.client_left, "in_flight": self.in_flight,
                      "audio_s": round(self.audio_s, 3)}  # fmt: skip

        def stats(values: list[float], scale: float = 1.0) -> dict | None:
            if not values:
                return None
            v = sorted(x * scale for x in values)
            return {
                "mean": round(statistics.fmean(v), 3),
                "p50": round(v[len(v) // 2], 3),
                "p95": round(v[min(len(v) - 1, int(0.95 * len(v)))], 3),
                "max": round(v[-1], 3),
                "n": len(v),
            }

        warm = [r for r in ok if not r["cold"]]
        cold = [r for r in ok if r["cold"]]
        return {
            **counts,
            # requests that found the worker warm; those that started it are counted apart
            "ttfa_ms": stats([r["ttfa_s"] for r in warm if r["ttfa_s"] is not None], 1000.0),
            "rtf": stats([r["rtf"] for r in warm if r["rtf"] is not None]),
            "cold_ttfa_ms": stats([r["ttfa_s"] for r in cold if r["ttfa_s"] is not None], 1000.0),
            "last": last,
        }


class Service:
    """The config, the voices, the worker it needs, and the request checks."""

    def __init__(
        self,
        config_path: str | Path,
        base: str | Path = ".",
        slot: int = 0,
        idle_timeout_s: float | None = None,
        speech_max_batch: int | None = None,
        speech_batch_window_ms: float | None = None,
    ):
        self.config_path = Path(config_path)
        self.base = Path(base)
        self.slot = slot
        # command-line values over the config's runtime (for the worker this server starts)
        self.overrides = {
            k: v
            for k, v in (
                ("idle_timeout_s", idle_timeout_s),
                ("speech_max_batch", speech_max_batch),
                ("speech_batch_window_ms", speech_batch_window_ms),
            )
            if v is not None
        }
        self.lock = threading.Lock()  # config reloads
        self.start_lock = threading.Lock()  # one worker start at a time from this server
        self.worker_starts = 0
        self.last_worker_pid: int | None = None
        self.metrics = Metrics()
        self.snap = self._load()

    # ---- config ------------------------------------------------------------------------------

    def _load(self) -> Snapshot:
        """Validate the config and sheets as `bestofn check` does (no model loads)."""
        from bestofn.core.config import load_config
        from bestofn.core.plan import build_plan, read_sheet
        from bestofn.worker.client.group_job import slot_spec
        from bestofn.worker.client.runtime import Runtime, SlotPool, default_state_dir, detect_slots
        from bestofn.worker.key import worker_key

        stamp_before = self._stamp_paths(None)
        plan = build_plan(load_config(self.config_path), self.base)
        config = plan.config
        emotions_path = self.base / config["emotions"]
        voices = {
            DEFAULT_VOICE: Voice(DEFAULT_VOICE, "", None, "", ""),
        }
        for row in read_sheet(emotions_path, "emotions"):
            ref = row.get("reference_audio") or None
            if ref is not None:
                ref = str((self.base / ref).resolve() if not Path(ref).is_absolute() else ref)
            voices[row["emotion"]] = Voice(
                row["emotion"], row["emotion"], ref, row.get("description", ""),
                row.get("negative_description", ""),
            )  # fmt: skip
        rt = Runtime.from_config({**(config.get("runtime") or {}), **self.overrides})
        device = config["device"]
        state = Path(rt.state_dir) if rt.state_dir else default_state_dir(self.base)
        pool = SlotPool(state, rt.slots or detect_slots(device), rt.queue_depth, device)
        if not 0 <= self.slot < pool.slots:
            raise ValueError(f"--slot {self.slot}: this config has slots 0..{pool.slots - 1}")
        results = (self.base / config["results"]).resolve()
        models = config["models"]
        key = worker_key(slot_spec(pool, self.slot, models, results, config["flac_subtype"], rt))
        log_dir = Path(rt.log_dir) if rt.log_dir else results / "logs" / "workers"
        backend = models["generator"]["backend"]
        return Snapshot(
            config=config, voices=voices, models=models, model_ids=(backend, "bestofn"),
            results=results, runtime=rt, pool=pool, log_dir=log_dir, key=key,
            stamp=stamp_before, slot=self.slot,
        )  # fmt: skip

    def _stamp_paths(self, snap: Snapshot | None) -> tuple:
        paths = [self.config_path]
        if snap is not None:
            paths.append(self.base / snap.config["emotions"])
        else:
            with contextlib.suppress(Exception):
                from bestofn.core.config import load_config

                paths.append(self.base / load_config(self.config_path)["emotions"])
        return _stamp(paths)

    def current(self) -> Snapshot:
        """The snapshot for a request: read again when the config or emotions sheet changed."""
        with self.lock:
            if self._stamp_paths(self.snap) == self.snap.stamp:
                return self.snap
            try:
                snap = self._load()
            except Exception as e:  # PlanError, YAML errors, a missing file...
                raise ApiError(
                    503, f"config {self.config_path} changed and is not valid now: {e}"
                ) from None
            if snap.key != self.snap.key:
                log.info("config changed: the worker key is now %s", snap.key)
            self.snap = snap
            return snap

    # ---- the worker --------------------------------------------------------------------------

    def ensure_worker(self, snap: Snapshot) -> dict:
        """Start (or replace) the worker this snapshot needs; its health."""
        from bestofn.worker.client.group_job import WorkerError, ensure_worker, health

        with self.start_lock:
            before = health(snap.socket_path, timeout=2)
            try:
                h = ensure_worker(
                    snap.pool, snap.slot, snap.models, snap.results, snap.runtime, snap.log_dir,
                    snap.config["flac_subtype"],
                )  # fmt: skip
            except WorkerError as e:
                raise ApiError(503, f"the worker did not start: {e}") from None
            if not (before and before.get("pid") == h["pid"] and before.get("status") == "ok"):
                self.worker_starts += 1
                log.info("worker pid %s ready (load %.1f s)", h["pid"], h.get("load_s", 0))
            self.last_worker_pid = h["pid"]
            return h

    def worker_health(self) -> dict | None:
        from bestofn.worker.client.group_job import health

        snap = self.snap
        h = health(snap.socket_path, timeout=2)
        if h is None:
            return None
        keep = ("status", "pid", "device", "load_count", "load_s", "speech_served",
                "groups_served", "speech_batching", "busy", "queue_length", "uptime_s",
                "models_hash", "worker_key", "gpu_memory_cap")  # fmt: skip
        out = {k: h.get(k) for k in keep}
        out["serves_this_config"] = h.get("worker_key") == snap.key
        return out

    # ---- requests ----------------------------------------------------------------------------

    def check(self, body: dict, snap: Snapshot) -> tuple[dict, str, str, Voice]:
        """A request -> (worker body, response_format, stream_format, voice); ApiError(400)."""
        unknown = sorted(set(body) - set(KNOWN_FIELDS))
        if unknown:
            raise ApiError(
                400, f"unknown field(s) {unknown}; known: {', '.join(KNOWN_FIELDS)}", unknown[0]
            )
        text = body.get("input")
        if not isinstance(text, str):
            raise ApiError(400, "'input' must be a string (the text to speak)", "input")
        if not text.strip():
            raise ApiError(400, "'input' is empty or whitespace", "input")
        n_words, max_words = len(text.split()), snap.config["max_words"]
        if n_words > max_words:
            raise ApiError(
                400, f"'input' has {n_words} words, more than max_words={max_words} (config "
                f"{self.config_path}); split the text into several requests", "input",
            )  # fmt: skip
        model = body.get("model")
        if model not in snap.model_ids:
            raise ApiError(
                400, f"model {model!r} is not served here; use one of {list(snap.model_ids)}",
                "model",
            )  # fmt: skip
        voice = self._voice(body.get("voice"), snap)
        fmt = body.get("response_format", DEFAULT_FORMAT)
        if fmt not in SERVED_FORMATS:
            raise ApiError(
                400, f"response_format {fmt!r} is not supported; use one of "
                f"{', '.join(SERVED_FORMATS)}", "response_format",
            )  # fmt: skip
        stream_format = body.get("stream_format", "audio")
        if stream_format not in STREAM_FORMATS:
            raise ApiError(
                400, f"stream_format {stream_format!r}; use 'audio' or 'sse'", "stream_format"
            )
        speed = body.get("speed", 1.0)
        if not isinstance(speed, int | float) or isinstance(speed, bool) or speed != 1.0:
            # the generators have no tempo control, and resampling would change the pitch too
            raise ApiError(
                400, f"speed {speed!r} is not supported; only 1.0 (no generator here has a tempo "
                "control, and resampling would change the pitch as well)", "speed",
            )  # fmt: skip
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise ApiError(400, "'instructions' must be a string", "instructions")
        seed = body.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
            raise ApiError(400, f"seed {seed!r}: must be an integer in 0..2**63-1", "seed")
        if not isinstance(body.get("stream", True), bool):
            raise ApiError(400, "'stream' must be true or false (audio is always streamed)")
        worker_body = {
            "input": text, "response_format": "wav" if fmt in encode.FORMATS else fmt,
            "model": "bestofn", "seed": seed,
            "voice": voice.id, "emotion": voice.emotion, "reference_audio": voice.reference_audio,
            "emotion_description": instructions or voice.description,
            "negative_description": voice.negative_description, "worker_key": snap.key,
        }  # fmt: skip
        return worker_body, fmt, stream_format, voice

    def _voice(self, value, snap: Snapshot) -> Voice:
        if isinstance(value, dict) and set(value) == {"id"}:
            value = value["id"]  # OpenAI's custom voice object
        if not isinstance(value, str) or not value:
            raise ApiError(400, "'voice' must name a configured voice", "voice")
        if value in snap.voices:
            return snap.voices[value]
        names = sorted(snap.voices)
        listed = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        pathlike = any(c in value for c in "/\\") or value.startswith(".")
        if pathlike or Path(value).suffix.lower() in (".wav", ".flac", ".mp3", ".ogg"):
            raise ApiError(
                400, f"voice {value!r} looks like a file path; voices are names, not files: "
                f"{listed} (GET /v1/audio/voices)", "voice",
            )  # fmt: skip
        raise ApiError(
            400, f"unknown voice {value!r}; configured voices: {listed} (the emotions sheet "
            f"{snap.config['emotions']}, plus 'default')", "voice",
        )  # fmt: skip
