"""Keep the GPU of a SLURM job busy across the groups of its bundle.

On SLURM, Snakemake runs the groups of a bundle (one SLURM job) one after another, each in a
fresh Snakemake and a fresh Python process, so the warm worker would wait several seconds for
every next request. profiles/slurm has the plugin run a job's group jobs in the job's batch step
(resource ``mpi: 0``: no ``srun`` step per group job, whose end would kill the worker it
started). There, the first group job of the job starts a **feeder**, a detached process that
lives until the job's Snakemake exits (or the job ends):

- it reads the bundle (the ``--target-jobs`` of the job's Snakemake) and plans the groups from
  the same config and sheets (``bestofn.core.plan``), so each group's spec is exactly its params;
- it starts the job's warm worker and sends it every group of the bundle,
  ``slots x runtime.queue_depth`` requests in flight (the ordinary ``/v1/groups`` path), each
  into a hidden staging sibling ``results/groups/{emotion}/.{prompt_id}.staged-{key}``;
- each group job then **claims** its staged group: it points the parquet's ``flac_path`` at the
  final directory and renames the directory into place (fsync'd). A group job whose group the
  feeder does not cover, or failed, runs it through the worker itself as usual.

``key`` hashes the group's params, the models section, the device and the FLAC subtype, so a
staged group is only ever claimed by the group job it was made for. A staged group left by a
killed job is reused by the next job of a rerun; only the group in flight is lost. The feeder's
files live in the job's node-local state directory (``default_state_dir()``, per SLURM job).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq

from bestofn.core.groupio import SCORES
from bestofn.core.pipeline import stable_hash
from bestofn.util import durable

log = logging.getLogger("bestofn.bundle")

STAGED = ".staged-"


def slurm_job_id() -> str | None:
    return os.environ.get("SLURM_JOB_ID") or None


def stage_key(params: str, models_json: str, device: str, flac_subtype: str) -> str:
    return stable_hash(
        {
            "spec": json.loads(params),
            "models": json.loads(models_json),
            "device": device,
            "flac_subtype": flac_subtype,
        }
    )


def staged_path(out: str | Path, key: str) -> Path:
    out = Path(out).absolute()
    return out.parent / f".{out.name}{STAGED}{key}"


def claim(out: str | Path, staged: Path) -> dict | None:
    """Publish a finished staged group as ``out``; None when there is none to claim.

    The parquet's ``flac_path`` values name the staging directory: they are rewritten to the
    final directory (a new parquet, fsync'd, renamed over the old one) before the directory is
    renamed into place, so the published group is exactly what a direct run writes."""
    out = Path(out).absolute()
    scores = staged / SCORES
    if not scores.is_file():
        return None
    if out.exists():  # published some other way: the staged copy is stale
        shutil.rmtree(staged, ignore_errors=True)
        return None
    table = pq.read_table(scores)
    if "flac_path" in table.column_names:
        paths = [
            str(Path(*[out.name if part == staged.name else part for part in Path(p).parts]))
            for p in table.column("flac_path").to_pylist()
        ]
        i = table.column_names.index("flac_path")
        table = table.set_column(i, table.schema.field(i), [paths])
        tmp = staged / f".{SCORES}.claim"
        with open(tmp, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, scores)
        durable.fsync(staged)
    os.rename(staged, out)
    durable.fsync(out.parent)
    row = table.slice(0, 1).to_pylist()[0] if table.num_rows else {}
    timings = {
        k: row.get(f"group_{k}")
        for k in ("generate_s", "restore_s", "score_s", "write_s", "wall_s")
        if row.get(f"group_{k}") is not None
    }
    return {
        "group_id": row.get("group_id", out.name),
        "slot": row.get("worker_slot", -1),
        "worker_pid": row.get("worker_pid"),
        "claimed": staged.name,
        "timings": timings,
    }


# ----------------------------------------------------------------------------- the bundle


def parse_target_jobs(argv: list[str], rule: str = "group") -> list[tuple[str, str]]:
    """(emotion, prompt_id) of every ``rule:emotion=..,prompt_id=..`` after --target-jobs."""
    out = []
    try:
        i = argv.index("--target-jobs") + 1
    except ValueError:
        return out
    while i < len(argv) and not argv[i].startswith("--"):
        name, _, wildcards = argv[i].partition(":")
        if name == rule:
            wc = dict(kv.split("=", 1) for kv in wildcards.split(",") if "=" in kv)
            if "emotion" in wc and "prompt_id" in wc:
                out.append((wc["emotion"], wc["prompt_id"]))
        i += 1
    return out


def _read_nul(path: str) -> list[str]:
    with open(path, "rb") as f:
        return [x.decode(errors="replace") for x in f.read().split(b"\0") if x]


def find_bundle(job_id: str) -> tuple[int, list[tuple[str, str]]] | None:
    """The pid and targets of this SLURM job's Snakemake (the one driving slurm-jobstep).

    It runs on this node (the batch step); its command line lists the bundle's jobs, where the
    executor interface writes them as checked against (else None: no bundle to stage)."""
    from bestofn.snakemake_speedups import target_jobs_cli_shape

    if not target_jobs_cli_shape():
        log.warning("--target-jobs is not written as bestofn.snakemake_speedups checked: no bundle")
        return None
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = _read_nul(f"/proc/{entry.name}/cmdline")
            if "--target-jobs" not in argv or "slurm-jobstep" not in argv:
                continue
            if f"SLURM_JOB_ID={job_id}" not in _read_nul(f"/proc/{entry.name}/environ"):
                continue
        except OSError:
            continue
        targets = parse_target_jobs(argv)
        if targets:
            return int(entry.name), targets
    return None


# ----------------------------------------------------------------------------- feeder state


def _lock_held(path: Path) -> bool:
    """True while another process holds the flock on ``path`` (the feeder, for its lifetime)."""
    try:
        f = open(path, "a")
    except OSError:
        return False
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


class Bundle:
    """The files of one SLURM job's feeder, in its node-local state directory."""

    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir)
        self.request = self.dir / "bundle.json"  # what the feeder is to do (the first client)
        self.lock = self.dir / "bundle.lock"  # held by the feeder while it lives
        self.plan = self.dir / "bundle.plan.json"  # keys the feeder will stage
        self.launch = self.dir / "bundle.launch.lock"

    def feeder_alive(self) -> bool:
        return _lock_held(self.lock)

    def planned(self) -> set[str] | None:
        try:
            return set(json.loads(self.plan.read_text())["keys"])
        except (OSError, ValueError, KeyError):
            return None

    def failed(self, key: str) -> str | None:
        path = self.dir / f"failed-{key}.txt"
        return path.read_text() if path.exists() else None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def start_feeder(bundle: Bundle, request: dict, log_path: Path, timeout: float = 120.0) -> bool:
    """Start this job's feeder once (the first group job of the job does); True if it runs.

    A detached process of the job's batch step (profiles/slurm runs group jobs there): it ends
    with the bundle's Snakemake, or with the job (scancel, time limit)."""
    bundle.dir.mkdir(parents=True, exist_ok=True)
    with open(bundle.launch, "a") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        if bundle.request.exists():
            return bundle.feeder_alive()
        _write_atomic(bundle.request, json.dumps(request))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "bestofn.worker.client.slurm_feeder", str(bundle.request)]
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        log.info("started the bundle feeder, pid %d (log %s)", proc.pid, log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if bundle.feeder_alive():
                return True
            if proc.poll() is not None:
                log.warning("feeder exited (%s) before starting; see %s", proc.returncode, log_path)
                return False
            time.sleep(0.05)
        log.warning("feeder not running after %.0f s; see %s", timeout, log_path)
        return False


def run_group_in_bundle(
    params: str, models_json: str, out: str, device: str, runtime: dict | None,
    results_dir: str, flac_subtype: str, config: dict,
) -> dict:  # fmt: skip
    """A group job inside a SLURM job: claim the group the feeder made, starting the feeder
    first if this is the job's first group; else run it through the worker as usual."""
    from bestofn.worker.client.group_job import run_group_via_worker
    from bestofn.worker.client.runtime import default_state_dir

    bundle = Bundle(Path((runtime or {}).get("state_dir") or default_state_dir()))
    key = stage_key(params, models_json, device, flac_subtype)
    staged = staged_path(out, key)
    spec = json.loads(params)
    request = {
        "config": config,
        "workdir": os.getcwd(),
        "models_json": models_json,
        "device": device,
        "flac_subtype": flac_subtype,
        "runtime": runtime,
        "results_dir": results_dir,
        "first": [spec["emotion"], spec["prompt_id"]],
        "job_id": slurm_job_id(),
    }
    feeder_log = Path(results_dir) / "logs" / "workers" / f"slurm-{slurm_job_id()}-feeder.log"
    # BESTOFN_BUNDLE_FEEDER=0: every group job sends its own group (the benchmark's baseline).
    if os.environ.get("BESTOFN_BUNDLE_FEEDER", "1") != "0" and start_feeder(
        bundle, request, feeder_log
    ):
        while True:
            answer = claim(out, staged)
            if answer is not None:
                return answer
            why = bundle.failed(key)
            planned = bundle.planned()
            if (
                why is not None
                or not bundle.feeder_alive()
                or (planned is not None and key not in planned)
            ):
                answer = claim(out, staged)  # it may have finished just now
                if answer is not None:
                    return answer
                log.info("group %s: not staged by the feeder (%s); running it here", out, why)
                break
            time.sleep(0.1)
    return run_group_via_worker(
        params, models_json, out, device, runtime, results_dir, flac_subtype
    )


# ----------------------------------------------------------------------------- the feeder


def feed(request_path: Path) -> int:
    """The feeder step: stage every group of this job's bundle through the warm worker."""
    from bestofn.core.plan import build_plan
    from bestofn.worker.client.group_job import run_group_via_worker
    from bestofn.worker.client.runtime import Runtime, default_state_dir, detect_slots

    req = json.loads(Path(request_path).read_text())
    os.chdir(req["workdir"])
    bundle = Bundle(Path(request_path).parent)
    lock = open(bundle.lock, "a")
    fcntl.flock(lock, fcntl.LOCK_EX)  # held until this process exits: "the feeder is alive"
    t0 = time.monotonic()
    found = find_bundle(req["job_id"])
    if found is None:
        log.warning(
            "no Snakemake of job %s found on this node: staging only the first group", req["job_id"]
        )
        driver, targets = None, []
    else:
        driver, targets = found
    first = tuple(req["first"])
    order = [first] + [t for t in targets if t != first]
    plan = build_plan(req["config"], base=".")
    results = Path(req["results_dir"])
    todo, keys = [], []
    for e, p in order:
        if (e, p) not in plan.groups:
            continue
        params = plan.group_params(e, p)
        key = stage_key(params, req["models_json"], req["device"], req["flac_subtype"])
        out = (results / "groups" / e / p).absolute()
        staged = staged_path(out, key)
        for old in out.parent.glob(f".{p}{STAGED}*"):  # staged for other params: stale
            if old.name != staged.name:
                shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            continue
        keys.append(key)
        if not (staged / SCORES).is_file():  # a staged group left by a killed job is reused
            todo.append((params, str(staged), key))
    _write_atomic(bundle.plan, json.dumps({"keys": keys}))
    rt = Runtime.from_config(req["runtime"])
    state = Path(rt.state_dir) if rt.state_dir else default_state_dir()
    assert state == bundle.dir, (state, bundle.dir)
    in_flight = max(1, (rt.slots or detect_slots(req["device"])) * rt.queue_depth)
    log.info(
        "job %s: bundle of %d groups, %d to run, %d staged before; %d in flight (plan %.1f s)",
        req["job_id"], len(targets), len(todo), len(keys) - len(todo), in_flight,
        time.monotonic() - t0,
    )  # fmt: skip
    queue = list(reversed(todo))
    qlock = threading.Lock()

    def work():
        while True:
            with qlock:
                if not queue:
                    return
                params, staged, key = queue.pop()
            try:
                run_group_via_worker(
                    params, req["models_json"], staged, req["device"], req["runtime"],
                    req["results_dir"], req["flac_subtype"],
                )  # fmt: skip
            except Exception as e:  # the group job runs it itself and reports the error
                log.error("staging %s failed: %s", staged, e)
                _write_atomic(bundle.dir / f"failed-{key}.txt", f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, daemon=True) for _ in range(in_flight)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.info(
        "bundle staged in %.1f s; waiting for the job's Snakemake to finish", time.monotonic() - t0
    )
    # Stay (and keep the worker, our child, alive) while the job's Snakemake runs: a group job
    # that has to run its group itself still finds the warm worker.
    while driver is not None and os.path.exists(f"/proc/{driver}"):
        time.sleep(1.0)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return feed(Path(argv[0]))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
