#!/usr/bin/env bash
# `bestofn serve` with moss-fast (MOSS-TTS-Local v1.5 shape, random weights) and the load
# generator `python -m bestofn.bench serve` against it: time to first audio and audio-seconds
# per second at several concurrencies (issue 14).
#
#   bash docs/bench/serve_gpu.sh OUT [CONCURRENCY]        e.g. OUT 1,16,64,128
#
# Run from the repository root with bestofn importable. A speech-only config (the generator
# alone: no restorer or scorer takes GPU memory). CPU smoke test of this script:
#   SIZE=tiny DEVICE=cpu bash docs/bench/serve_gpu.sh /tmp/serve-out 1,2
set -euo pipefail
out=$(realpath -m "${1:?usage: serve_gpu.sh OUT [CONCURRENCY]}")
levels=${2:-1,16,64,128}
work=${WORK:-/tmp/bestofn-serve}
py=${PYTHON:-python3}
size=${SIZE:-real}
device=${DEVICE:-cuda}
port=${PORT:-8123}
mkdir -p "$out" "$work"

t0=$(date +%s)
$py - "$work" "$size" "$device" <<'EOF'
import sys
from pathlib import Path

import yaml

from bestofn.fakes import moss

work, size, device = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
if not (work / "MOSS-TTS-Local-Transformer-v1.5" / "config.json").is_file():
    # Random stop heads end takes at random frames; pinned to "continue", every request runs to
    # its frame budget (words x 6 frames), so audio-seconds are the same on every run.
    moss.write(work, size, seed=0, p_stop=1e-9)
(work / "emotions.tsv").write_text("emotion\tdescription\ncalm\tA calm voice.\n")
(work / "prompts.tsv").write_text("prompt_id\ttext\np1\tHello.\n")
config = {
    "emotions": str(work / "emotions.tsv"),
    "prompts": str(work / "prompts.tsv"),
    "results": str(work / "results"),
    "takes": 1,
    "device": device,
    "models": {
        "generator": {
            "backend": "moss-fast",
            "options": {
                "model_dir": str(work / "MOSS-TTS-Local-Transformer-v1.5"),
                "codec_dir": str(work / "MOSS-Audio-Tokenizer-v2-STAND-IN"),
            },
            "runtime": {"batch_size": 128},
        }
    },
    "runtime": {"idle_timeout_s": 900, "start_timeout_s": 900},
    "selection": {"filter": "true", "score": "0"},
}
(work / "speech.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
EOF
echo "weights + config: $(($(date +%s) - t0)) s"

cd "$work"
$py -m bestofn.cli serve --config speech.yaml --port "$port" --max-batch 128 \
    >"$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; $py -m bestofn.cli workers stop >/dev/null 2>&1 || true' EXIT
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.2
done
t0=$(date +%s)
$py -m bestofn.bench serve --url "http://127.0.0.1:$port" --concurrency "$levels" \
    --json "$out/serve.json" 2>&1 | tee "$out/bench_serve.log"
echo "bench serve: $(($(date +%s) - t0)) s"
curl -sf "http://127.0.0.1:$port/health" >"$out/health.json" || true
cp results/logs/workers/*.log "$out/" 2>/dev/null || true
