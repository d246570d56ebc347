#!/usr/bin/env bash
# Issue 15, call K: this session's three changes (the local attention as float32 reductions,
# the sampler's top-k by a sort, Parakeet's encoder attention through SDPA) against the tree
# before them, on a machine with two GPUs, in one call:
#   GPU 0: `bench generate`: the new default at batch 64 and 128, then at batch 64 the default
#          with torch.topk, the tree before (SDPA local attention + torch.topk), and the default
#          again, with the profile of the default; then the workflow on 8 groups, new defaults.
#   GPU 1: fake weights at the real size, then the workflow on 8 groups as before this session
#          (BESTOFN_MOSS_LOCAL_ATTN=sdpa, BESTOFN_MOSS_TOPK=topk, Parakeet attention manual),
#          started with GPU 0's; then `bestofn parity` (fp32, real-size random
#          checkpoint) through the new defaults.
#
# BESTOFN_MOSS_TOPK and the '-topk' variants: the sampler's sort-based top-k that call K
# compared; it was reverted after call K, so now the variable is ignored and '-topk' is a plain
# name suffix.
# Call M, the repeat: SWAP=1 runs the "before" workflow on GPU 0 and the new one on GPU 1;
# VARIANTS sets the bench's variants, BATCHES its batches; PARITY=0 skips parity.
#
#   bash docs/bench/floor_validate_gpu.sh OUT      (repository root, bestofn importable)
set -uo pipefail
out=$(realpath -m "${1:?usage: floor_validate_gpu.sh OUT}")
mkdir -p "$out" /tmp/floor
rm -f /tmp/floor/gen.done
py=${PYTHON:-python3}
weights=/tmp/floor/weights
run_new() {
    mkdir -p /tmp/floor/new && ln -sfn "$weights" /tmp/floor/new/weights
    BENCH=0 WORK=/tmp/floor/new bash docs/bench/gpu_workflow.sh "$out/wf-new" 1 8 \
        >"$out/wf-new.log" 2>&1
    echo "workflow rc $?" >>"$out/wf-new.log"
}
run_before() {
    mkdir -p /tmp/floor/before && ln -sfn "$weights" /tmp/floor/before/weights
    BESTOFN_MOSS_LOCAL_ATTN=sdpa BESTOFN_MOSS_TOPK=topk PARAKEET_ATTENTION=manual BENCH=0 \
        WORK=/tmp/floor/before bash docs/bench/gpu_workflow.sh "$out/wf-before" 1 8 \
        >"$out/wf-before.log" 2>&1
    echo "workflow rc $?" >>"$out/wf-before.log"
}
first=run_new second=run_before
[ "${SWAP:-0}" = 1 ] && first=run_before second=run_new
(
    export CUDA_VISIBLE_DEVICES=0
    $py -m bestofn.bench generate --batches "${BATCHES:-64,128}" --reference-batches "" \
        --variants "${VARIANTS:-compiled,compiled-topk,compiled-localsdpa-topk,compiled-again}" \
        --profile --json "$out/gen.json" >"$out/gen.log" 2>&1
    echo "gen rc $?" >>"$out/gen.log"
    touch /tmp/floor/gen.done  # both workflows start together, after the bench
    while [ ! -f "$weights/FAKE_WEIGHTS.md" ]; do sleep 5; done
    $first
) &
(
    export CUDA_VISIBLE_DEVICES=1
    $py -m bestofn.cli fake-weights "$weights" --size real --p-stop 1e-9 --no-delay \
        >"$out/fake_weights.log" 2>&1
    while [ ! -f /tmp/floor/gen.done ]; do sleep 2; done
    $second
    [ "${PARITY:-1}" = 1 ] || exit 0
    $py -m bestofn.cli parity --reference-code .ref/moss_tts_local_v1.5 --device cuda \
        --frames 24 --checkpoint "$weights/MOSS-TTS-Local-Transformer-v1.5" \
        >"$out/parity.log" 2>&1
    echo "parity rc $?" >>"$out/parity.log"
) &
wait
