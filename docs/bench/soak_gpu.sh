#!/usr/bin/env bash
# A long soak through ONE warm worker: >= 150 groups x 64 takes of the production set at real
# size (random weights) on one GPU, through snakemake, with a sample per group of the worker's
# host RSS and its GPU memory (nvidia-smi's per-process figure: the caching allocator's reserved
# memory, CUDA-graph pools included, plus the context) and its RSS by mapping kind (glibc's
# arenas, brk heap, other anonymous memory, files: which one grows), then `verify` and the idle
# share.
#
#   CUDA_VISIBLE_DEVICES=0 bash docs/bench/soak_gpu.sh OUT
#
# Run from the repository root with PYTHONPATH=src. The project is docs/bench/gpu_workflow.sh's
# (its fake weights, sheets and snakemake call, BENCH=0); this script adds the sampler and the
# checks and writes OUT/soak.json. Knobs: SOAK_GROUPS (150), FRAMES (48 codec frames, 3.8 s takes:
# the soak is about memory over many groups, not audio length), TAKES (64), RSS_BOUND_MIB (256),
# GPU_BOUND_MIB (512). CPU smoke test: SIZE=tiny PROFILE=local TAKES=2 FRAMES=8 SOAK_GROUPS=6.
# The worker's own record of each group (its log's `group-stats` lines, bestofn.worker.startup):
# the CUDA caching allocator's allocated and reserved MiB after the group, and the decode
# states, CUDA graphs and graph pools its engine keeps. Growth is the median of the last 20
# groups minus the median of groups 5-24 (the first groups load and capture; a one-group
# transient moves no median), the max minus that baseline reported beside it: host RSS growth
# <= RSS_BOUND_MIB, allocated <= ALLOCATED_BOUND_MIB (256), reserved <= RESERVED_BOUND_MIB
# (512); graph pools never more than at group 5, and no new CUDA graph in the second half.
set -euo pipefail
out=$(realpath -m "${1:?usage: soak_gpu.sh OUT}")
groups=${SOAK_GROUPS:-150}
export FRAMES=${FRAMES:-48} TAKES=${TAKES:-64} BENCH=0
export WORK=${WORK:-/tmp/bestofn-soak}
py=${PYTHON:-python3}
mkdir -p "$out"
rm -f "$out/sampler.stop"

# The sampler: one sample each time another group is published, and one a second regardless.
$py - "$WORK/project/results" "$out" <<'PYEOF' &
import json, os, subprocess, sys, time
from pathlib import Path

results, out = Path(sys.argv[1]), Path(sys.argv[2])
stop = out / "sampler.stop"

def workers():
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"bestofn.cli" in cmd and b"worker" in cmd:
                pids.append(int(p.name))
    return pids

def rss_mib(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None

ARENA = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit: non-main arenas' heaps, 64 MiB-aligned

def rss_by_kind(pid):
    """The resident MiB by mapping kind (/proc/PID/smaps): brk heap (glibc's main arena),
    anonymous 64 MiB-aligned regions of at most 64 MiB (glibc's other arenas' heaps; an
    unrelated mapping can match: approximate), other anonymous (big malloc chunks, pinned
    host memory, allocator pools), files; and the thread count."""
    kinds, kind = {}, None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(maxsplit=6)
                if not head[0].endswith(":"):
                    lo, hi = (int(x, 16) for x in head[0].split("-"))
                    name = head[5].strip() if len(head) > 5 else ""
                    if name == "[heap]":
                        kind = "brk_heap"
                    elif name:
                        kind = "files" if name.startswith("/") else "other"
                    elif lo % ARENA == 0 and hi - lo <= ARENA:
                        kind = "arena_heaps"
                    else:
                        kind = "anon_other"
                elif head[0] == "Rss:":
                    kinds[kind] = kinds.get(kind, 0) + int(head[1])
        threads = len(list(Path(f"/proc/{pid}/task").iterdir()))
    except (OSError, ValueError):
        return None
    return {"threads": threads, **{k: round(v / 1024, 1) for k, v in kinds.items()}}

def gpu_mib():
    try:
        text = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {int(a): float(b) for a, b in (l.split(",") for l in text.splitlines() if "," in l)}

samples, last, t0 = [], -1, time.time()
while not stop.exists():
    n = len(list(results.glob("groups/*/*/scores.parquet"))) if results.exists() else 0
    if n != last:
        gpu = gpu_mib()
        samples.append({"groups_done": n, "t_s": round(time.time() - t0, 2),
                        "workers": {str(p): {"host_rss_mib": rss_mib(p), "gpu_mib": gpu.get(p),
                                             "rss_by_kind_mib": rss_by_kind(p)}
                                    for p in workers()}})
        last = n
        (out / "samples.json").write_text(json.dumps(samples))
    time.sleep(0.25)
PYEOF
sampler=$!

t0=$(date +%s)
set +e
bash docs/bench/gpu_workflow.sh "$out/workflow" 1 "$groups" 2>&1 | tee "$out/workflow.log"
rc=${PIPESTATUS[0]}
set -e
touch "$out/sampler.stop"
wait "$sampler" || true
echo "soak: rc $rc, $(($(date +%s) - t0)) s"
[ "$rc" = 0 ] || exit "$rc"

$py - "$out" "$groups" "${RSS_BOUND_MIB:-256}" "${GPU_BOUND_MIB:-512}" \
    "${ALLOCATED_BOUND_MIB:-256}" "${RESERVED_BOUND_MIB:-512}" <<'PYEOF'
import glob, json, sys

out, groups, rss_bound, gpu_bound = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
alloc_bound, reserved_bound = float(sys.argv[5]), float(sys.argv[6])
# the worker's per-group lines: "... bestofn.worker group-stats {json}"
stats = []
for path in sorted(glob.glob(f"{out}/workflow/logs/workers/slot*.log")):
    for line in open(path, errors="replace"):
        if " group-stats {" in line:
            stats.append(json.loads(line.split(" group-stats ", 1)[1]))
stats.sort(key=lambda r: r["t_unix"])
after = [r for r in stats if r["groups_done"] >= 5]

def median(vals):
    vals = sorted(vals)
    n = len(vals)
    return (vals[n // 2] + vals[(n - 1) // 2]) / 2

def growth_of(rows, key):
    """Growth of ``key`` over the run: the median of the last 20 groups minus the median of
    groups 5-24 (a one-group transient, e.g. the next group in flight under overlap full when
    the stats are taken, moves neither), and the highest value minus that baseline."""
    vals = [(r["groups_done"], r[key]) for r in rows if r.get(key) is not None]
    if not vals:
        return None, None
    base = median([v for n, v in vals if n < 25])
    return median([v for _, v in vals[-20:]]) - base, max(v for _, v in vals) - base

def rise(key):
    return growth_of(after, key)
half = after[len(after) // 2:]
graphs = [(r.get("engine") or {}).get("graphs") for r in after]
pools = [(r.get("engine") or {}).get("graph_pools") for r in after]
late = [(r.get("engine") or {}).get("graphs") for r in half]
late_graphs = late[-1] - late[0] if late and None not in (late[0], late[-1]) else None
samples = json.load(open(f"{out}/samples.json"))
summary = json.load(open(f"{out}/workflow/summary.json"))
per_group = []
for s in samples:
    if s["groups_done"] and s["workers"]:
        pid, w = max(s["workers"].items(), key=lambda kv: kv[1]["host_rss_mib"] or 0)
        per_group.append({"groups_done": s["groups_done"], "t_s": s["t_s"], "pid": pid,
                          "host_rss_mib": w["host_rss_mib"], "gpu_mib": w["gpu_mib"],
                          "rss_by_kind_mib": w.get("rss_by_kind_mib")})
# The first groups load the models and capture the CUDA graphs: the baseline is group 5.
warm = [g for g in per_group if g["groups_done"] >= 5]
def growth(key):
    return growth_of(warm, key)
workers = summary["workers"]
idle = [w["idle_fraction"] for w in workers]
result = {
    "groups": len(summary["groups"]),
    "clips": summary["overall"]["clips"],
    "workers": len(workers),
    "verify": summary["verify"],
    "idle_fraction": idle,
    "host_rss_growth_mib": growth("host_rss_mib")[0],
    "host_rss_max_growth_mib": growth("host_rss_mib")[1],
    "gpu_growth_mib": growth("gpu_mib")[0],
    "gpu_max_growth_mib": growth("gpu_mib")[1],
    "bounds": {"host_rss_mib": rss_bound, "gpu_mib": gpu_bound, "idle_fraction": 0.02},
    "per_group": per_group,
    "steady_state": summary["steady_state"],
    "worker_groups": stats,
    "cuda_allocated_growth_mib": rise("cuda_allocated_mib")[0],
    "cuda_allocated_max_growth_mib": rise("cuda_allocated_mib")[1],
    "cuda_reserved_growth_mib": rise("cuda_reserved_mib")[0],
    "cuda_reserved_max_growth_mib": rise("cuda_reserved_mib")[1],
    "worker_host_rss_growth_mib": rise("host_rss_mib")[0],
    "worker_host_rss_max_growth_mib": rise("host_rss_mib")[1],
    # which host memory grows (the worker's own counts): glibc's live and free heap blocks,
    # Python's live objects, torch's pinned host cache
    "host_growth": {key: rise(key)[0] for key in (
        "malloc_in_use_mib", "malloc_free_mib", "malloc_mmapped_mib", "python_blocks",
        "pinned_host_mib")},
    "engine_graphs": {"at_group_5": graphs[0] if graphs else None,
                      "max": max((g for g in graphs if g is not None), default=None),
                      "new_in_second_half": late_graphs},
    "engine_graph_pools": {"at_group_5": pools[0] if pools else None,
                           "max": max((p for p in pools if p is not None), default=None)},
}
result["bounds"].update(cuda_allocated_mib=alloc_bound, cuda_reserved_mib=reserved_bound)
checks = {
    "one_worker": len(workers) == 1,
    "verify_clean": " 0 problem(s)" in summary["verify"],
    "host_rss_flat": result["host_rss_growth_mib"] is not None
    and result["host_rss_growth_mib"] <= rss_bound,
    "gpu_flat": result["gpu_growth_mib"] is None or result["gpu_growth_mib"] <= gpu_bound,
    "idle_under_2pct": all(f is not None and f < 0.02 for f in idle),
    "worker_stats_per_group": len(stats) == len(summary["groups"]),
    "cuda_allocated_flat": result["cuda_allocated_growth_mib"] is None
    or result["cuda_allocated_growth_mib"] <= alloc_bound,
    "cuda_reserved_flat": result["cuda_reserved_growth_mib"] is None
    or result["cuda_reserved_growth_mib"] <= reserved_bound,
    "graph_pools_flat": all(p is None or pools[0] is None or p <= pools[0] for p in pools),
    "no_new_graphs_late": not late_graphs,
}
result["checks"] = checks
json.dump(result, open(f"{out}/soak.json", "w"), indent=1)
print(json.dumps({k: v for k, v in result.items()
                  if k not in ("per_group", "steady_state", "worker_groups")}, indent=1))
for r in stats[:: max(1, len(stats) // 12)]:  # a dozen rows of the worker's own record
    e = r.get("engine") or {}
    print(f"group {r['groups_done']:4d}: rss {r.get('host_rss_mib') or 0:8.1f} MiB, allocated "
          f"{r.get('cuda_allocated_mib') or 0:8.1f}, reserved {r.get('cuda_reserved_mib') or 0:8.1f}"
          f", states {e.get('states')}, graphs {e.get('graphs')}, pools {e.get('graph_pools')}"
          f", malloc in use/free {r.get('malloc_in_use_mib') or 0:.0f}/"
          f"{r.get('malloc_free_mib') or 0:.0f}, python blocks {r.get('python_blocks')}, pinned "
          f"{r.get('pinned_host_mib') or 0:.0f}")
PYEOF
