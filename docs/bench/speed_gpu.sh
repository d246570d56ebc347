#!/usr/bin/env bash
# Scorer and pipeline variants side by side in one call (random weights at the real sizes):
#   1. scorers: Parakeet batch 64 vs 128, encoder compiled off/on, score vs deferred text work;
#      Sidon resampling on the host (soxr) vs on the device (torch), compiled off/on, buckets,
#      fp16 vs bf16 autocast;
#   2. the fused pipeline, groups streamed as a warm worker serves them: overlap off (before)
#      vs host and full (after), with every stage's wall and GPU time (CUDA events) per clip
#      and the GPU's busy share; nvidia-smi sampled once a second meanwhile.
#
#   bash docs/bench/speed_gpu.sh OUT
#   PARTS=scorers bash docs/bench/speed_gpu.sh OUT   # then PARTS=pipeline ...: two calls, each
#                                                    # under a 10-minute device limit
#
# Run from the repository root with bestofn importable (PYTHONPATH=src or installed). Writes
# OUT/scorers.jsonl + .log, OUT/pipeline.json + .log, OUT/nvidia_smi.csv, OUT/summary.md.
# A CPU smoke test of this script: SIZE=tiny DEVICE=cpu TAKES=4 FRAMES=16 N_GROUPS=2 CLIP_SECONDS=2
# (not GROUPS / SECONDS: bash sets both)
set -euo pipefail
out=$(realpath -m "${1:?usage: speed_gpu.sh OUT}")
py=${PYTHON:-python3}
size=${SIZE:-real}
device=${DEVICE:-cuda}
takes=${TAKES:-64}
frames=${FRAMES:-188}
groups=${N_GROUPS:-4}
seconds=${CLIP_SECONDS:-15}
work=${WORK:-/tmp/bestofn-speed}
parts=${PARTS:-scorers,pipeline}
repeats=${REPEATS:-2}
mkdir -p "$out" "$work"
{
    echo "# date: $(date -u +%FT%TZ)"
    echo "# commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+dirty')"
    echo "# host: $(hostname), $(nproc) CPUs"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "# no nvidia-smi"
    $py -c "import torch; print('# torch', torch.__version__)"
} | tee -a "$out/env.txt"

smi=
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 1 \
        >"$out/nvidia_smi.csv" 2>/dev/null &
    smi=$!
fi
trap '[ -z "$smi" ] || kill "$smi" 2>/dev/null || true' EXIT

# 1. scorers before/after (Parakeet and Sidon, the two this issue changes)
if [[ ,$parts, == *,scorers,* ]]; then
t0=$(date +%s)
$py -m lab.bench scorers --device "$device" --size "$size" --only parakeet,sidon \
    --batches "$takes" --seconds "$seconds" --no-split --repeats "$repeats" \
    --parakeet-batch-sizes 64,128 --parakeet-compile off,on --parakeet-clips $((2 * takes)) \
    --sidon-resample soxr,torch --sidon-compile off,on --sidon-bucket-s 0,1 --sidon-dtype float16,bfloat16 \
    --out "$out/scorers.jsonl" >"$out/scorers.log" 2>&1 || { tail -n 40 "$out/scorers.log"; exit 1; }
echo "scorers: $(($(date +%s) - t0)) s"
tail -n 30 "$out/scorers.log"
fi

# 2. the pipeline: before (sequential worker, old knobs) vs after (overlap host / full)
if [[ ,$parts, == *,pipeline,* ]]; then
t0=$(date +%s)
echo "pipeline start $(date -u +%T)" >>"$out/env.txt"
$py -m lab.bench pipeline --size "$size" --device "$device" --takes "$takes" \
    --frames "$frames" --stream-groups "$groups" --depth 2 --workdir "$work/pipeline" \
    --variant before --variant after \
    --variant "after-full:overlap=full,parakeet_batch=128,parakeet_compile=0,sidon_resample=torch,sidon_compile=0,sidon_bucket_s=0" \
    --variant "after-compiled:overlap=host,parakeet_batch=128,parakeet_compile=on,sidon_resample=torch,sidon_compile=on,sidon_bucket_s=1" \
    --variant before-again:overlap=off,parakeet_batch=64,parakeet_compile=0,sidon_resample=soxr,sidon_compile=0,sidon_bucket_s=0 \
    --out "$out/pipeline.json" >"$out/pipeline.log" 2>&1 || { tail -n 40 "$out/pipeline.log"; exit 1; }
echo "pipeline end $(date -u +%T)" >>"$out/env.txt"
echo "pipeline: $(($(date +%s) - t0)) s"
fi

$py - "$out" <<'EOF'
import json
import os
import sys

out = sys.argv[1]
lines = ["# scorer and pipeline variants in one call", ""]
lines += [l.rstrip() for l in open(f"{out}/env.txt")] + [""]
lines += ["## scorers (s/clip)", "", "| backend | clips | s/clip | peak GiB |", "|---|---:|---:|---:|"]
for line in open(f"{out}/scorers.jsonl") if os.path.exists(f"{out}/scorers.jsonl") else []:
    r = json.loads(line)
    if "error" in r:
        lines.append(f"| {r['backend']} | – | failed: {r['error'][:80]} | – |")
        continue
    peak = "–" if r.get("peak_gib") is None else f"{r['peak_gib']:.1f}"
    lines.append(f"| {r['backend']} | {r['batch']} | {r['s_per_clip']:.4f} | {peak} |")
if not os.path.exists(f"{out}/pipeline.json"):
    open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(0)
res = json.load(open(f"{out}/pipeline.json"))


def f(v):
    return "–" if v is None else f"{v:.4f}"


lines += ["", f"## pipeline, {res['variants'][0]['takes']} takes/group, "
          f"{res['variants'][0]['groups']} groups streamed per variant (s/clip)", "",
          "| variant | throughput | generate wall / GPU | restore wall / GPU | score wall / GPU "
          "| write | GPU busy | GPU busy % | peak GiB |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
for r in res["variants"]:
    w, g = r["wall_s_per_clip"], r["gpu_s_per_clip"]
    frac = r["gpu_busy_fraction"]
    lines.append(
        f"| {r['variant']} | **{r['s_per_clip']:.4f}** | "
        + " | ".join(f"{f(w[s])} / {f(g[s])}" for s in ("generate", "restore", "score"))
        + f" | {f(w['write'])} | {f(r['gpu_busy_s_per_clip'])} | "
        + ("–" if frac is None else f"{100 * frac:.1f}")
        + f" | {'–' if r.get('peak_gib') is None else format(r['peak_gib'], '.1f')} |"
    )
lines += ["", "knobs:"] + [f"- {r['variant']}: `{json.dumps(r['knobs'])}`" for r in res["variants"]]
lines += ["", "per scorer (s/clip):"] + [
    f"- {r['variant']}: " + ", ".join(f"{k} {v:.4f}" for k, v in r["score_s_per_clip"].items())
    for r in res["variants"]
]
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
