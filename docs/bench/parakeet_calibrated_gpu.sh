#!/usr/bin/env bash
# Issue 24 on one H200: the whole ASR (ParakeetScorer.transcribe) with the calibrated Parakeet
# fake at the real size, batch 64, 15-s clips, NeMo's label loop with and without CUDA graphs
# (and the plain random fake for reference); the scorers' resampler, torch on the GPU against
# soxr, s/clip. Prints JSON rows and writes OUT/parakeet_calibrated.json (+ the log).
#
#   bash docs/bench/parakeet_calibrated_gpu.sh OUT            # H200: about 5-8 min
#   SIZE=tiny DEVICE=cpu CLIPS=4 SECONDS_PER_CLIP=3 bash docs/bench/parakeet_calibrated_gpu.sh OUT
#                                                             # the CPU smoke test
# Run from the repository root (PYTHONPATH=src is set here); no internet needed.
set -euo pipefail
out=${1:?usage: parakeet_calibrated_gpu.sh OUT}
mkdir -p "$out"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
args=(--out "$out" --size "${SIZE:-real}" --clips "${CLIPS:-64}" --batch "${BATCH:-64}"
      --seconds "${SECONDS_PER_CLIP:-15}" --repeats "${REPEATS:-3}")
[[ -n "${DEVICE:-}" ]] && args+=(--device "$DEVICE")
[[ "${DEVICE:-cuda}" == cuda* ]] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -m lab.probes.parakeet_calibrated "${args[@]}" 2>"$out/stderr.log" | tee "$out/rows.jsonl"
