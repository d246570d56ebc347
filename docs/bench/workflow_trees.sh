#!/usr/bin/env bash
# The production workflow through snakemake for several source trees in turn, side by side in
# one call on one machine: each run is `gpu_workflow.sh` from that tree's root (its own
# Snakefile, rules and src), on a worker of its own (the one before is stopped), all on one set
# of weights and one compile cache (WORK, CACHE_DIR).
#
#   bash docs/bench/workflow_trees.sh OUT EMOTIONS PROMPTS TAG=ROOT[:LIMIT_S][@CONFIG] ...
#   e.g. bash docs/bench/workflow_trees.sh /tmp/out 2 8 O=/tmp/old:300 N=.:170
#        bash docs/bench/workflow_trees.sh /tmp/out 2 8 P=.:300 E=.:300@config/recipes/emotions.yaml
#
# ROOT is a checkout of the tree (`git worktree add /tmp/old COMMIT`); LIMIT_S a timeout for the
# run (default 600); CONFIG the recipe, relative to ROOT (default: that tree's own default,
# config/recipes/emotions.yaml; trees whose gpu_workflow.sh takes no CONFIG ignore it). Each run's summary.json says which groups paired from the start
# (`groups_alone`): compare runs that started alike. Then, for each run,
# `python docs/bench/steady_from_group_logs.py OUT/TAG/...` reads the steady state from its
# group logs where a run was cut before its summary.
set -uo pipefail
out=$(realpath -m "${1:?usage: workflow_trees.sh OUT EMOTIONS PROMPTS TAG=ROOT[:LIMIT_S][@CONFIG] ...}")
emotions=${2:?EMOTIONS}
prompts=${3:?PROMPTS}
shift 3
export WORK=${WORK:-/tmp/bestofn-gpu} BENCH=${BENCH:-0}
export CACHE_DIR=${CACHE_DIR:-$WORK/cache}
py=${PYTHON:-python3}
mkdir -p "$out"
for run in "$@"; do
    tag=${run%%=*}
    spec=${run#*=}
    config=()
    if [ "$spec" != "${spec%@*}" ]; then
        config=("${spec##*@}")
        spec=${spec%@*}
    fi
    root=$(realpath "${spec%%:*}")
    limit=600
    [ "$spec" = "${spec%:*}" ] || limit=${spec##*:}
    (cd "$root" && PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" timeout -k 5 "$limit" \
        bash docs/bench/gpu_workflow.sh "$out/$tag" "$emotions" "$prompts" "${config[@]}" \
        >"$out/$tag.log" 2>&1)
    echo "workflow $tag ($root): rc $?"
    (cd "$WORK/project" && PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" "$py" -m bestofn.cli workers stop) || true
    grep -E "snakemake:|verify:" "$out/$tag.log" | tail -n 3
done
