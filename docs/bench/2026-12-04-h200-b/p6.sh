#!/usr/bin/env bash
# Device call P6 (2026-12-04): the scorers' resampler inside the production set's steady state,
# not alone: bench pipeline, three variants in turn in one process, the config's resampler
# (auto: torch on CUDA), soxr on the host, then the config's again (the spread of one call).
# Run from the repository root with .whl/sel carried; OUT is the device's.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/sel/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date -u
P=overlap=full,parakeet_batch=128,sidon_batch=32
python3 -m bestofn.bench pipeline --size real --device cuda --takes 64 --frames 188 \
  --warmup 1 --stream-groups 8 --depth 4 --parakeet-calibrated \
  --gen-option batch_size=64 --gen-option decode_batch_size=64 --gen-option pair_groups=true \
  --variant prod:$P --variant soxr:$P,resampler=soxr --variant prod2:$P \
  --workdir /tmp/bp --out "$OUT/pipeline.json" > "$OUT/pipeline.log" 2>&1
echo "pipeline rc=$?"; tail -n 14 "$OUT/pipeline.log"
date -u
