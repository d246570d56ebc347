"""Where a worker's start goes (the goal: a worker ready in 30 s), measured on the product.

A worker is started the way a group job starts one (``bestofn.worker.client.group_job``: the same
command line, the same ready check over its socket), on a recipe (``--config``, default
config/recipes/emotions.yaml) run on a ``bestofn fake-weights`` tree (``lab.project``), with the
plan's models (weights paths resolved) as the workflow hands them; then two groups are sent
through it as group jobs send them. Per run:

  client     spawn -> ready (the client's wait), group 1, group 2 (seconds, the client's clock)
  worker     process start -> main -> imports -> models loaded -> warm-up done -> ready
             (the worker's /health ``start``), each backend's import / build / provenance and
             its own parts (moss-fast: checkpoint read, placing, codec, compile setup)
  groups     each group's wall and stage seconds from its parquet; group 1 minus group 2 is
             what the first group still pays

Runs (``--runs``, in order, each a fresh worker):
  serial  the tree before, as far as switches go: runtime.parallel_load false, warm_up false,
          cache_dir null (torch's own /tmp cache, no hash memo)
  cold    the defaults with an empty cache directory (compiles and hashes from scratch)
  warm    the defaults again on the cache the cold run left

The weights come from the OS page cache in every run (fake-weights or an earlier run read
them): no run measures a disk.

PYTHONPATH=src python3 -m lab.probes.worker_start --weights DIR --out DIR
    [--config config/recipes/emotions.yaml] [--runs serial,cold,warm] [--takes 64] [--frames 188]
    [--warm-up auto]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq
import yaml

STAGES = ("generate_s", "restore_s", "score_s", "write_s", "wall_s")
RUNS = {
    "serial": {"parallel_load": False, "warm_up": False, "cache_dir": None},
    "cold": {},
    "warm": {},
}


def project_config(
    recipe: Path, weights: Path, work: Path, takes: int, frames: int, runtime: dict
) -> Path:
    """The recipe on the fake weights (lab.project), one emotion x two prompts, with this
    run's runtime switches; returns its config.yaml (under ``work``)."""
    from lab.project import write_project

    path = write_project(recipe, weights, work / "project", 1, 2, takes, frames, env={})
    config = yaml.safe_load(path.read_text())
    config["results"] = str(work / "results")
    config["runtime"] = {**(config.get("runtime") or {}), **runtime}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def group_row(out: Path) -> dict:
    cols = [f"group_{s}" for s in STAGES] + ["group_load_s", "worker_pid", "n_frames"]
    t = pq.read_table(out / "scores.parquet", columns=cols)
    row = {c: t.column(c)[0].as_py() for c in cols if c != "n_frames"}
    row["clips"] = t.num_rows
    row["frames"] = int(sum(v or 0 for v in t.column("n_frames").to_pylist()))
    return row


def one_run(name: str, weights: Path, work: Path, args) -> dict:
    from bestofn.core.plan import build_plan
    from bestofn.worker.client.group_job import (
        Runtime,
        SlotPool,
        ensure_worker,
        health,
        run_group_via_worker,
        stop_all,
    )

    run_dir = work / name
    shutil.rmtree(run_dir / "results", ignore_errors=True)
    runtime = {
        "state_dir": str(Path(f"/tmp/bestofn-start-{os.getuid()}") / name),
        "idle_timeout_s": 120,
        "warm_up": {"true": True, "false": False}.get(str(args.warm_up).lower(), args.warm_up),
        "cache_dir": str(work / "cache"),
        **RUNS[name],
    }
    if name == "cold":
        shutil.rmtree(work / "cache", ignore_errors=True)
    path = project_config(args.config, weights, run_dir, args.takes, args.frames, runtime)
    # the plan's config: every default applied, every weights path resolved (absolute), as
    # the workflow hands it to a worker
    plan = build_plan(yaml.safe_load(path.read_text()), base=path.parent)
    config = plan.config
    groups = sorted(plan.groups)[:2]
    device = config.get("device", "cpu")
    models = plan.config["models"]
    results = Path(config["results"])
    rt = Runtime.from_config(config["runtime"])
    state = Path(rt.state_dir)
    stop_all(state)
    pool = SlotPool(state, 1, rt.queue_depth, device)
    log_dir = results / "logs" / "workers"
    results.mkdir(parents=True, exist_ok=True)
    out: dict = {"run": name, "runtime": config["runtime"], "device": device}
    try:
        t0 = time.time()
        first = json.loads(plan.group_params(*groups[0]))
        ensure_worker(pool, 0, models, results.resolve(), rt, log_dir,
                      config.get("flac_subtype", "PCM_16"), warm_up_spec=first)  # fmt: skip
        t_ready = time.time()
        h = health(pool.socket(0), timeout=30) or {}
        walls = []
        rows = []
        for emotion, prompt_id in groups:
            g0 = time.time()
            dest = results / "groups" / emotion / prompt_id
            run_group_via_worker(
                plan.group_params(emotion, prompt_id), json.dumps(models), str(dest), device,
                config["runtime"], str(results), config.get("flac_subtype", "PCM_16"),
            )  # fmt: skip
            walls.append(time.time() - g0)
            rows.append(group_row(dest))
        h_after = health(pool.socket(0), timeout=30) or {}
    finally:
        stop_all(state)
    start = h.get("start") or {}
    spawn = None
    if start.get("process_start_unix"):
        spawn = start["process_start_unix"] - t0
    out.update(
        client={
            "spawn_to_process_s": spawn,
            "to_ready_s": t_ready - t0,
            "group_s": walls,
            "to_first_takes_s": t_ready - t0 + walls[0],
        },
        worker_start=start,
        load_report=h.get("load_report"),
        groups=rows,
        first_group_extra_s=rows[0]["group_wall_s"] - rows[1]["group_wall_s"],
        last_group=h_after.get("last_group"),
    )
    return out


def summary_lines(run: dict) -> list[str]:
    c, s = run["client"], run["worker_start"]
    lines = [
        f"== {run['run']}  ({', '.join(f'{k}={v}' for k, v in sorted(run['runtime'].items()) if k in ('parallel_load', 'warm_up', 'cache_dir'))})",  # noqa: E501
        f"  client: ready {c['to_ready_s']:.1f} s, first group {c['group_s'][0]:.1f} s, "
        f"second {c['group_s'][1]:.1f} s -> first takes at {c['to_first_takes_s']:.1f} s",
    ]
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    lines.append(
        f"  worker ({s.get('origin')} = 0): main {fmt(s.get('main_s'))}, imports "
        f"{fmt(s.get('imports_done_s'))}, loaded {fmt(s.get('load_done_s'))}, warmed "
        f"{fmt(s.get('warm_up_done_s'))}, ready {fmt(s.get('ready_s'))}"
    )
    report = run.get("load_report") or {}
    for label, b in (report.get("backends") or {}).items():
        parts = b.get("parts") or {}
        extra = ", ".join(f"{k} {v:.1f}" for k, v in parts.items()) if parts else ""
        lines.append(
            f"    {label:28s} import {b.get('import_s', 0):5.1f}  build {b.get('build_s', 0):5.1f}"
            f"  provenance {b.get('provenance_s', 0):5.1f}  [{b.get('start_s', 0):5.1f} -> "
            f"{b.get('end_s', 0):5.1f}]" + (f"  ({extra})" if extra else "")
        )
    if report:
        lines.append(
            f"    check_files {report.get('check_files_s', 0):.1f}, builds wall "
            f"{report.get('build_wall_s', 0):.1f} (serial sum {report.get('build_sum_s', 0):.1f})"
            f", check_loaded {report.get('check_loaded_s', 0):.1f}, load_s "
            f"{report.get('load_s', 0):.1f}"
        )
    if s.get("warm_up_s"):
        lines.append("    warm-up: " + ", ".join(f"{k} {v:.1f}" for k, v in s["warm_up_s"].items()))
    for k, g in enumerate(run["groups"], 1):
        lines.append(
            f"  group {k}: "
            + ", ".join(f"{st} {g['group_' + st]:.2f}" for st in STAGES)
            + f" ({g['clips']} clips)"
        )
    lines.append(f"  first group's extra: {run['first_group_extra_s']:.2f} s")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", required=True, type=Path, help="a fake-weights directory")
    p.add_argument(
        "--config",
        type=Path,
        default=Path("config/recipes/emotions.yaml"),
        help="the recipe (lab.project: its backends on the fake weights)",
    )
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--work", type=Path, help="projects and the compile cache (default OUT/work)")
    p.add_argument("--runs", default="serial,cold,warm")
    p.add_argument("--takes", type=int, default=64)
    p.add_argument("--frames", type=int, default=188)
    p.add_argument("--warm-up", default="auto", help="runtime.warm_up of the cold/warm runs")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = (args.work or args.out / "work").resolve()
    weights = args.weights.resolve()
    args.config = args.config.resolve()
    runs = []
    for name in [r.strip() for r in args.runs.split(",") if r.strip()]:
        if name not in RUNS:
            raise SystemExit(f"--runs: unknown run {name!r}; known: {', '.join(RUNS)}")
        t0 = time.time()
        run = one_run(name, weights, work, args)
        run["probe_wall_s"] = time.time() - t0
        runs.append(run)
        print("\n".join(summary_lines(run)), flush=True)
    result = {"command": "python -m lab.probes.worker_start", "takes": args.takes,
              "frames": args.frames, "runs": runs}  # fmt: skip
    (args.out / "worker_start.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {args.out / 'worker_start.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
