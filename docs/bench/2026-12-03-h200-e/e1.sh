#!/bin/bash
# 2026-12-03 evening, call E1: where the warm worker start holds the GIL (py-spy --gil over the
# worker process), the imports alone in fresh processes, then (time allowing) call D4's verdict.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/sel/*.whl .whl/pyspy/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
W=/tmp/bestofn-gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
el install
python3 -m bestofn.cli fake-weights $W/weights --size real --p-stop 1e-9 --no-delay --parakeet calibrated > $OUT/fw.log 2>&1 || { tail -20 $OUT/fw.log; exit 1; }
el fake-weights
for mod in "import torch" "from transformers import WhisperFeatureExtractor, WhisperModel" "import nemo.collections.asr.models" "import torch._dynamo, torch._inductor.config"; do
  python3 -c "import time; t=time.perf_counter(); $mod; print(f'{time.perf_counter()-t:5.2f} s  $mod')" 2>/dev/null | tail -1
done
el imports
run() { # tag runs timeout [prefix...]
  local tag=$1 runs=$2 to=$3; shift 3
  timeout $to "$@" python3 -m bestofn.lab.probes.worker_start --weights $W/weights --out $OUT/ws-$tag \
    --work $W/worker-start --runs $runs --takes 64 --frames 188 > $OUT/ws-$tag.txt 2>&1
  el "worker start $tag ($runs) rc $?"; tr -d '\000' < $OUT/ws-$tag.txt | grep -av "^\[W" | grep -aE "client:|worker \(|generator:|scorer|restorer|check_files|warm-up:"
  rm -rf $OUT/ws-$tag
}
run cold cold 170
run warm warm 100
run spy warm 130 /tmp/site/bin/py-spy record --gil --threads --subprocesses -r 100 -f raw -o $OUT/spy.raw --
python3 .whl/probe/gil_table.py $OUT/spy.raw 100 30 > $OUT/spy-table.txt 2>&1; head -120 $OUT/spy-table.txt | cut -c1-170
gzip -f $OUT/spy.raw
el "py-spy table"
if [ $(( $(date +%s) - T0 )) -lt 390 ]; then
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
  timeout $(( 560 - ($(date +%s) - T0) )) python3 .whl/probe/p_inproc.py plain $W/p_a.yaml /tmp/p_default < /dev/null > $OUT/d4-default.txt 2>&1
  el "D4: side A, default decoding, rc $?"; tr -d '\000' < $OUT/d4-default.txt | grep -aE "^ab |passed|illegal|Error|group" | grep -v "^\[W" | head -12
fi
