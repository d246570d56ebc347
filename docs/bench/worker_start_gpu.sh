#!/usr/bin/env bash
# Where a worker's start goes (the goal: a worker ready in 30 s): the production worker is
# started as a group job starts it (bestofn.worker.client.group_job), then two groups go through it;
# printed per run: process start -> imports -> each backend's load -> warm-up -> ready -> the
# first group's takes, and the first group's extra over the second. Runs, each a fresh worker:
#   serial  runtime.parallel_load false, warm_up false, cache_dir null (the tree before, as far
#           as switches go)
#   cold    the defaults, empty compile cache and hash memo
#   warm    the defaults on the cache the cold run left
#
#   CUDA_VISIBLE_DEVICES=0 bash docs/bench/worker_start_gpu.sh OUT [CONFIG]
#
# CONFIG: the recipe (default config/recipes/emotions.yaml) on the fake weights (lab/project.py).
# Run from the repository root with PYTHONPATH=src. Weights: WORK/weights (WORK=/tmp/bestofn-gpu,
# gpu_workflow.sh's), written by `bestofn fake-weights` only when absent (~80 s at real size on
# 16 cores).
# Knobs: RUNS (serial,cold,warm), TAKES (64), FRAMES (188: 15-s takes), SIZE (real), WARM_UP
# (auto). Writes OUT/worker_start.json and OUT/worker_start.log.
# Its CPU smoke test (tests/lab/test_gpu_scripts.py): SIZE=tiny WORK=/tmp/bestofn-tiny TAKES=2
# FRAMES=8 RUNS=cold.
set -euo pipefail
out=$(realpath -m "${1:?usage: worker_start_gpu.sh OUT [CONFIG]}")
recipe=$(realpath "${2:-config/recipes/emotions.yaml}")
work=${WORK:-/tmp/bestofn-gpu}
size=${SIZE:-real}
py=${PYTHON:-python3}
mkdir -p "$out"
t0=$(date +%s)
if [ ! -f "$work/weights/config.yaml" ]; then
    $py -m bestofn.cli fake-weights "$work/weights" --size "$size" --p-stop 1e-9 --no-delay \
        >"$out/fake_weights.log" 2>&1 || { tail -n 20 "$out/fake_weights.log"; exit 1; }
    echo "fake-weights: $(($(date +%s) - t0)) s"
fi
$py -m lab.probes.worker_start --weights "$work/weights" --config "$recipe" --out "$out" \
    --work "$work/worker-start" --runs "${RUNS:-serial,cold,warm}" --takes "${TAKES:-64}" \
    --frames "${FRAMES:-188}" --warm-up "${WARM_UP:-auto}" 2>&1 | tee "$out/worker_start.log"
echo "worker_start_gpu.sh: $(($(date +%s) - t0)) s"
