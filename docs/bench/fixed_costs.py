"""A run's fixed costs through snakemake, for several source trees side by side: each run starts
from an empty results/ and .snakemake/ (a cold sha256 memo and compile cache, as a fresh project
has them), on one project (lab/project.py: a recipe on a fake-weights tree). Runs alternate
between the trees (A B, B A, ...) on the same machine. Per run, seconds since `snakemake` was
started, read from its output as it comes:

  submitted       the first group job handed out (the plan, the DAG, the scheduler's start)
  first_group     the first group job finished (the worker's start is in it)
  groups_done     the last group job finished
  all_done        the `all` rule finished (database and report built)
  complete        snakemake's last line (its log written; the workers stopped)
  exit            snakemake exited

plus the worker's own start (its `worker-start` log line: ready_s, load_s). With --dry-run,
`submitted` (the first group job printed) and `exit` (the plan and the DAG of `snakemake -n`);
with --identity only `identity`: the weights' content identity the plan computes
(`models_identity`, no sha256 memo), in a process of its own.

    python docs/bench/fixed_costs.py --weights W --out OUT [--recipe config/recipes/emotions.yaml]
        [--emotions 3] [--prompts 8] [--takes 2] [--frames 8] [--pad-mb 0] [--runs 3]
        [--profile local] [--dry-run | --identity] TAG=ROOT [TAG=ROOT ...]

ROOT is a checkout of a tree (its Snakefile, profiles/ and src/ are used; `git worktree add`
for an older one). --pad-mb N puts one file of N MB of random bytes in every weights folder the
project's config names, in a hard-linked copy of W (OUT/weights): real checkpoints are one large
file per folder, and a cold start hashes each. Writes OUT/fixed_costs.json and prints the
medians.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
FIGURES = ("identity", "submitted", "first_group", "groups_done", "all_done", "complete", "exit")
MARKS = {
    "submitted": re.compile(r"^localrule group:|^rule group:"),
    "group_done": re.compile(r"Finished jobid: \d+ \(Rule: group\)"),
    "all_done": re.compile(r"Finished jobid: \d+ \(Rule: all\)"),
    "complete": re.compile(r"^Complete log"),
}


def pad_folders(config_path: Path, mb: int) -> list[Path]:
    """Add ``mb`` MB of random bytes (one file) to every weights folder the config names."""
    sys.path.insert(0, str(REPO / "src"))
    from bestofn.weights.paths import weight_options

    config = yaml.safe_load(config_path.read_text())
    root = Path(config["weights_root"])
    named = {root / value for *_, value in weight_options(config["models"])}
    folders = sorted(p for p in named if p.is_dir())
    for folder in folders:
        with open(folder / "pad.bin", "wb") as f:
            for _ in range(mb):
                f.write(os.urandom(1 << 20))
    return folders


def project(args) -> Path:
    """The project (OUT/project) on the weights: with --pad-mb, a hard-linked copy of them
    (OUT/weights) whose folders get the padding."""
    sys.path.insert(0, str(REPO))
    from lab.project import write_project

    weights = args.weights.resolve()
    if args.pad_mb:
        copy = args.out / "weights"
        shutil.rmtree(copy, ignore_errors=True)
        subprocess.run(["cp", "-al", str(weights), str(copy)], check=True)
        weights = copy
    config = write_project(args.recipe, weights, args.out / "project", args.emotions,
                           args.prompts, args.takes, args.frames, env={})  # fmt: skip
    if args.pad_mb:
        pad_folders(config, args.pad_mb)
    return config.parent


def worker_start(project_dir: Path) -> dict:
    log = project_dir / "results/logs/workers/slot0.log"
    if not log.is_file():
        return {}
    for line in log.read_text(errors="replace").splitlines():
        if " worker-start " in line:
            report = json.loads(line.split(" worker-start ", 1)[1])
            return {k: report.get(k) for k in ("imports_done_s", "load_s", "ready_s")}
    return {}


IDENTITY = """
import sys, time, yaml
from bestofn.core.pipeline import models_identity
from bestofn.core.plan import build_plan
plan = build_plan(yaml.safe_load(open("config.yaml")), ".")
t0 = time.perf_counter()
models_identity(plan.config["models"], None)
print(round(time.perf_counter() - t0, 3))
"""


def identity_run(root: Path, project_dir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    out = subprocess.run([sys.executable, "-c", IDENTITY], cwd=project_dir, env=env,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return {"identity": float(out.split()[-1]), "worker": {}}


def one_run(root: Path, project_dir: Path, profile: str, dry: bool) -> dict:
    shutil.rmtree(project_dir / "results", ignore_errors=True)
    shutil.rmtree(project_dir / ".snakemake", ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(root / "Snakefile"), "--profile",
           str(root / "profiles" / profile), "--configfile", "config.yaml"]  # fmt: skip
    if dry:
        cmd.append("-n")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=project_dir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    seen: dict[str, float] = {}
    tail = []
    for line in proc.stdout:
        now = round(time.monotonic() - t0, 3)
        tail = (tail + [line])[-40:]
        for name, pattern in MARKS.items():
            if pattern.search(line.strip()):
                if name == "group_done":
                    seen.setdefault("first_group", now)
                    seen["groups_done"] = now
                else:
                    seen.setdefault(name, now)
    rc = proc.wait()
    seen["exit"] = round(time.monotonic() - t0, 3)
    if rc != 0:
        raise SystemExit(f"snakemake ({root}) exited {rc}:\n{''.join(tail)}")
    return {**seen, "worker": {} if dry else worker_start(project_dir)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs="+", metavar="TAG=ROOT")
    p.add_argument("--weights", type=Path, required=True, help="a bestofn fake-weights tree")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--recipe", type=Path, default=REPO / "config/recipes/emotions.yaml")
    p.add_argument("--emotions", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--takes", type=int, default=2)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--pad-mb", type=int, default=0)
    p.add_argument("--runs", type=int, default=3, help="runs per tree")
    p.add_argument("--profile", default="local", help="a profile of each tree's profiles/")
    p.add_argument("--dry-run", action="store_true", help="snakemake -n: the plan and DAG only")
    p.add_argument("--identity", action="store_true", help="the weights' identity alone")
    args = p.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.trees]
    project_dir = project(args)
    runs = []
    for i in range(args.runs):
        for tag, root in trees if i % 2 == 0 else trees[::-1]:
            if args.identity:
                measured = identity_run(root, project_dir)
            else:
                measured = one_run(root, project_dir, args.profile, args.dry_run)
            result = {"tag": tag, "root": str(root), **measured}
            print(json.dumps(result), flush=True)
            runs.append(result)
    medians = {}
    for tag, _ in trees:
        mine = [r for r in runs if r["tag"] == tag]
        keys = [k for k in FIGURES if all(k in r for r in mine)]
        medians[tag] = {k: statistics.median(r[k] for r in mine) for k in keys}
        ready = [r["worker"]["ready_s"] for r in mine if r["worker"].get("ready_s")]
        if ready:
            medians[tag]["worker_ready_s"] = round(statistics.median(ready), 2)
        print(tag, json.dumps(medians[tag]))
    (args.out / "fixed_costs.json").write_text(
        json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "medians": medians},
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
