#!/usr/bin/env bash
# Issue 15, call J: probes for the two goals still missed, on a machine with two GPUs.
#   GPU 0: `bench generate` at batch 64 with the local attention as float32 reductions (the
#          new CUDA default) and through SDPA (as before), then the profile of the default;
#          then the same default compiled with Inductor's max-autotune-no-cudagraphs mode
#          (BESTOFN_MOSS_COMPILE_MODE), in its own process.
#   GPU 1: Parakeet's encoder knobs and kernel table (parakeet_encoder_probe.py); the decode
#          GEMMs bf16 vs fp8 (gemm_probe.py); fake weights at the real size and `bestofn
#          parity` (fp32) through the new local attention.
#
#   bash docs/bench/floor_probe_gpu.sh OUT      (repository root, bestofn importable)
set -uo pipefail
out=$(realpath -m "${1:?usage: floor_probe_gpu.sh OUT}")
mkdir -p "$out"
py=${PYTHON:-python3}
weights=/tmp/floor/weights
(
    export CUDA_VISIBLE_DEVICES=0
    $py -m bestofn.bench generate --batches 64 --reference-batches "" \
        --variants compiled,compiled-localsdpa --profile --json "$out/gen.json" \
        >"$out/gen.log" 2>&1
    echo "gen rc $?" >>"$out/gen.log"
    BESTOFN_MOSS_COMPILE_MODE=max-autotune-no-cudagraphs timeout 300 \
        $py -m bestofn.bench generate --batches 64 --reference-batches "" \
        --variants compiled --json "$out/gen_autotune.json" >"$out/gen_autotune.log" 2>&1
    echo "gen autotune rc $?" >>"$out/gen_autotune.log"
) &
(
    export CUDA_VISIBLE_DEVICES=1
    $py -m bestofn.lab.probes.parakeet_encoder_probe --out "$out" >"$out/parakeet_encoder.log" 2>&1
    echo "parakeet rc $?" >>"$out/parakeet_encoder.log"
    $py -m bestofn.lab.probes.gemm_probe --out "$out" >"$out/gemm.log" 2>&1
    echo "gemm rc $?" >>"$out/gemm.log"
    $py -m bestofn.cli fake-weights "$weights" --size real --p-stop 1e-9 --no-delay \
        >"$out/fake_weights.log" 2>&1
    $py -m bestofn.cli parity --reference-code .ref/moss_tts_local_v1.5 --device cuda \
        --frames 24 --checkpoint "$weights/MOSS-TTS-Local-Transformer-v1.5" \
        >"$out/parity.log" 2>&1
    echo "parity rc $?" >>"$out/parity.log"
) &
wait
