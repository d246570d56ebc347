#!/bin/bash
# 2026-12-03 evening, call B: side A in a main program with Parakeet decoding
# cuda_graphs_host_loop (the product option); the same with NeMo forced to full_graph through the
# probe's patch (the control); Parakeet's whole ASR in each decoding, one process each.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
W=/tmp/bestofn-gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git log -1 --format=%h 2>/dev/null
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
for s in c["models"]["scorers"]:
    if s["backend"] == "parakeet": s.setdefault("runtime", {})["decoding"] = "cuda_graphs_host_loop"
(work / "p_h.yaml").write_text(yaml.safe_dump(c, sort_keys=False))
PY
timeout 120 python3 .whl/probe/p_inproc.py plain $W/p_h.yaml /tmp/p_h < /dev/null > $OUT/hostloop.txt 2>&1
el "host_loop (config) rc $?"; tr -d '\000' < $OUT/hostloop.txt | grep -aE "^ab |passed|illegal|Error" | grep -v "^\[W" | head -8
timeout 120 python3 .whl/probe/p_mode.py full_graph $W/p_a.yaml /tmp/p_fg < /dev/null > $OUT/fullgraph.txt 2>&1
el "full_graph forced rc $?"; tr -d '\000' < $OUT/fullgraph.txt | grep -aE "^ab |probe:|passed|illegal|Error" | grep -v "^\[W" | head -8
for d in cuda_graphs cuda_graphs_host_loop; do
  timeout 80 python3 .whl/probe/p_asr.py $W/weights/config.yaml $d 7 > $OUT/asr-$d.txt 2>&1
  el "asr $d rc $?"; tr -d '\000' < $OUT/asr-$d.txt | grep -a '^{' ; tr -d '\000' < $OUT/asr-$d.txt | grep -aE "Error" | head -3
done
