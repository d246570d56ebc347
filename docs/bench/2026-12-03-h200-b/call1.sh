#!/bin/bash
# 2026-12-03 call 1: bisect the ab side-A fault. V2 Parakeet decoding label_looping (no CUDA graphs);
# V3 Parakeet compile false (graphs on); V0 the production ab unchanged (control). Sides now in own processes.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
W=/tmp/bestofn-gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m bestofn.cli fake-weights $W/weights --size real --p-stop 1e-9 --no-delay --parakeet calibrated > $OUT/fw.log 2>&1 || { tail -20 $OUT/fw.log; exit 1; }
el fake-weights
python3 - $W $PWD <<'PY'
import copy, sys, yaml
from pathlib import Path
work, repo = Path(sys.argv[1]), Path(sys.argv[2])
base = yaml.safe_load((work / "weights/config.yaml").read_text())
base.update(emotions=str(repo / "config/emotions.tsv"), prompts=str(repo / "config/prompts.tsv"))
for v in ("v0", "v2", "v3"):
    for side, pair, decode in (("a", False, 16), ("b", True, 64)):
        c = copy.deepcopy(base); c["results"] = str(work / f"{v}_{side}")
        rt = c["models"]["generator"].setdefault("runtime", {}); rt.update(pair_groups=pair, decode_batch_size=decode)
        for s in c["models"]["scorers"]:
            if s["backend"] == "parakeet":
                if v == "v2": s.setdefault("runtime", {})["decoding"] = "label_looping"
                if v == "v3": s.setdefault("runtime", {})["compile"] = False
        (work / f"{v}_{side}.yaml").write_text(yaml.safe_dump(c, sort_keys=False))
PY
for v in v2 v3 v0; do
  timeout 165 python3 -m bestofn.cli ab --a $W/${v}_a.yaml --b $W/${v}_b.yaml --thresholds config/ab_thresholds_pairing.yaml --groups 4 --out $OUT/$v.parquet > $OUT/$v.txt 2>&1
  el "$v rc $?"; tr -d '\000' < $OUT/$v.txt | grep -aE "^ab |^ab:|illegal|Unpickling|error:|_per_clip|load_s|peak" | grep -v "^\[W" | head -24
done
