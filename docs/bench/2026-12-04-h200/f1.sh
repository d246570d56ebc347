#!/bin/bash
# 2026-12-04, call F1: the worker start of this tree (Sidon's and VoiceCLAP's imports before
# NeMo's; Parakeet's cached config parsed by libyaml) against b478b7d, warm, alternately on one
# cache, after one cold start of this tree.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONUNBUFFERED=1
NEW=/tmp/site:$PWD/src; OLD=/tmp/site:$PWD/.whl/old/src
export PYTHONPATH=$NEW
W=/tmp/bestofn-gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; git log --oneline -1 2>/dev/null
el install
python3 -m bestofn.cli fake-weights $W/weights --size real --p-stop 1e-9 --no-delay --parakeet calibrated > /tmp/fw.log 2>&1 || { tail -20 /tmp/fw.log; exit 1; }
el fake-weights
run() { # tag pythonpath runs timeout
  PYTHONPATH=$2 timeout $4 python3 -m bestofn.lab.probes.worker_start --weights $W/weights --out /tmp/ws-$1 \
    --work $W/worker-start --runs $3 --takes 64 --frames 188 > $OUT/ws-$1.txt 2>&1
  el "worker start $1 ($3) rc $?"; tr -d '\000' < $OUT/ws-$1.txt | grep -av "^\[W" | grep -aE "client:|worker \(|generator:|scorer|restorer|check_files|warm-up:"
  rm -rf /tmp/ws-$1
}
run new-cold $NEW cold 170
run old-warm1 $OLD warm 95
run new-warm1 $NEW warm 95
run old-warm2 $OLD warm 95
run new-warm2 $NEW warm 95
