#!/bin/bash
# 2026-12-03 night, call D3: the production workflow (10 groups x 64 takes x 188 frames) on this
# tree, then the same with every Python process's GIL switch interval at 0.5 ms (a
# sitecustomize, lab only), one cache, the first run on an empty one (steady state is after the warm-up, so the cache touches only ready).
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONUNBUFFERED=1
BASE=/tmp/site:$PWD/src; GIL=$PWD/.whl/gil:/tmp/site:$PWD/src
export PYTHONPATH=$BASE
PYTHONPATH=$GIL python3 -c "import sys; print('switch interval with the sitecustomize', sys.getswitchinterval())"
W=/tmp/bestofn-gpu
el install
python3 -m bestofn.cli fake-weights $W/weights --size real --p-stop 1e-9 --no-delay --parakeet calibrated > $OUT/fw.log 2>&1 || { tail -20 $OUT/fw.log; exit 1; }
el fake-weights
wf() { # tag pythonpath timeout
  PYTHONPATH=$2 BENCH=0 WORK=$W CACHE_DIR=$W/cache timeout $3 bash docs/bench/gpu_workflow.sh $OUT/wf-$1 1 10 > $OUT/wf-$1.txt 2>&1
  el "workflow $1 rc $?"; tr -d '\000' < $OUT/wf-$1.txt | grep -aE "snakemake:|verify:|\"s_per_clip\"|illegal" | head -6
  python3 - $OUT/wf-$1/summary.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("steady", json.dumps(s.get("steady_state"))[:300], "after two", json.dumps(s.get("steady_state_after_two"))[:300])
print("groups", [(g["group"][-4:], round(g["wall_s"], 2)) for g in s["groups"]])
PY
  grep -ah "group-timing\|\"stages\"" $W/project/results/logs/workers/* 2>/dev/null | tr -d '\000' | tail -2 | cut -c1-700
  grep -ah 'worker-start' $W/project/results/logs/workers/* 2>/dev/null | tr -d '\000' | tail -1 | cut -c1-400
  cp $OUT/wf-$1/summary.json $OUT/wf-$1-summary.json; rm -rf $OUT/wf-$1
}
wf base1 $BASE 165
wf gil $GIL 130

