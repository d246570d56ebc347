#!/usr/bin/env bash
# `bestofn ab`: the unpaired production set (A: pair_groups false, decode_batch_size 16)
# against the production set now (B: pair_groups true, decode_batch_size 64), with the
# thresholds fixed beforehand in config/ab_thresholds_pairing.yaml, on the config that
# `bestofn fake-weights` wrote under WORK/weights (docs/bench/gpu_workflow.sh writes it; default
# WORK /tmp/bestofn-gpu). `ab` runs one group at a time, so B's speed rows are a group ALONE in
# the pair shape (the worst case; the workflow's paired figure is gpu_workflow.sh's). On
# fake-weights checkpoints the quality rows are meaningless (the table says so): with real
# weights they are the gate.
#
#   bash docs/bench/ab_production_gpu.sh OUT [GROUPS]
set -euo pipefail
out=$(realpath -m "${1:?usage: ab_production_gpu.sh OUT [GROUPS]}")
groups=${2:-8}
work=${WORK:-/tmp/bestofn-gpu}
py=${PYTHON:-python3}
repo=$(pwd)
mkdir -p "$out"
$py - "$work" "$repo" <<'PY'
import copy
import sys
from pathlib import Path

import yaml

work, repo = Path(sys.argv[1]), Path(sys.argv[2])
config = yaml.safe_load((work / "weights/config.yaml").read_text())
config.update(emotions=str(repo / "config/emotions.tsv"), prompts=str(repo / "config/prompts.tsv"))
for side, pair, decode in (("a", False, 16), ("b", True, 64)):
    side_config = copy.deepcopy(config)
    side_config["results"] = str(work / f"ab_production_{side}")
    runtime = side_config["models"]["generator"].setdefault("runtime", {})
    runtime.update(pair_groups=pair, decode_batch_size=decode)
    (work / f"ab_production_{side}.yaml").write_text(yaml.safe_dump(side_config, sort_keys=False))
PY
cd "$repo"
set +e
$py -m bestofn.cli ab --a "$work/ab_production_a.yaml" --b "$work/ab_production_b.yaml" \
    --thresholds config/ab_thresholds_pairing.yaml --groups "$groups" \
    --out "$out/ab_production.parquet" 2>&1 | tee "$out/ab_production.log"
echo "ab exit: ${PIPESTATUS[0]}"
