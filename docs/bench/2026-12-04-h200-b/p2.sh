#!/usr/bin/env bash
# Device call P2 (2026-12-04): the production set through snakemake, 12 groups x 64 takes x
# 188 frames on one H200: O, the tree before (559ee40, its own Snakefile and rules, from
# .whl/old), on an empty cache, then N, this tree (restore and score phases of their own under
# overlap: full), on O's weights and cache. Run from the repository root, .whl carried.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
el install
W=/tmp/bestofn-gpu
wf() {  # tag tree-root
  ( cd "$2" && PYTHONPATH=/tmp/site:$PWD/src BENCH=0 WORK=$W CACHE_DIR=$W/cache \
      timeout 420 bash docs/bench/gpu_workflow.sh /tmp/wf-$1 1 12 > /tmp/wf-$1.log 2>&1 )
  el "workflow $1 rc $?"
  grep -E "snakemake:|verify:|steady|s_per_clip" /tmp/wf-$1.log | tail -8
  cp /tmp/wf-$1/summary.json "$OUT/wf-$1.json"; cp /tmp/wf-$1/throughput.csv "$OUT/wf-$1-throughput.csv"
}
wf O "$PWD/.whl/old"
wf N "$PWD"
grep -h "worker ready\|ready in\|load_s" /tmp/wf-*/logs/*worker* 2>/dev/null | tail -4
tail -c 3000 /tmp/wf-N.log > "$OUT/wf-N-tail.log"
el done
