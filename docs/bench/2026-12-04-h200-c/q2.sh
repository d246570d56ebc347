#!/usr/bin/env bash
# Device calls Q2, Q3 and Q4 (2026-12-04, evening; Q5 is q5.sh): the production set through
# snakemake, 16 groups x 64 takes x 188 frames on one H200, runs in turn, each on a worker of
# its own (the one before is stopped): O, the tree before this session (391a20f, its own
# Snakefile and rules, from .whl/old), and N, tree 62c1c73 (the stop check read 4 steps late;
# taken out again after these runs). The weights are Q1's (/tmp/bestofn-gpu/weights; written
# here if absent), one cache for all runs.
#   bash q2.sh TAG:TREE:LIMIT ...   e.g. O:old:330 N:new:160
# Run from the repository root, .whl carried. Everything comes back in one tarball.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
[ -d /tmp/site/snakemake ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONUNBUFFERED=1
el install
W=/tmp/bestofn-gpu
R=/tmp/q2; mkdir -p $R
wf() {  # tag tree-root limit
  local tag=$1 root=$2 limit=$3
  ( cd "$root" && env PYTHONPATH=/tmp/site:$PWD/src BENCH=0 WORK=$W CACHE_DIR=$W/cache \
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
  tar -C $R -czf $OUT/q2.tgz .
}
for run in "$@"; do
  IFS=: read -r tag tree limit <<< "$run"
  if [ "$tree" = old ]; then root="$PWD/.whl/old"; else root="$PWD"; fi
  wf "$tag" "$root" "$limit"
done
el done
