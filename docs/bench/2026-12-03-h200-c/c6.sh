#!/bin/bash
# 2026-12-03 evening, call A: the worker with overlap off on CUDA through the workflow; side A in
# a main program with stdin from /dev/null; and with NeMo's graphs mode forced to no_while_loops.
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
BENCH=0 OVERLAP=off timeout 190 bash docs/bench/gpu_workflow.sh $OUT/wf-off 1 6 > $OUT/wf-off.txt 2>&1
el "workflow overlap off rc $?"; tr -d '\000' < $OUT/wf-off.txt | grep -aE "snakemake:|verify:|s_per_clip|illegal|Error" | head -12
grep -ahE "illegal|exit 70|GroupStageError" $OUT/wf-off/logs -r 2>/dev/null | tr -d '\000' | head -5
timeout 120 python3 .whl/probe/p_inproc.py plain $W/p_a.yaml /tmp/p_devnull < /dev/null > $OUT/devnull.txt 2>&1
el "devnull rc $?"; tr -d '\000' < $OUT/devnull.txt | grep -aE "^ab |passed|illegal|Error" | grep -v "^\[W" | head -8
timeout 120 python3 .whl/probe/p_mode.py no_while_loops $W/p_a.yaml /tmp/p_nwl < /dev/null > $OUT/nwl.txt 2>&1
el "no_while_loops rc $?"; tr -d '\000' < $OUT/nwl.txt | grep -aE "^ab |probe:|passed|illegal|Error" | grep -v "^\[W" | head -8
