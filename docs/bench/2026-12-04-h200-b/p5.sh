#!/usr/bin/env bash
# Device call P5 (2026-12-04): P1 again, on this tree (restore and score phases of their own
# under overlap: full): where the GPU's time goes in the production set's steady state,
# kernel time per stage and scorer (bench pipeline --profile), then the scorers' resampler,
# soxr against torch. Run from the repository root with .whl/sel carried; OUT is the device's.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/sel/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date -u
python3 -m bestofn.bench pipeline --size real --device cuda --takes 64 --frames 188 \
  --warmup 1 --stream-groups 6 --depth 4 --parakeet-calibrated \
  --gen-option batch_size=64 --gen-option decode_batch_size=64 --gen-option pair_groups=true \
  --variant prod:overlap=full,parakeet_batch=128,sidon_batch=32 \
  --profile /tmp/prof --workdir /tmp/bp --out "$OUT/pipeline.json" > "$OUT/pipeline.log" 2>&1
echo "pipeline rc=$?"; tail -n 60 "$OUT/pipeline.log"
date -u
python3 -m bestofn.lab.probes.parakeet_calibrated --out "$OUT" --rows resample --repeats 5 \
  > "$OUT/resample.log" 2>&1
echo "resample rc=$?"
ls -la /tmp/prof
date -u
