#!/bin/bash
# 2026-12-03 night, call D4: side A of the pairing gate as run_side in a main program (the
# configuration that faulted 8 of 8 with Parakeet's full graph) on the new default, Parakeet
# decoding auto = cuda_graphs_host_loop on CUDA; tree of this session.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
W=/tmp/bestofn-gpu
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
timeout 230 python3 .whl/probe/p_inproc.py plain $W/p_a.yaml /tmp/p_default < /dev/null > $OUT/default.txt 2>&1
el "side A, default decoding, rc $?"; tr -d '\000' < $OUT/default.txt | grep -aE "^ab |passed|illegal|Error|group" | grep -v "^\[W" | head -12
