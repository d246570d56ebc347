#!/usr/bin/env bash
# Device call Q1 (2026-12-04, evening): the decode loop's stop check read 4 steps late
# (EngineShell.stop_lag, the default on CUDA now) against read at once every 8 steps (as
# before), side by side in one process each:
#  1. generation alone, two groups per call (the pairing probe: today's path, the pair shape
#     alone, paired with stop_lag 0, paired as built);
#  2. the production set's steady state through the worker's runner (bench pipeline), four
#     variants alternating stop_lag 0 and 4, the same loaded backends.
# Run from the repository root with .whl carried; OUT is the device's. Ran at tree 62c1c73;
# the stop lag showed no gain (docs/PERFORMANCE.md) and was taken out again, with its knob.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/sel/*.whl 2>&1 | grep -v WARNING | tail -3
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
el install
python3 -m bestofn.lab.probes.pairing "$OUT" --repeats 3 > "$OUT/pairing.log" 2>&1
el "pairing rc=$?"; grep -E "^speed|INVARIANT" "$OUT/pairing.log"
P=overlap=full,parakeet_batch=128,sidon_batch=32
python3 -m bestofn.bench pipeline --size real --device cuda --takes 64 --frames 188 \
  --warmup 1 --stream-groups 8 --depth 4 --parakeet-calibrated \
  --gen-option batch_size=64 --gen-option decode_batch_size=64 --gen-option pair_groups=true \
  --variant "lag0:$P,stop_lag=0" --variant "lag4:$P,stop_lag=4" \
  --variant "lag0b:$P,stop_lag=0" --variant "lag4b:$P,stop_lag=4" \
  --workdir /tmp/bp --out "$OUT/pipeline.json" > "$OUT/pipeline.log" 2>&1
el "pipeline rc=$?"; grep -A12 "^## variants" "$OUT/pipeline.log"
# the weights Q2 runs the workflow on (gpu_workflow.sh's own command), written after the
# measurements so that they run on a quiet machine
python3 -m bestofn.cli fake-weights /tmp/bestofn-gpu/weights --size real --p-stop 1e-9 \
  --no-delay --parakeet calibrated > "$OUT/fake_weights.log" 2>&1
el "fake-weights rc=$?"
