#!/usr/bin/env bash
# The lab's measuring code, by one name that does not depend on where the lab lives:
#
#   bash docs/bench/lab.sh bench NAME [ARGS]    # a benchmark: pipeline, generate, scorers, codec,
#                                               # serve, database, export, ...
#   bash docs/bench/lab.sh probe NAME [ARGS]    # a probe: pairing, worker_start, delay_bench, ...
#
# Run from the repository root with bestofn importable (PYTHONPATH=src or installed). The
# ledger's commands name this script, so when the lab moves only the two lines below change.
set -euo pipefail
py=${PYTHON:-python3}
kind=${1:?usage: lab.sh bench|probe NAME [ARGS]}
name=${2:?usage: lab.sh bench|probe NAME [ARGS]}
shift 2
case "$kind" in
bench) exec "$py" -m lab.bench "$name" "$@" ;;
probe) exec "$py" -m "lab.probes.$name" "$@" ;;
*) echo "lab.sh: the first argument is bench or probe, not $kind" >&2; exit 2 ;;
esac
