#!/bin/bash
# 2026-12-03 night, call D1: paired generation on a quiet machine (this tree); the worker start
# on this tree (cold, then warm) side by side with the tree before the vocabulary-list change
# (ef6d2ff, warm, same cache), the production set with the calibrated Parakeet.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONUNBUFFERED=1
NEW=/tmp/site:$PWD/src; OLD=/tmp/site:$PWD/.whl/old/src
export PYTHONPATH=$NEW
W=/tmp/bestofn-gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
el install
timeout 130 python3 -m bestofn.lab.probes.pairing $OUT/pairing --repeats 1 > $OUT/pairing.txt 2>&1
el "pairing rc $?"; tr -d '\000' < $OUT/pairing.txt | grep -av "^\[W" | tail -12
python3 -m bestofn.cli fake-weights $W/weights --size real --p-stop 1e-9 --no-delay --parakeet calibrated > $OUT/fw.log 2>&1 || { tail -20 $OUT/fw.log; exit 1; }
el fake-weights
run() { # tag pythonpath runs timeout
  PYTHONPATH=$2 timeout $4 python3 -m bestofn.lab.probes.worker_start --weights $W/weights --out $OUT/ws-$1 \
    --work $W/worker-start --runs $3 --takes 64 --frames 188 > $OUT/ws-$1.txt 2>&1
  el "worker start $1 ($3) rc $?"; tr -d '\000' < $OUT/ws-$1.txt | grep -av "^\[W" | tail -22
  cp $OUT/ws-$1/worker_start.json $OUT/ws-$1.json 2>/dev/null; rm -rf $OUT/ws-$1
}
run new-cold $NEW cold 160
run old-warm $OLD warm 100
run new-warm $NEW warm 100
