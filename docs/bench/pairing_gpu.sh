#!/usr/bin/env bash
# Issue 24, two groups per generate call: on one GPU, are a group's takes bit-identical alone
# in the pair shape, beside B and beside C (A in the second half), and what does a clip cost
# today (one group per call, batch 64), alone in the pair shape (batch 128, half dummy rows)
# and paired (batch 128, two groups)? moss-fast at the real Local 4B shape, random weights
# built on the device (no files), compiled + CUDA graphs, 64 takes x 188 frames (15 s).
# Prints the figures and writes OUT/pairing.json (lab.probes.pairing says what each is).
#
#   bash docs/bench/pairing_gpu.sh OUT            # repository root, torch with CUDA; ~3 min
#   bash docs/bench/pairing_gpu.sh OUT --small    # tiny model on whatever device (smoke test)
set -uo pipefail
out=$(realpath -m "${1:?usage: pairing_gpu.sh OUT [--small]}")
mkdir -p "$out"
py=${PYTHON:-python3}
args=()
[ "${2:-}" = "--small" ] && args=(--tiny)
echo "# $(date -u +%FT%TZ) pairing_gpu.sh: tree $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
    | tee "$out/summary.txt"
PYTHONPATH=src $py -m lab.probes.pairing "$out" "${args[@]}" 2>&1 | tee "$out/probe.log"
rc=${PIPESTATUS[0]}
grep -E "^(speed|invariance|INVARIANT)" "$out/probe.log" >>"$out/summary.txt"
echo "probe rc $rc" | tee -a "$out/summary.txt"
exit "$rc"
