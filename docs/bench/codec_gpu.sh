#!/usr/bin/env bash
# MOSS-Audio-Tokenizer decode on one GPU, in one run: our batched decode (batch 64, 15-s clips)
# in fp32, bf16, fp8 (fp8 matmuls, H100/H200) and fp8w (fp8-stored weights, bf16 compute),
# against one clip at a time: ours (fp32, batch 1) and the published processor's path
# (chunk_duration=8, fp32) when the published code is in REF. Per row: s/clip, peak VRAM,
# SNR against our fp32. Random weights at the published size (about 7 GB written to WORK once).
#
#   bash docs/bench/codec_gpu.sh OUT                      # on the H200, from the repo root
#   SIZE=tiny DEVICE=cpu bash docs/bench/codec_gpu.sh OUT # CPU smoke test (tiny checkpoint)
#
# REF (default .ref/moss_audio_tokenizer) is git-ignored: carry it to the device with the
# working tree, or the reference row says "not run". Writes OUT/codec.json, OUT/codec.log,
# OUT/env.txt.
set -euo pipefail
out=$(realpath -m "${1:?usage: codec_gpu.sh OUT}")
py=${PYTHON:-python3}
size=${SIZE:-real}
device=${DEVICE:-cuda}
batch=${BATCH:-64}
ref=${REF:-.ref/moss_audio_tokenizer}
work=${WORK:-/tmp/bestofn-codec-$size}
if [ "$size" = tiny ]; then seconds=${SECONDS_PER_CLIP:-0.04}; else seconds=${SECONDS_PER_CLIP:-15}; fi
mkdir -p "$out" "$work"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}src
{
    date -u +%FT%TZ
    git rev-parse HEAD 2>/dev/null || true
    $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    $py -c 'import transformers; print("transformers", transformers.__version__)' || true
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
} >"$out/env.txt" 2>&1
refarg=()
if [ -d "$ref" ]; then refarg=(--reference-code "$ref"); else echo "no $ref: no reference row"; fi
$py -m lab.bench codec --size "$size" --device "$device" --batch "$batch" \
    --seconds "$seconds" --work "$work" "${refarg[@]}" --out "$out/codec.json" \
    2>&1 | tee "$out/codec.log"
exit "${PIPESTATUS[0]}"
