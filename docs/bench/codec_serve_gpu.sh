#!/usr/bin/env bash
# The Local figures with the real-shaped v2 codec on one H200, in one call:
#   1. every production checkpoint at the real size (`bestofn fake-weights --size real`, v2
#      codec included) is written on the CPU while `codec_v2_gpu.sh` measures v2 decode on the
#      GPU (ours fp32/bf16 at batch 64, one clip at a time, the stream, and the vendored
#      reference when .ref/moss_audio_tokenizer_v2 travelled);
#   2. then `serve_gpu.sh` at concurrency 1 and 128 on those weights (TTFA, audio-s/s).
# The weights stay in WORK/weights for a following call on the same warm machine
# (gpu_workflow.sh and soak_gpu.sh reuse WORK/weights when it is there).
#
#   bash docs/bench/codec_serve_gpu.sh OUT         (repository root, bestofn importable)
set -uo pipefail
out=$(realpath -m "${1:?usage: codec_serve_gpu.sh OUT}")
work=${WORK:-/tmp/bestofn-gpu}
py=${PYTHON:-python3}
# CPU smoke test of this script: SIZE=tiny DEVICE=cpu LEVELS=1,2
export SIZE=${SIZE:-real} DEVICE=${DEVICE:-cuda}
mkdir -p "$out" "$work"
t0=$(date +%s)
if [ ! -f "$work/weights/config.yaml" ]; then
    ($py -m bestofn.cli fake-weights "$work/weights" --size "$SIZE" --p-stop 1e-9 --no-delay \
        >"$out/fake_weights.log" 2>&1
     echo "fake-weights rc $? at $(($(date +%s) - t0)) s" >>"$out/fake_weights.log") &
    writer=$!
fi
bash docs/bench/codec_v2_gpu.sh "$out/codec" >"$out/codec.log" 2>&1
echo "codec bench rc $? at $(($(date +%s) - t0)) s"
grep -E "s/clip|row|bf16|fp32|ref" "$out/codec.log" | tail -n 20
rm -rf "/tmp/bestofn-codec-v2-$SIZE"  # its own 8.5 GB checkpoint: the disk is 64 GB
[ -z "${writer:-}" ] || wait "$writer"
tail -n 1 "$out/fake_weights.log" 2>/dev/null
# serve_gpu.sh writes its sheets and configs into its WORK: a folder of links to the weights
mkdir -p "$work/serve"
for d in MOSS-TTS-Local-Transformer-v1.5 MOSS-Audio-Tokenizer-v2; do
    ln -sfn "$work/weights/$d" "$work/serve/$d"
done
WORK="$work/serve" PARTS=main bash docs/bench/serve_gpu.sh "$out/serve" "${LEVELS:-1,128}" \
    >"$out/serve.log" 2>&1
echo "serve rc $? at $(($(date +%s) - t0)) s"
tail -n 12 "$out/serve.log"
