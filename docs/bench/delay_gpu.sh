#!/usr/bin/env bash
# MOSS-TTS Delay 8B on one GPU: `bestofn parity` against the published code (tiny random
# checkpoint; eager and CUDA graph), then our engine against the published `generate` on the
# real-size random checkpoint (Qwen3-8B shape, 32 codebooks), batch 64, 15-s clips (188
# frames: min_frames = max_frames), same run, same weights (lab.probes.delay_bench).
# Needs the git-ignored copy .ref/moss_tts_delay (carry it to the device).
#
#   bash docs/bench/delay_gpu.sh OUT                       # H200: real size, cuda
#   SIZE=tiny DEVICE=cpu BATCH=4 SECONDS_PER_CLIP=1 bash docs/bench/delay_gpu.sh OUT   # smoke
#
# Env: SIZE (real|tiny), DEVICE (cuda|cpu), BATCH (64), SECONDS_PER_CLIP (15), REPEATS (2),
# WORK (checkpoint dir, default /tmp/bestofn-delay; reused when present), PYTHON (python3),
# PARITY_FRAMES (24), PARITY_REAL=1 also runs parity on the real-size checkpoint (fp32, ~70 GB),
# PROFILE (1 on cuda, 0 on cpu): lab.probes.delay_profile after the bench (per-step ms of
# the captured step, the backbone, heads+sampling; prefill; top 15 kernels) -> OUT/delay_profile.txt.
set -euo pipefail
out=$(realpath -m "${1:?usage: delay_gpu.sh OUT}")
py=${PYTHON:-python3}
size=${SIZE:-real}
device=${DEVICE:-cuda}
work=${WORK:-/tmp/bestofn-delay}
ref=.ref/moss_tts_delay
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
export TQDM_DISABLE=1
mkdir -p "$out" "$work"
if [ ! -f "$ref/modeling_moss_tts.py" ]; then
    echo "delay_gpu.sh: $ref missing (a copy of OpenMOSS/MOSS-TTS moss_tts_delay/)" >&2
    exit 2
fi
{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(hostname)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
    $py -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
    echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo none)"
} | tee "$out/env.txt"

set +e
$py -m bestofn.cli parity --reference-code "$ref" --device "$device" \
    --frames "${PARITY_FRAMES:-24}" 2>&1 | tee "$out/parity.txt"
parity=${PIPESTATUS[0]}
set -e
echo "parity exit: $parity" | tee -a "$out/parity.txt"

$py -m lab.probes.delay_bench --out "$out" --work "$work" --size "$size" --device "$device" \
    --batch "${BATCH:-64}" --seconds "${SECONDS_PER_CLIP:-15}" --repeats "${REPEATS:-2}" \
    --reference-code "$ref" 2>&1 | tee "$out/bench.log"

default_profile=0
[ "$device" = cpu ] || default_profile=1
if [ "${PROFILE:-$default_profile}" = 1 ]; then
    set +e
    $py -m lab.probes.delay_profile --out "$out" --work "$work" --size "$size" \
        --device "$device" --batch "${BATCH:-64}" --seconds "${SECONDS_PER_CLIP:-15}" \
        --reference-code "$ref" 2>&1 | tee "$out/profile.log"
    echo "profile exit: ${PIPESTATUS[0]}" | tee -a "$out/profile.log"
    set -e
fi

if [ "${PARITY_REAL:-0}" = 1 ]; then
    set +e
    $py -m bestofn.cli parity --reference-code "$ref" --device "$device" \
        --checkpoint "$work/MOSS-TTS-Delay-v1.5-$size-always-continue" --frames 16 2>&1 \
        | tee "$out/parity_real.txt"
    set -e
fi
exit "$parity"
