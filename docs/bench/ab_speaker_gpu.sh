#!/usr/bin/env bash
# `bestofn ab`: the speaker scorer's runtime dials. A: float32, one batch of 64 (the scorer
# before its speed work); B: the recipe's own (the schema's defaults unless it sets them:
# bfloat16 body on CUDA, padded masked batches of 64, no crop), or B_RUNTIME's. Both sides run
# the recipe (CONFIG, default config/recipes/emotions.yaml) on the fake weights under WORK/weights
# (lab/project.py; gpu_workflow.sh writes them), with the thresholds of
# config/ab_thresholds_speaker.yaml, fixed beforehand. On fake weights the spk_sim row is
# meaningless (the table says so): with real weights it is the gate.
#
#   bash docs/bench/ab_speaker_gpu.sh OUT [CONFIG] [GROUPS]
#   e.g. B_RUNTIME='{"max_seconds": 6}' bash docs/bench/ab_speaker_gpu.sh /tmp/ab
#
# CPU smoke test: WORK=<a folder whose weights/ is a tiny fake-weights tree> TAKES=2 FRAMES=8.
set -euo pipefail
out=$(realpath -m "${1:?usage: ab_speaker_gpu.sh OUT [CONFIG] [GROUPS]}")
recipe=$(realpath "${2:-config/recipes/emotions.yaml}")
groups=${3:-2}
work=${WORK:-/tmp/bestofn-gpu}
py=${PYTHON:-python3}
mkdir -p "$out"
$py -m lab.project --recipe "$recipe" --weights "$work/weights" --project "$work/ab-speaker" \
    --emotions 1 --prompts "$groups" --takes "${TAKES:-64}" --frames "${FRAMES:-188}" >/dev/null
$py - "$work/ab-speaker" "${B_RUNTIME:-{\}}" <<'PY'
import copy
import json
import sys
from pathlib import Path

import yaml

project, b_runtime = Path(sys.argv[1]), json.loads(sys.argv[2])
config = yaml.safe_load((project / "config.yaml").read_text())
sides = {"a": {"precision": "float32", "batch_size": 64}, "b": b_runtime}
for side, runtime in sides.items():
    side_config = copy.deepcopy(config)
    side_config["results"] = str(project / f"results_{side}")
    for scorer in side_config["models"]["scorers"]:
        if scorer["backend"] == "wavlm-speaker":
            scorer["runtime"] = {**(scorer.get("runtime") or {}), **runtime}
    (project / f"{side}.yaml").write_text(yaml.safe_dump(side_config, sort_keys=False))
PY
set +e
$py -m bestofn.cli ab --a "$work/ab-speaker/a.yaml" --b "$work/ab-speaker/b.yaml" \
    --thresholds "$(pwd)/config/ab_thresholds_speaker.yaml" --groups "$groups" \
    --out "$out/ab_speaker.parquet" 2>&1 | tee "$out/ab_speaker.log"
rc=${PIPESTATUS[0]}
echo "ab exit: $rc"
exit "$rc"
