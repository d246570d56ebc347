#!/usr/bin/env bash
# `bestofn ab`: moss-fast with `weights: int8` (B) against the model dtype (A, bf16 on cuda),
# the same 2 groups x 64 takes and seeds, on the real-size random MOSS weights that
# docs/bench/serve_gpu.sh writes (WORK, default /tmp/bestofn-serve). Generator + duration
# scorer only: on random weights the quality rows are meaningless (the table says so); the rows
# that count are peak VRAM and s/clip. Every take runs to 188 frames (15.04 s).
#
#   bash docs/bench/ab_int8_gpu.sh OUT
set -euo pipefail
out=$(realpath -m "${1:?usage: ab_int8_gpu.sh OUT}")
work=${WORK:-/tmp/bestofn-serve}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
takes=${TAKES:-64}
mkdir -p "$out"
$py - "$work" "$device" "$takes" <<'PY'
import sys
from pathlib import Path

import yaml

work, device, takes = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
(work / "ab_prompts.tsv").write_text("prompt_id\ttext\np1\tHello there.\np2\tGood night.\n")
for side, extra in (("a", {}), ("b", {"weights": "int8"})):
    config = {
        "emotions": str(work / "emotions.tsv"),
        "prompts": str(work / "ab_prompts.tsv"),
        "results": str(work / f"ab_results_{side}"),
        "takes": takes,
        "device": device,
        "models": {
            "generator": {
                "backend": "moss-fast",
                "options": {
                    "model_dir": str(work / "MOSS-TTS-Local-Transformer-v1.5"),
                    "codec_dir": str(work / "MOSS-Audio-Tokenizer-v2"),
                    "min_frames": 188,
                    "max_frames": 188,
                    **extra,
                },
            },
            "scorers": [{"backend": "duration"}],
        },
        "selection": {"filter": "true", "score": "0"},
    }
    (work / f"ab_{side}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
# Fixed before the run: the takes must keep their length (duration_s in seconds).
(work / "ab_thresholds.yaml").write_text("duration_s: {max_decrease: 0.1}\n")
PY
set +e
$py -m bestofn.cli ab --a "$work/ab_a.yaml" --b "$work/ab_b.yaml" \
    --thresholds "$work/ab_thresholds.yaml" --groups 2 --out "$out/ab_int8.parquet" \
    2>&1 | tee "$out/ab_int8.log"
echo "ab exit: ${PIPESTATUS[0]}"
