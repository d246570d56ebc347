"""CPU demo benchmark: wall time, worker peak RSS and worker CPU time of the default workflow.

Usage (repository root, venv active or by path):

    .venv/bin/python docs/bench/demo_cpu.py [--src DIR] [--label NAME] [--keep]

Copies ``config/`` into a fresh directory under /tmp and runs
``snakemake --profile profiles/local --snakefile Snakefile --directory DIR`` there (its worker
state lives under a key of that directory, so it never meets another checkout's worker). While
it runs, the slot-0 worker's ``/proc/PID/status`` VmHWM (peak RSS) and its user+system CPU
seconds are sampled every 0.25 s; the workflow's own ``onsuccess`` stops the worker, and the
last sample is its final figure (the worker is idle by then). ``--src`` puts another source
tree's Snakefile, profile, config and library (first on PYTHONPATH) in place of this
checkout's, e.g. an older commit exported with ``git archive``, to measure it with the same venv.
Prints one JSON line; per-scorer seconds come from the parquet files' ``score_seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _proc(pid: int) -> tuple[int, float] | None:
    """(VmHWM in bytes, user+system CPU seconds) of a live process, else None."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    hwm = [int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM")]
    if not hwm:  # a zombie: exited, not yet reaped
        return None
    fields = stat.rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return hwm[0], cpu


def _sample_workers(state_dir: Path, stop: threading.Event, seen: dict) -> None:
    while not stop.is_set():
        for pidfile in state_dir.glob("slot*.pid"):
            try:
                pid = int(pidfile.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            got = _proc(pid)
            if got:
                seen[pid] = got
        stop.wait(0.25)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", help="source tree to put first on PYTHONPATH")
    ap.add_argument("--label", default="")
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    args = ap.parse_args()

    base = Path(args.src).resolve() if args.src else REPO
    sys.path.insert(0, str(base / "src"))
    try:
        from bestofn.worker.client.group_job import default_state_dir
    except ImportError:  # a --src tree whose worker client is the module bestofn.worker.client
        from bestofn.worker.client import default_state_dir

    run_dir = Path(tempfile.mkdtemp(prefix="bestofn-demo-"))
    shutil.copytree(base / "config", run_dir / "config")
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = str(base / "src")
    state = default_state_dir(run_dir)
    seen: dict[int, tuple[int, float]] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_workers, args=(state, stop, seen), daemon=True)
    sampler.start()
    bindir = Path(sys.executable).parent
    cmd = [
        str(bindir / "snakemake"),
        "--profile",
        str(base / "profiles/local"),
        "--snakefile",
        str(base / "Snakefile"),
        "--directory",
        str(run_dir),
        "--quiet",
    ]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    if proc.returncode:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"snakemake failed ({proc.returncode}); run dir {run_dir}")

    import duckdb

    con = duckdb.connect()
    pq = str(run_dir / "results/groups/*/*/scores.parquet")
    per_scorer: dict[str, float] = {}
    for (js,) in con.execute(
        f"SELECT any_value(score_seconds) FROM read_parquet('{pq}') GROUP BY group_id"
    ).fetchall():
        for k, v in json.loads(js).items():
            per_scorer[k] = per_scorer.get(k, 0.0) + v
    stages = con.execute(
        f"""SELECT count(*), sum(n), sum(g), sum(r), sum(s), sum(l) FROM (
                SELECT count(*) AS n, any_value(group_generate_s) AS g,
                       any_value(group_restore_s) AS r, any_value(group_score_s) AS s,
                       any_value(group_load_s) AS l
                FROM read_parquet('{pq}') GROUP BY group_id)"""
    ).fetchone()
    worker_pids = sorted(seen)
    print(
        json.dumps(
            {
                "label": args.label,
                "src": args.src or str(REPO),
                "run_dir": str(run_dir),
                "wall_s": round(wall, 1),
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "workers": len(worker_pids),
                "worker_peak_rss_mb": [round(seen[p][0] / 2**20) for p in worker_pids],
                "worker_cpu_s": [round(seen[p][1], 1) for p in worker_pids],
                "groups": stages[0],
                "clips": stages[1],
                "generate_s": round(stages[2], 1),
                "restore_s": round(stages[3], 1),
                "score_s": round(stages[4], 1),
                "load_s": round(stages[5], 1),
                "score_s_by_scorer": {k: round(v, 1) for k, v in per_scorer.items()},
            }
        )
    )
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
