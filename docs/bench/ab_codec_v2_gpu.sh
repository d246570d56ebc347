#!/usr/bin/env bash
# `bestofn ab` for the v2 codec's precision dial: moss-fast with `codec_compute_dtype: bf16` (B)
# against `fp32` (A), the same groups, seeds and codes, on random MOSS-TTS-Local weights and the
# random MOSS-Audio-Tokenizer-v2 codec at SIZE (default real; written to WORK once). Generator +
# duration scorer: the rows that count are the codec's decode s/clip, peak memory, and the
# pcm_* rows (B's takes against A's as audio) under the thresholds of
# config/ab_thresholds_codec.yaml, fixed before the run. Every take runs to FRAMES frames.
#
#   bash docs/bench/ab_codec_v2_gpu.sh OUT                                 # on the H200 (~5 min)
#   SIZE=tiny DEVICE=cpu TAKES=2 FRAMES=12 bash docs/bench/ab_codec_v2_gpu.sh OUT   # CPU smoke
set -euo pipefail
out=$(realpath -m "${1:?usage: ab_codec_v2_gpu.sh OUT}")
size=${SIZE:-real}
work=${WORK:-/tmp/bestofn-ab-codec-$size}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
takes=${TAKES:-64}
frames=${FRAMES:-188}
mkdir -p "$out" "$work"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}src
$py - "$work" "$device" "$takes" "$frames" "$size" <<'PY'
import sys
from pathlib import Path

import yaml

from bestofn.fakes import moss

work, device, takes, frames, size = sys.argv[1:]
work = Path(work)
if not (work / "MOSS-Audio-Tokenizer-v2" / "config.json").is_file():
    moss.write(work, size, seed=0, p_stop=1e-9)
(work / "emotions.tsv").write_text("emotion\tdescription\nneutral\tA neutral voice.\n")
(work / "ab_prompts.tsv").write_text("prompt_id\ttext\np1\tHello there.\np2\tGood night.\n")
for side, dtype in (("a", "fp32"), ("b", "bf16")):
    config = {
        "emotions": str(work / "emotions.tsv"),
        "prompts": str(work / "ab_prompts.tsv"),
        "results": str(work / f"ab_results_{side}"),
        "takes": int(takes),
        "device": device,
        "models": {
            "generator": {
                "backend": "moss-fast",
                "options": {
                    "model_dir": str(work / "MOSS-TTS-Local-Transformer-v1.5"),
                    "codec_dir": str(work / "MOSS-Audio-Tokenizer-v2"),
                    "codec_compute_dtype": dtype,
                    "min_frames": int(frames),
                    "max_frames": int(frames),
                },
                "runtime": {"batch_size": 64, "decode_batch_size": 64},
            },
            "scorers": [{"backend": "duration"}],
        },
        "selection": {"filter": "true", "score": "0"},
    }
    (work / f"ab_{side}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
# The codec thresholds of the repository, for the columns this run writes.
fixed = yaml.safe_load(Path("config/ab_thresholds_codec.yaml").read_text())
keep = {k: v for k, v in fixed.items() if k == "duration_s" or k.startswith("pcm_")}
(work / "ab_thresholds.yaml").write_text(yaml.safe_dump(keep))
PY
set +e
$py -m bestofn.cli ab --a "$work/ab_a.yaml" --b "$work/ab_b.yaml" \
    --thresholds "$work/ab_thresholds.yaml" --groups 2 --out "$out/ab_codec_v2.parquet" \
    2>&1 | tee "$out/ab_codec_v2.log"
echo "ab exit: ${PIPESTATUS[0]}"
