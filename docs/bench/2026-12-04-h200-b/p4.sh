#!/usr/bin/env bash
# Device call P4 (2026-12-04): the production set through snakemake, 16 groups x 64 takes x
# 188 frames on one H200, three runs in turn, each on a worker of its own (the one before is
# stopped): O, the tree before (559ee40, its own Snakefile and rules, from .whl/old), on an
# empty cache; then this tree (restore and score phases of their own under overlap: full) at
# the production queue_depth 4 (N4) and at 6 (N6), on O's weights and cache. Run from the
# repository root, .whl carried. Everything comes back in one tarball.
# (P3, the same without the stops and with too short a limit for O, let O's snakemake run on
# past its limit and N4 reach O's worker: a worker's key named its models, not its code.)
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
el install
W=/tmp/bestofn-gpu
R=/tmp/p4; mkdir -p $R
wf() {  # tag tree-root limit [env...]
  local tag=$1 root=$2 limit=$3; shift 3
  ( cd "$root" && env "$@" PYTHONPATH=/tmp/site:$PWD/src BENCH=0 WORK=$W CACHE_DIR=$W/cache \
      timeout -k 5 "$limit" bash docs/bench/gpu_workflow.sh $R/wf-$tag 2 8 > $R/wf-$tag.log 2>&1 )
  el "workflow $tag rc $?"
  pkill -f snakemake; ( cd $W/project && PYTHONPATH=/tmp/site:$root/src python3 -m bestofn.cli workers stop )
  pkill -f "bestofn.cli worker"; sleep 2
  grep -E "snakemake:|verify:" $R/wf-$tag.log | tail -3
  python3 - $R/wf-$tag <<'P'
import json, sys, csv
d = sys.argv[1]
s = json.load(open(f"{d}/summary.json"))
print("steady", s["steady_state"], "after-two", s["steady_state_after_two"])
print("pids", sorted({g["pid"] for g in s["groups"]}), "load_s", [g["load_s"] for g in s["groups"] if g["load_s"]])
mem = [int(r[3].split()[0]) for r in csv.reader(open(f"{d}/nvidia_smi.csv")) if r and r[3].strip().split()[0].isdigit()]
print("peak memory.used MiB", max(mem) if mem else None)
P
  tar -C $R -czf $OUT/p4.tgz .
}
wf O "$PWD/.whl/old" 330
wf N4 "$PWD" 140
wf N6 "$PWD" 140 QUEUE_DEPTH=6
el done
