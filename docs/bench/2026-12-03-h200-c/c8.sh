#!/bin/bash
# 2026-12-03 evening, call C: side A in a main program on the new default (Parakeet decoding
# auto = cuda_graphs_host_loop on CUDA); then the production workflow, 10 groups x 64 takes, the
# new default (N, empty cache) and decoding cuda_graphs, the default before (F, N's cache).
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
W=/tmp/bestofn-gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
el install
python3 -m bestofn.cli fake-weights $W/weights --size real --p-stop 1e-9 --no-delay --parakeet calibrated > $OUT/fw.log 2>&1 || { tail -20 $OUT/fw.log; exit 1; }
el fake-weights
python3 - $W $PWD <<'PY'
import sys, yaml
from pathlib import Path
work, repo = Path(sys.argv[1]), Path(sys.argv[2])
c = yaml.safe_load((work / "weights/config.yaml").read_text())
c.update(emotions=str(repo / "config/emotions.tsv"), prompts=str(repo / "config/prompts.tsv"))
c["results"] = str(work / "p_a")
c["models"]["generator"].setdefault("runtime", {}).update(pair_groups=False, decode_batch_size=16)
(work / "p_a.yaml").write_text(yaml.safe_dump(c, sort_keys=False))
PY
timeout 110 python3 .whl/probe/p_inproc.py plain $W/p_a.yaml /tmp/p_default < /dev/null > $OUT/default.txt 2>&1
el "side A, default decoding, rc $?"; tr -d '\000' < $OUT/default.txt | grep -aE "^ab |passed|illegal|Error" | grep -v "^\[W" | head -8
for run in N F; do
  d=; [ $run = F ] && d=cuda_graphs
  PARAKEET_DECODING=$d BENCH=0 WORK=$W CACHE_DIR=$W/cache timeout $([ $run = N ] && echo 175 || echo 150) bash docs/bench/gpu_workflow.sh $OUT/wf-$run 1 10 > $OUT/wf-$run.txt 2>&1
  el "workflow $run (decoding ${d:-auto}) rc $?"; tr -d '\000' < $OUT/wf-$run.txt | grep -aE "snakemake:|verify:|\"s_per_clip\"|illegal" | head -8
  python3 .whl/probe/p_dec.py $W/project/results
  cp $OUT/wf-$run/throughput.csv $OUT/wf-$run-throughput.csv 2>/dev/null; cp $OUT/wf-$run/summary.json $OUT/wf-$run-summary.json 2>/dev/null
  grep -ah '"worker-start"\|worker-start' $W/project/results/logs/workers/* 2>/dev/null | tr -d '\000' | tail -1 | cut -c1-600
  rm -rf $OUT/wf-$run/logs
done
