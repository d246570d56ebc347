"""The group job's side: take a free queue place on a slot, make sure that slot's worker runs
the right models (start or replace it), send the group, wait for the published directory.

Slot pool: ``slots x queue_depth`` lock files taken with non-blocking flock. A job holds one
for its whole request, so at most ``queue_depth`` groups are sent to one worker at a time: one
running (a pair, with pairing), the next already waiting. Places are tried place-major (q0 on
every slot, then q1...), which spreads groups over GPUs before queueing behind a busy one.

Worker contract (``bestofn.worker.key``): a warm worker is reused only when it is healthy
and its key (models, device, FLAC subtype, results directory, the runtime options it serves
with) is the one the group needs; any
other worker on the slot is stopped first (and waited for) and a fresh one started. A worker
that answered "fatal device error" is waited for until its process is gone, so neither its
socket nor its pid file can route a retry to it."""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bestofn.core.groupio import SCORES
from bestofn.core.pipeline import stable_hash
from bestofn.worker.client.runtime import Runtime, SlotPool, default_state_dir, detect_slots
from bestofn.worker.key import spec_difference, worker_key, worker_spec
from bestofn.worker.uds_http import request

log = logging.getLogger("bestofn.client")


class WorkerError(RuntimeError):
    pass


LOAD_FAILED = "load-failed.json"  # in the state dir: the models of this run that cannot load


class WorkerLoadError(WorkerError):
    """A worker could not load its models (broken weights, a device that cannot run them): a
    retry or another slot would fail the same way, so this run starts no other worker for
    them (until ``clear_load_failure``: the workflow's onstart)."""


def clear_load_failure(state_dir: str | Path) -> None:
    (Path(state_dir) / LOAD_FAILED).unlink(missing_ok=True)


def _load_failure(pool, key: str) -> str | None:
    try:
        record = json.loads((pool.dir / LOAD_FAILED).read_text())
    except (OSError, ValueError):
        return None
    return record.get("error") if record.get("worker_key") == key else None


def _record_load_failure(pool, key: str, error: str) -> None:
    tmp = pool.dir / f".{LOAD_FAILED}.{os.getpid()}"
    tmp.write_text(json.dumps({"worker_key": key, "error": error}))
    os.replace(tmp, pool.dir / LOAD_FAILED)


def health(sock: str, timeout: float = 5.0) -> dict | None:
    try:
        status, body, _ = request(sock, "GET", "/health", timeout=timeout)
    except (OSError, http.client.HTTPException):
        return None
    return body if status == 200 else None


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs. A worker we started ourselves is reaped here, and a zombie
    (exited, not yet reaped by its parent) counts as gone."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _is_worker(pid: int | None, sock: str) -> bool:
    """True while ``pid`` runs and is the worker of ``sock`` (a recycled pid is not)."""
    if not pid or not _pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc (or not ours to read): trust the pid
    return os.fsencode(sock) in cmdline


def _wait_gone(pid: int | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid and _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not (pid and _pid_alive(pid))


def ask_to_stop(pool: SlotPool, slot: int) -> None:
    """Ask a slot's worker to exit after its current group (and the queued ones); no wait."""
    with contextlib.suppress(OSError, http.client.HTTPException):
        request(pool.socket(slot), "POST", "/v1/shutdown", {}, timeout=5)


def stop_worker(pool: SlotPool, slot: int, timeout: float = 120.0) -> bool:
    """Ask a slot's worker to exit after its current group; kill it if it doesn't."""
    sock, pid = pool.socket(slot), _read_pid(pool.pidfile(slot))
    if not _is_worker(pid, sock):
        pid = None  # gone, or the pid was recycled by another process: never signal that one
    ask_to_stop(pool, slot)
    if not _wait_gone(pid, timeout) and pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, 10)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock)
    return True


@functools.lru_cache(maxsize=8)
def _weights_digest(models_json: str, memo_dir: Path | None) -> str:
    """The models' content identity, hashed once a process (the plan filled the memo)."""
    from bestofn.core.pipeline import models_identity

    return stable_hash(models_identity(json.loads(models_json), memo_dir))


def slot_spec(
    pool: SlotPool, slot: int, models: dict, results_dir: Path, flac_subtype: str, rt: Runtime
) -> dict:
    """The spec of the worker a group on ``slot`` needs (see bestofn.worker.key): the
    weights' content identity in it, so that a warm worker is not reused once a weight file's
    bytes changed at the same path."""
    memo = (
        Path(results_dir) / Path(rt.cache_dir).expanduser() / "sha256-memo"
        if rt.cache_dir
        else None
    )
    weights = _weights_digest(json.dumps(models, sort_keys=True), memo)
    visible = pool.cuda_visible(slot) if pool.device.startswith("cuda") else None
    options = rt.worker_options(results_dir).serving()
    return worker_spec(models, pool.device, flac_subtype, results_dir, visible, options, weights)


def _serves(h: dict | None, key: str) -> bool:
    return bool(h) and h.get("status") == "ok" and h.get("worker_key") == key


def ensure_worker(
    pool: SlotPool, slot: int, models: dict, results_dir: Path, rt: Runtime, log_dir: Path,
    flac_subtype: str = "PCM_16", warm_up_spec: dict | None = None,
) -> dict:  # fmt: skip
    """Return the health of a ready worker on ``slot`` for this spec, starting it if needed.
    ``warm_up_spec``: the group a worker started now warms up on (``runtime.warm_up``)."""
    spec = slot_spec(pool, slot, models, results_dir, flac_subtype, rt)
    key = worker_key(spec)
    sock = pool.socket(slot)
    h = health(sock)
    if _serves(h, key):
        return h
    with pool.starter(slot):
        h = health(sock)
        if _serves(h, key):
            return h
        pid = _read_pid(pool.pidfile(slot))
        if h is not None:  # another spec, stopping, or dying of a device error: replace it
            if h.get("fatal_error"):
                why = f"dying of a fatal device error: {h['fatal_error']}"
            elif h.get("worker_key") != key:
                why = f"spec differs: {spec_difference(h, spec)}"
            else:
                why = h.get("status")
            log.info("slot %d: replacing worker %s (%s)", slot, h["pid"], why)
            stop_worker(pool, slot, timeout=rt.start_timeout_s)
        elif _is_worker(pid, sock):
            # A worker still loading (its starter may have died): give it the start timeout.
            h = _wait_ready(sock, None, rt.start_timeout_s, None, pid=pid)
            if _serves(h, key):
                return h
            stop_worker(pool, slot, timeout=10)
        failed = _load_failure(pool, key)
        if failed is not None:
            raise WorkerLoadError(
                "not starting a worker: one of this run could not load these models; fix "
                f"that and run again. Its error: {failed}"
            )
        try:
            return _start(pool, slot, models, key, results_dir, rt, log_dir, flac_subtype,
                          warm_up_spec)  # fmt: skip
        except WorkerLoadError as e:
            from bestofn.weights.diagnose import broken_weights

            broken = broken_weights(models)  # the file, where the loader's error names none
            if broken:
                e = WorkerLoadError(f"{e}\nweight files that cannot load:\n" + "\n".join(broken))
            _record_load_failure(pool, key, str(e))
            raise e from None


def _start(
    pool, slot, models, key, results_dir, rt, log_dir, flac_subtype, warm_up_spec=None
) -> dict:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"slot{slot}.log"
    models_file = pool.dir / f"slot{slot}.models.json"
    models_file.write_text(json.dumps(models))
    warm_up_file = pool.dir / f"slot{slot}.warm-up.json"
    warm_up_file.unlink(missing_ok=True)
    if warm_up_spec is not None:
        warm_up_file.write_text(json.dumps(warm_up_spec))
    env = dict(os.environ)
    device = pool.device
    if device.startswith("cuda"):
        env["CUDA_VISIBLE_DEVICES"] = pool.cuda_visible(slot)
        device = "cuda:0"
    cmd = [
        sys.executable, "-m", "bestofn.cli", "worker",
        "--socket", pool.socket(slot), "--slot", str(slot), "--device", device,
        "--models-file", str(models_file), "--worker-key", key,
        "--results", str(results_dir), "--flac-subtype", flac_subtype,
        "--options", rt.worker_options(results_dir).to_json(),
    ]  # fmt: skip
    if warm_up_spec is not None:
        cmd += ["--warm-up-spec", str(warm_up_file)]
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )  # fmt: skip
    pool.pidfile(slot).write_text(str(proc.pid))
    log.info("slot %d: started worker pid %d (log %s)", slot, proc.pid, log_path)
    h = _wait_ready(pool.socket(slot), proc, rt.start_timeout_s, log_path)
    if h is None:
        proc.kill()
        raise WorkerError(
            f"worker for slot {slot} not ready after {rt.start_timeout_s:.0f} s "
            f"(runtime.start_timeout_s); see {log_path}"
        )
    return h


def _tail(path: Path | None, n: int = 20) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def _wait_ready(sock, proc, timeout, log_path, pid: int | None = None) -> dict | None:
    """Health once the worker answers; None after ``timeout`` or once ``pid`` has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = health(sock, timeout=2)
        if h is not None:
            return h
        if proc is not None and proc.poll() is not None:
            raise WorkerLoadError(
                f"worker exited with code {proc.returncode} while starting; last lines of "
                f"{log_path}:\n{_tail(log_path)}"
            )
        if pid is not None and not _pid_alive(pid):
            return None
        time.sleep(0.2)
    return None


def _await_exit(pool: SlotPool, slot: int, pid: int | None, timeout: float = 60.0) -> None:
    """A worker that announced a fatal error exits by itself; make sure it is gone (kill it if
    it hangs) before the job fails, so the retry finds no socket or pid to go back to."""
    if pid and not _wait_gone(pid, timeout) and _is_worker(pid, pool.socket(slot)):
        log.warning(
            "slot %d: dying worker %d still runs after %.0f s: killing it", slot, pid, timeout
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, 10)
    if _read_pid(pool.pidfile(slot)) == pid:
        pool.pidfile(slot).unlink(missing_ok=True)


def run_group_via_worker(
    params: str, models_json: str, out: str, device: str, runtime: dict | None,
    results_dir: str, flac_subtype: str = "PCM_16",
) -> dict:  # fmt: skip
    """What a group job does with workers on: returns the worker's answer."""
    rt = Runtime.from_config(runtime)
    models = json.loads(models_json)
    state = Path(rt.state_dir) if rt.state_dir else default_state_dir()
    pool = SlotPool(state, rt.slots or detect_slots(device), rt.queue_depth, device)
    log_dir = Path(rt.log_dir or Path(results_dir) / "logs" / "workers")
    results = Path(results_dir).resolve()
    with pool.place() as slot:
        for attempt in range(3):
            h = ensure_worker(pool, slot, models, results, rt, log_dir, flac_subtype,
                              warm_up_spec=json.loads(params))  # fmt: skip
            log.info("slot %d: worker pid %s, %d groups served", slot, h["pid"], h["groups_served"])
            body = {"spec": json.loads(params), "out": str(Path(out).resolve()),
                    "worker_key": h["worker_key"], "workdir": os.getcwd()}  # fmt: skip
            try:
                status, answer, _ = request(pool.socket(slot), "POST", "/v1/groups", body)
            except (OSError, http.client.HTTPException) as e:
                raise WorkerError(
                    f"worker pid {h['pid']} on slot {slot} died while running {out} ({e}); "
                    f"see {log_dir / f'slot{slot}.log'}. The group was not published; a retry "
                    "starts a fresh worker."
                ) from None
            if isinstance(answer, dict) and answer.get("fatal"):
                _await_exit(pool, slot, h["pid"])
                raise WorkerError(
                    f"worker pid {h['pid']} on slot {slot} hit a fatal device error while "
                    f"running {out} ({answer['fatal']}) and has exited; see "
                    f"{log_dir / f'slot{slot}.log'}. The group was not published; a retry "
                    "starts a fresh worker."
                )
            if status in (409, 503) and attempt < 2:  # replaced, stopping or dying: again
                continue
            if status != 200:
                raise WorkerError(
                    f"worker on slot {slot} failed group {out}: {answer.get('error')}"
                )
            break
    if not (Path(out) / SCORES).is_file():
        raise WorkerError(f"worker answered but {out}/{SCORES} is missing")
    answer["slot"] = slot
    return answer


def list_workers(state_dir: Path) -> list[dict]:
    out = []
    for sock in sorted(Path(state_dir).glob("slot*.sock")):
        h = health(str(sock)) or {"status": "not answering"}
        out.append({"socket": str(sock), **h})
    return out


def stop_all(state_dir: Path, timeout: float = 120.0, wait: bool = True) -> int:
    """Stop every worker of ``state_dir``: all are asked first, so that they finish and exit
    side by side (a worker's exit takes seconds: its device and interpreter teardown), then
    each is waited for (and killed if it does not go). ``wait`` False: ask only."""
    if not Path(state_dir).is_dir():
        return 0
    pool = SlotPool(state_dir, 0, 0, "cpu")
    slots = sorted(int(p.stem[4:]) for p in Path(state_dir).glob("slot*.pid"))
    for slot in slots:
        ask_to_stop(pool, slot)
    if not wait:
        return len(slots)
    for slot in slots:
        stop_worker(pool, slot, timeout)
        pool.pidfile(slot).unlink(missing_ok=True)
    return len(slots)
