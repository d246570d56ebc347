#!/usr/bin/env bash
# `bench pipeline` on the first GPU, then the production workflow through snakemake on every
# visible GPU, with random weights at the real sizes, in one call: the two per-clip figures
# should agree within a few per cent on the same machine, in the same call.
#
#   bash docs/bench/gpu_workflow.sh OUT [EMOTIONS] [PROMPTS_PER_EMOTION] [CONFIG]
#
# CONFIG: the recipe to run (default config/recipes/emotions.yaml; e.g. config/recipes/emotions.yaml):
# its backends, options, runtime and score on the fake tree's weights (lab/project.py says
# which part comes from where).
# Run from the repository root with bestofn importable (PYTHONPATH=src or installed). Writes
# OUT/summary.json, OUT/throughput.csv, OUT/bench_pipeline.json and the logs. Every take is
# pinned to 188 frames (15.04 s) as in `bench pipeline`: fake weights with --p-stop 1e-9 and
# min_frames = max_frames = 188, so both sides make the same audio per clip. P_STOP=P (e.g.
# 0.005) writes fake weights whose takes stop at each frame with probability P instead, so takes
# have many lengths, as real ones do (a batched cost per padded frame shows then); compare such
# runs by summary.json's s_per_audio_s_per_gpu as well as per clip. Only when the weights are
# written. P is the stop chance at text temperature 1: a recipe that samples the stop head
# cooler stops less often (the emotions recipe's 0.7 turns 0.005 into about 0.0005: about 9 %
# of its takes stop before 188 frames).
set -euo pipefail
out=$(realpath -m "${1:?usage: gpu_workflow.sh OUT [EMOTIONS] [PROMPTS] [CONFIG]}")
n_emotions=${2:-2}
n_prompts=${3:-8}
recipe=$(realpath "${4:-config/recipes/emotions.yaml}")
repo=$(pwd)
work=${WORK:-/tmp/bestofn-gpu}
py=${PYTHON:-python3}
# Its CPU smoke test (tests/lab/test_gpu_scripts.py): SIZE=tiny PROFILE=local TAKES=2 FRAMES=8
# BENCH=0 WORK=<a folder whose weights/ a tiny fake-weights tree is>
# OVERLAP=off|host|full sets runtime.overlap in the run's config (default: the config's, auto);
# PARAKEET_ATTENTION=sdpa|manual the Parakeet scorer's runtime.attention (default: auto);
# PARAKEET_DECODING=cuda_graphs|cuda_graphs_host_loop|... its runtime.decoding (default: auto).
# PARAKEET=calibrated|plain: which random Parakeet fake-weights points the config at (default
# calibrated: its joint emits speech's token rate; the plain one runs NeMo's greedy loop to
# max_symbols on every frame: ~1,840 tokens per 15-s clip, against the calibrated ~60); only
# when the weights are written.
# CODEC_KERNELS=eager|compiled the generator's runtime.codec_kernels (default: auto);
# PAIR_GROUPS=1: runtime.pair_groups true and runtime.queue_depth 4 (pairing needs a pair
# queued while a pair is restored); PAIR_GROUPS=0: pair_groups false (the config's depth);
# QUEUE_DEPTH=N: runtime.queue_depth N (after PAIR_GROUPS's). The unpaired production set:
# PAIR_GROUPS=0 DECODE_BATCH=16 QUEUE_DEPTH=2.
# DECODE_BATCH=N: the generator's runtime.decode_batch_size (default: the config's, 64);
# GEN_PRIORITY=high|normal: runtime.generate_priority; WRITE_THREADS=N: runtime.write_threads;
# CACHE_DIR=PATH: runtime.cache_dir as an
# absolute path, so that a second run of this script starts its worker on the compile cache and
# hash memo the first left (results/, where the default cache lives, is removed at each run).
size=${SIZE:-real}
profile=${PROFILE:-a100x8}
takes=${TAKES:-64}
frames=${FRAMES:-188}
mkdir -p "$out" "$work/project"

# The fake weights are written on the CPU while `bench pipeline` runs on the first GPU (the
# machine's time is short); the workflow starts once both are done.
t0=$(date +%s)
writer=
if [ ! -f "$work/weights/config.yaml" ]; then
    $py -m bestofn.cli fake-weights "$work/weights" --size "$size" --p-stop "${P_STOP:-1e-9}" --no-delay \
        --parakeet "${PARAKEET:-calibrated}" >"$out/fake_weights.log" 2>&1 &
    writer=$!
fi
if [ "${BENCH:-1}" = 1 ]; then
    first_gpu=${CUDA_VISIBLE_DEVICES:-0}
    CUDA_VISIBLE_DEVICES=${first_gpu%%,*} $py -m lab.bench pipeline --size "$size" --takes "$takes" \
        --frames "$frames" --workdir "$work/bench" --out "$out/bench_pipeline.json" \
        >"$out/bench_pipeline.log" 2>&1 || { tail -n 40 "$out/bench_pipeline.log"; exit 1; }
    echo "bench pipeline: $(($(date +%s) - t0)) s"
    tail -n 25 "$out/bench_pipeline.log"
fi
[ -z "$writer" ] || wait "$writer" || { tail -n 20 "$out/fake_weights.log"; exit 1; }
echo "fake-weights (and bench): $(($(date +%s) - t0)) s"

# The project: the recipe on the fake weights, sheets with no reference voice (bench pipeline
# has none), each emotion naming an Empathic-Insight head of the tree (lab/project.py).
$py -m lab.project --recipe "$recipe" --weights "$work/weights" --project "$work/project" \
    --emotions "$n_emotions" --prompts "$n_prompts" --takes "$takes" --frames "$frames" >/dev/null

cd "$work/project"
rm -rf results .snakemake
t0=$(date +%s)
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 1 \
    >"$out/nvidia_smi.csv" 2>/dev/null &
smi=$!
set +e
$py -m snakemake --snakefile "$repo/Snakefile" --profile "$repo/profiles/$profile" \
    --configfile config.yaml >"$out/snakemake.log" 2>&1
rc=$?
set -e
kill "$smi" 2>/dev/null || true
echo "snakemake: rc $rc, $(($(date +%s) - t0)) s"
tail -n 30 "$out/snakemake.log"
cp -r results/logs "$out/logs" 2>/dev/null || true
cp config.yaml "$out/config.yaml"
bestofn_verify=$($py -m bestofn.cli verify results | tail -n 1)
echo "verify: $bestofn_verify"
[ "$rc" = 0 ] || exit "$rc"

$py - "$out" "$bestofn_verify" <<'EOF'
import json
import sys

import duckdb

out, verify = sys.argv[1], sys.argv[2]
con = duckdb.connect("results/bestofn.duckdb", read_only=True)
con.execute("COPY (SELECT * FROM throughput) TO ? (HEADER)", [f"{out}/throughput.csv"])
workers = con.execute(
    """WITH g AS (SELECT group_id, any_value(worker_pid) AS pid, any_value(device) AS device,
                       min(started_at) AS s, max(finished_at) AS f,
                       any_value(group_wall_s) AS wall, count(*) AS clips
                FROM takes GROUP BY group_id)
       SELECT pid, any_value(device), count(*), sum(clips), min(s), max(f), sum(wall)
       FROM g GROUP BY pid ORDER BY 2"""
).fetchall()
# paired_with: the partner whose takes came from the same generate calls ('' alone); trees
# before pairing have no such column
cols = {d[0] for d in con.execute("SELECT * FROM takes LIMIT 0").description}
partner = "any_value(paired_with)" if "paired_with" in cols else "NULL"
per_group = con.execute(
    f"""SELECT group_id, any_value(worker_pid), any_value(device), any_value(worker_idle_s),
               any_value(group_wall_s), count(*), any_value(group_load_s), {partner}
        FROM takes GROUP BY group_id ORDER BY min(started_at)"""
).fetchall()
summary = {"verify": verify, "workers": [], "groups": []}
for pid, device, groups, clips, first, last, busy in workers:
    span = (last - first).total_seconds()
    # idle between groups: the worker's span minus the time it spent inside groups
    idle = max(0.0, span - busy)
    summary["workers"].append(dict(pid=pid, device=device, groups=groups, clips=clips,
                                   span_s=span, busy_s=busy, idle_between_groups_s=idle,
                                   idle_fraction=idle / span if span else None,
                                   s_per_clip_wall=span / clips))
for gid, pid, device, idle, wall, clips, load, paired_with in per_group:
    summary["groups"].append(dict(group=gid, pid=pid, device=device, idle_before_s=idle,
                                  wall_s=wall, clips=clips, load_s=load, paired_with=paired_with))
# With pair_groups, a group alone costs a pair's call for half the clips, and a first group
# alone shifts every later pair (docs/PERFORMANCE.md, the workflow): read the steady state with
# this. With pair_groups off every group is alone.
summary["groups_alone"] = [g["group"] for g in summary["groups"] if g["paired_with"] == ""]
spans = con.execute("SELECT min(started_at), max(finished_at), count(*), sum(duration_s), "
                    "quantile_cont(duration_s, [0.1, 0.5, 0.9]) FROM takes").fetchone()
total = (spans[1] - spans[0]).total_seconds()
n_gpus = len(summary["workers"])
audio_s = spans[3]
summary["overall"] = dict(first_start_to_last_end_s=total, clips=spans[2], gpus=n_gpus,
                          s_per_clip_per_gpu=total * n_gpus / spans[2],
                          audio_s=audio_s, s_per_audio_s_per_gpu=total * n_gpus / audio_s,
                          take_s_p10_p50_p90=spans[4],
                          mean_group_wall_s_per_clip=sum(g["wall_s"] for g in summary["groups"])
                          / spans[2])
# Steady state, as `bench pipeline` times it: each worker's first group (CUDA-graph capture and
# compilation happen in it) is left out; from the end of that group to the worker's last end.
steady = con.execute(
    """WITH g AS (SELECT group_id, any_value(worker_pid) AS pid, min(started_at) AS s,
                       max(finished_at) AS f, count(*) AS clips,
                       row_number() OVER (PARTITION BY any_value(worker_pid)
                                          ORDER BY min(started_at)) AS k
                FROM takes GROUP BY group_id)
       SELECT pid, epoch(max(f) - min(f)), sum(clips) FILTER (WHERE k > 1) FROM g GROUP BY pid"""
).fetchall()
summary["steady_state"] = [dict(pid=pid, span_s=span, clips=clips,
                                 s_per_clip=span / clips if clips else None)
                           for pid, span, clips in steady]
# The same from the end of the second group: with pair_groups the first two groups are one
# pair and end together, so the figure above would count the second group's clips at no cost.
steady2 = con.execute(
    """WITH g AS (SELECT group_id, any_value(worker_pid) AS pid, max(finished_at) AS f,
                       count(*) AS clips,
                       row_number() OVER (PARTITION BY any_value(worker_pid)
                                          ORDER BY max(finished_at)) AS k
                FROM takes GROUP BY group_id)
       SELECT pid, epoch(max(f) - max(f) FILTER (WHERE k = 2)), sum(clips) FILTER (WHERE k > 2)
       FROM g GROUP BY pid"""
).fetchall()
summary["steady_state_after_two"] = [dict(pid=pid, span_s=span, clips=clips,
                                          s_per_clip=span / clips if clips else None)
                                     for pid, span, clips in steady2]
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1, default=str)
print(json.dumps({k: summary[k] for k in ("verify", "workers", "overall", "steady_state",
                                          "steady_state_after_two", "groups_alone")},
                 indent=1, default=str))
EOF

