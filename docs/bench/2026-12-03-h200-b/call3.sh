#!/bin/bash
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
W=/tmp/bestofn-gpu
[ -f $W/weights/config.yaml ] || python3 -m bestofn.cli fake-weights $W/weights --size real --p-stop 1e-9 --no-delay --parakeet calibrated > $OUT/fw.log 2>&1 || { tail -20 $OUT/fw.log; exit 1; }
el fake-weights
python3 - $W $PWD <<'PY'
import copy, sys, yaml
from pathlib import Path
work, repo = Path(sys.argv[1]), Path(sys.argv[2])
c = yaml.safe_load((work / "weights/config.yaml").read_text())
c.update(emotions=str(repo / "config/emotions.tsv"), prompts=str(repo / "config/prompts.tsv"))
c["results"] = str(work / "p_a")
c["models"]["generator"].setdefault("runtime", {}).update(pair_groups=False, decode_batch_size=16)
(work / "p_a.yaml").write_text(yaml.safe_dump(c, sort_keys=False))
for s in c["models"]["scorers"]:
    if s["backend"] == "parakeet": s.setdefault("runtime", {})["compile"] = False
(work / "p_c.yaml").write_text(yaml.safe_dump(c, sort_keys=False))
PY
python3 .whl/probe/p_split.py plan $W/p_a.yaml /tmp/plan.pkl && timeout 140 python3 .whl/probe/p_split.py run /tmp/plan.pkl /tmp/p_split > $OUT/split.txt 2>&1
el "split rc $?"; tr -d '\000' < $OUT/split.txt | grep -aE "^ab |passed|illegal|Unpickling|Error" | grep -v "^\[W" | head -8
timeout 140 python3 .whl/probe/p_inproc.py plain $W/p_c.yaml /tmp/p_c > $OUT/nocompile.txt 2>&1
el "nocompile rc $?"; tr -d '\000' < $OUT/nocompile.txt | grep -aE "^ab |passed|illegal|Unpickling|Error" | grep -v "^\[W" | head -8
