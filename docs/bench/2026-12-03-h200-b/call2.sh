#!/bin/bash
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
W=/tmp/bestofn-gpu
if [ ! -f $W/weights/config.yaml ]; then
python3 -m bestofn.cli fake-weights $W/weights --size real --p-stop 1e-9 --no-delay --parakeet calibrated > $OUT/fw.log 2>&1 || { tail -20 $OUT/fw.log; exit 1; }
fi
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
PY
for m in preimport plain; do
  timeout 150 python3 .whl/probe/p_inproc.py $m $W/p_a.yaml /tmp/p_$m > $OUT/$m.txt 2>&1
  el "$m rc $?"; tr -d '\000' < $OUT/$m.txt | grep -aE "^ab |passed|illegal|Unpickling|Error" | grep -v "^\[W" | head -12
done
