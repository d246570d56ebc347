#!/usr/bin/env bash
# Issue 15: the split-K decode attention (bestofn.moss.decode_kernel, BESTOFN_MOSS_DECODE_ATTN=
# triton) on a machine with two GPUs, in one call:
#   GPU 0: kernel vs SDPA at the real decode shape (decode_kernel_check.py); `bench generate`
#          with SDPA, the kernel and SDPA again in one run; then, once the fake weights are
#          written, `bestofn parity` on the real-size random checkpoint (fp32) through the
#          kernel, then the workflow with SDPA (the default) on 8 groups;
#   GPU 1: fake weights at the real size, then the workflow with the kernel on 8 groups,
#          at the same time as GPU 0's.
#
#   bash docs/bench/decode_attention_gpu.sh OUT      (repository root, bestofn importable)
set -uo pipefail
out=$(realpath -m "${1:?usage: decode_attention_gpu.sh OUT}")
mkdir -p "$out"
py=${PYTHON:-python3}
weights=/tmp/decode-attn/weights
(
    export CUDA_VISIBLE_DEVICES=0
    $py -m bestofn.lab.probes.decode_kernel_check >"$out/check.log" 2>&1
    echo "check rc $?" >>"$out/check.log"
    $py -m bestofn.bench generate --batches 64 --reference-batches "" \
        --variants compiled,compiled-triton,compiled-again --json "$out/gen.json" \
        >"$out/gen.log" 2>&1
    echo "gen rc $?" >>"$out/gen.log"
    while [ ! -f "$weights/FAKE_WEIGHTS.md" ]; do sleep 5; done
    BESTOFN_MOSS_DECODE_ATTN=triton $py -m bestofn.cli parity \
        --reference-code .ref/moss_tts_local_v1.5 --device cuda --frames 24 \
        --checkpoint "$weights/MOSS-TTS-Local-Transformer-v1.5" >"$out/parity_triton.log" 2>&1
    echo "parity rc $?" >>"$out/parity_triton.log"
    mkdir -p /tmp/decode-attn/sdpa && ln -sfn "$weights" /tmp/decode-attn/sdpa/weights
    BENCH=0 WORK=/tmp/decode-attn/sdpa bash docs/bench/gpu_workflow.sh "$out/wf-sdpa" 1 8 \
        >"$out/wf-sdpa.log" 2>&1
    echo "workflow rc $?" >>"$out/wf-sdpa.log"
) &
(
    export CUDA_VISIBLE_DEVICES=1
    $py -m bestofn.cli fake-weights "$weights" --size real --p-stop 1e-9 --no-delay \
        >"$out/fake_weights.log" 2>&1
    mkdir -p /tmp/decode-attn/triton && ln -sfn "$weights" /tmp/decode-attn/triton/weights
    BESTOFN_MOSS_DECODE_ATTN=triton BENCH=0 WORK=/tmp/decode-attn/triton \
        bash docs/bench/gpu_workflow.sh "$out/wf-triton" 1 8 >"$out/wf-triton.log" 2>&1
    echo "workflow rc $?" >>"$out/wf-triton.log"
) &
wait
