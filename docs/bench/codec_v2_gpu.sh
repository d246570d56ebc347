#!/usr/bin/env bash
# MOSS-Audio-Tokenizer-v2 (the 48 kHz stereo codec of MOSS-TTS-Local) decode on one GPU, in one
# run, through `python -m lab.bench codec --version v2`: batch 64 of 15-s clips (188 frames,
# 12 codebooks) through our code in fp32 and bf16 (DTYPES), our fp32 one clip at a time, the
# chunks `bestofn serve` decodes (SNR / max |diff| against one-shot), and, when the vendored
# published code is in REF, its one-shot batched decode and the processor's one-clip path
# (chunk_duration=8). Per row: s/clip, peak VRAM (weights included), SNR against our fp32.
# Random weights at the published size (about 8.5 GB written to WORK once).
#
#   bash docs/bench/codec_v2_gpu.sh OUT                      # on the H200, from the repo root
#   SIZE=tiny DEVICE=cpu bash docs/bench/codec_v2_gpu.sh OUT # CPU smoke test (tiny checkpoint)
#
# REF (default .ref/moss_audio_tokenizer_v2: audio_tokenizer_v2.py and
# configuration_moss_audio_tokenizer_v2.py of zzehli/vllm-omni@10906e3
# vllm_omni/model_executor/models/moss_tts/) is git-ignored: carry it to the device with the
# working tree, or the reference rows say "not run". Writes OUT/codec_v2.json, OUT/codec_v2.log,
# OUT/env.txt. Expected wall on an H200: about 5 min (most of it writing and loading weights).
set -euo pipefail
out=$(realpath -m "${1:?usage: codec_v2_gpu.sh OUT}")
py=${PYTHON:-python3}
size=${SIZE:-real}
device=${DEVICE:-cuda}
batch=${BATCH:-64}
dtypes=${DTYPES:-fp32,bf16}
ref=${REF:-.ref/moss_audio_tokenizer_v2}
work=${WORK:-/tmp/bestofn-codec-v2-$size}
if [ "$size" = tiny ]; then seconds=${SECONDS_PER_CLIP:-2}; else seconds=${SECONDS_PER_CLIP:-15}; fi
if [ "$size" = tiny ]; then batch=${BATCH:-4}; fi
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
if [ -d "$ref" ]; then refarg=(--reference-code "$ref"); else echo "no $ref: no reference rows"; fi
$py -m lab.bench codec --version v2 --size "$size" --device "$device" --batch "$batch" \
    --seconds "$seconds" --n-vq 12 --dtypes "$dtypes" --work "$work" "${refarg[@]}" \
    --out "$out/codec_v2.json" 2>&1 | tee "$out/codec_v2.log"
exit "${PIPESTATUS[0]}"
