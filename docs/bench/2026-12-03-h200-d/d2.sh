#!/bin/bash
# 2026-12-03 night, call D2: the worker start with the short GIL switch interval during the
# parallel load (this tree) against the tree before (12f5f31), warm, alternately on one cache;
# then Parakeet's build alone under cProfile.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONUNBUFFERED=1
NEW=/tmp/site:$PWD/src; OLD=/tmp/site:$PWD/.whl/old/src
export PYTHONPATH=$NEW
W=/tmp/bestofn-gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
el install
python3 -m bestofn.cli fake-weights $W/weights --size real --p-stop 1e-9 --no-delay --parakeet calibrated > $OUT/fw.log 2>&1 || { tail -20 $OUT/fw.log; exit 1; }
el fake-weights
run() { # tag pythonpath runs timeout
  PYTHONPATH=$2 timeout $4 python3 -m bestofn.lab.probes.worker_start --weights $W/weights --out $OUT/ws-$1 \
    --work $W/worker-start --runs $3 --takes 64 --frames 188 > $OUT/ws-$1.txt 2>&1
  el "worker start $1 ($3) rc $?"; tr -d '\000' < $OUT/ws-$1.txt | grep -av "^\[W" | grep -aE "client:|worker \(|generator:|scorer1:|scorer3:|sidon|check_files|warm-up:" 
  cp $OUT/ws-$1/worker_start.json $OUT/ws-$1.json 2>/dev/null; rm -rf $OUT/ws-$1
}
run new-cold $NEW cold 160
run old-warm1 $OLD warm 90
run new-warm1 $NEW warm 90
run old-warm2 $OLD warm 90
run new-warm2 $NEW warm 90
timeout 60 python3 .whl/probe/p_pk.py $W/weights $W/worker-start/cache > $OUT/pk-profile.txt 2>&1
el "parakeet profile rc $?"; tr -d '\000' < $OUT/pk-profile.txt | grep -av "^\[W" | head -70 | cut -c1-160
