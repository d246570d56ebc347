#!/usr/bin/env bash
# Issue 22 (one MOSS engine shell; the BESTOFN_MOSS_* switches as runtime options): does the
# refactored tree decode the same codes as the tree before, as fast, on one GPU?
#   1. `bestofn parity` on the GPU, Local and Delay (tiny random checkpoints, CUDA-graph path too);
#   2. the same takes, bit for bit: moss-fast at the real 4B Local shape (random weights), 16
#      takes x 120 frames, compiled + CUDA graphs, under the tree before and this tree;
#   3. `bench generate` at batch 64 (compiled, compiled-unfused, compiled-localsdpa), the two
#      trees alternating A B A B in one call.
# Usage, from the repository root (bestofn importable; torch with CUDA):
#   git archive f0a0c71 src | tar -x -C .ref/before     # the tree before, once (.ref is ignored)
#   bash docs/bench/engine_shell_gpu.sh OUT [.ref/before] [--small]
# Needs .ref/moss_tts_local_v1.5 and .ref/moss_tts_delay (copies of OpenMOSS/MOSS-TTS) for 1.
# --small: tiny shapes on whatever device (a smoke test of the script, e.g. on a CPU).
set -uo pipefail
out=$(realpath -m "${1:?usage: engine_shell_gpu.sh OUT [BEFORE] [--small]}")
before=$(realpath -m "${2:-.ref/before}")
small=${3:-}
mkdir -p "$out"
py=${PYTHON:-python3}
dev=cuda
size=real
frames=120
gen_args=(--batches 64 --reference-batches "" --variants compiled,compiled-unfused,compiled-localsdpa)
if [ "$small" = "--small" ]; then
    dev=$($py -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
    size=tiny
    frames=12
    gen_args=(--tiny --device "$dev" --batches 4 --reference-batches "" --variants eager --frames 12 --repeats 1)
fi
echo "# $(date -u +%FT%TZ) engine_shell_gpu.sh: this tree $(git rev-parse --short HEAD 2>/dev/null || echo '?'), before: $before, device $dev" | tee "$out/summary.txt"

# 1. parity on the device (this tree)
for code in moss_tts_local_v1.5 moss_tts_delay; do
    if [ -d ".ref/$code" ]; then
        PYTHONPATH=src $py -m bestofn.cli parity --reference-code ".ref/$code" --device "$dev" \
            >"$out/parity_$code.log" 2>&1
        echo "parity $code rc $? $(tail -n 1 "$out/parity_$code.log")" | tee -a "$out/summary.txt"
    else
        echo "parity $code: SKIPPED (.ref/$code missing)" | tee -a "$out/summary.txt"
    fi
done

# 2. the same takes under both trees
takes() {  # $1: src dir, $2: output .pt
    PYTHONPATH="$1" $py - "$2" "$dev" "$size" "$frames" <<'PY'
import sys, torch
from bestofn.fakes.moss import build
from bestofn.util.spec import GroupSpec
path, dev, size, frames = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
# no stop (real size): every take runs to the budget; min = max frames = the budget
gen = build(dev, size=size, seed=0, batch_size=16, min_frames=frames, max_frames=frames)
spec = GroupSpec("calm", "p1", "The quick brown fox jumps over the lazy dog.", n_takes=16)
codes, stopped, budget = gen.generate_codes(spec)
torch.save({"codes": codes, "stopped": stopped, "budget": budget}, path)
print(f"{len(codes)} takes, frames {sorted({len(c) for c in codes})}, budget {budget}")
PY
}
if [ -d "$before" ]; then
    takes "$before" "$out/takes_before.pt" >"$out/takes_before.log" 2>&1
    takes src "$out/takes_after.pt" >"$out/takes_after.log" 2>&1
    $py - "$out" <<'PY' | tee -a "$out/summary.txt"
import sys, torch
d = sys.argv[1]
a, b = torch.load(f"{d}/takes_before.pt"), torch.load(f"{d}/takes_after.pt")
same = sum(torch.equal(x, y) for x, y in zip(a["codes"], b["codes"], strict=True))
print(f"takes before vs after, same seeds: {same}/{len(a['codes'])} bit-identical; "
      f"stopped equal {a['stopped'] == b['stopped']}")
PY
else
    echo "takes: SKIPPED (no tree before at $before)" | tee -a "$out/summary.txt"
fi

# 3. bench generate, A B A B
for round in 1 2; do
    for side in before after; do
        src=src
        [ "$side" = before ] && src="$before"
        [ -d "$src" ] || continue
        PYTHONPATH="$src" $py -m lab.bench generate "${gen_args[@]}" \
            --json "$out/gen_${side}_$round.json" >"$out/gen_${side}_$round.log" 2>&1
        echo "bench generate $side round $round rc $?" >>"$out/summary.txt"
        grep -E "moss-fast\[" "$out/gen_${side}_$round.log" | sed "s/^/  $side $round: /" \
            | tee -a "$out/summary.txt"
    done
done
