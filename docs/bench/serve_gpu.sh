#!/usr/bin/env bash
# `bestofn serve` with moss-fast (MOSS-TTS-Local v1.5 shape, random weights) and the load
# generator `python -m lab.bench serve` against it. One run gives:
#   1. bf16, no memory cap: time to first audio and audio-seconds per second at each level
#      (default 1,16,64,128)                                          -> OUT/serve.json
#   2. moss-fast `weights: int8` with the worker's GPU memory held to CAP_GB (default 8,
#      config runtime.gpu_memory_gb): TTFA and streaming RTF at concurrency 1
#                                                                     -> OUT/serve-cap.json
#   and OUT/summary.json with the figures of both side by side.
#
#   bash docs/bench/serve_gpu.sh OUT [CONCURRENCY]        e.g. OUT 1,16,64,128
#
# Run from the repository root with bestofn importable. A speech-only config (the generator
# alone: no restorer or scorer takes GPU memory). CPU smoke test of this script:
#   SIZE=tiny DEVICE=cpu REQUESTS=2 TEXT="Hi there." bash docs/bench/serve_gpu.sh /tmp/serve-out 1,2
# (on a CPU the memory cap is ignored with a log line; the second run still uses int8).
# Other knobs: TEXT (every request's text; default: the load generator's 4 sentences, ~41 s of
# audio on the fake weights, a minute a request on a CPU), PARTS (main,cap), WORK (weights +
# configs), PYTHON, PORT, CAP_GB, CAP_LEVELS (default 1),
# REQUESTS (per level; default max(MIN_REQUESTS, ROUNDS x level), MIN_REQUESTS default 16, ROUNDS
# default 4), STREAM_DECODES (e.g.
# eager,graphs: the main part once per moss-fast runtime.stream_decode, side by side -> OUT/serve-MODE.json; default:
# once, the config's default -> OUT/serve.json), ADMIT_TOKENS (moss-fast runtime.speech_admit_tokens;
# default: the config's, null).
set -euo pipefail
out=$(realpath -m "${1:?usage: serve_gpu.sh OUT [CONCURRENCY]}")
levels=${2:-1,16,64,128}
work=${WORK:-/tmp/bestofn-serve}
py=${PYTHON:-python3}
size=${SIZE:-real}
device=${DEVICE:-cuda}
port=${PORT:-8123}
cap_gb=${CAP_GB:-8}
cap_levels=${CAP_LEVELS:-1}
requests="${REQUESTS:+--requests $REQUESTS} ${ROUNDS:+--rounds $ROUNDS} ${MIN_REQUESTS:+--min-requests $MIN_REQUESTS}"
text=(${TEXT:+--text "$TEXT"})
max_batch=$(echo "$levels" | tr ',' '\n' | sort -n | tail -1)
max_batch=$((max_batch > 1 ? max_batch : 1))
mkdir -p "$out" "$work"

t0=$(date +%s)
$py - "$work" "$size" "$device" "$cap_gb" "${STREAM_DECODES:-}" "${ADMIT_TOKENS:-}" <<'EOF'
import sys
from pathlib import Path

import yaml

from bestofn.fakes import moss

work, size, device, cap_gb = Path(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
modes = [m for m in sys.argv[5].split(",") if m]
admit = int(sys.argv[6]) if sys.argv[6] else None  # runtime.speech_admit_tokens
if not (work / "MOSS-TTS-Local-Transformer-v1.5" / "config.json").is_file():
    # Random stop heads end takes at random frames; pinned to "continue", every request runs to
    # its frame budget (words x 6 frames), so audio-seconds are the same on every run.
    moss.write(work, size, seed=0, p_stop=1e-9)
(work / "emotions.tsv").write_text("emotion\tdescription\ncalm\tA calm voice.\n")
(work / "prompts.tsv").write_text("prompt_id\ttext\np1\tHello.\n")


def config(weights: str, gpu_memory_gb: float | None, stream_decode: str = "auto") -> dict:
    runtime = {"idle_timeout_s": 900, "start_timeout_s": 900}
    if gpu_memory_gb is not None:
        runtime["gpu_memory_gb"] = gpu_memory_gb
    return {
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
                    "codec_dir": str(work / "MOSS-Audio-Tokenizer-v2"),
                    "weights": weights,
                },
                "runtime": {"batch_size": 128, "stream_decode": stream_decode,
                            "speech_admit_tokens": admit},
            }
        },
        "runtime": runtime,
        "selection": {"filter": "true", "score": "0"},
    }


(work / "speech.yaml").write_text(yaml.safe_dump(config("dtype", None), sort_keys=False))
(work / "speech-cap.yaml").write_text(yaml.safe_dump(config("int8", cap_gb), sort_keys=False))
for mode in modes:
    text = yaml.safe_dump(config("dtype", None, mode), sort_keys=False)
    (work / f"speech-{mode}.yaml").write_text(text)
EOF
echo "weights + configs: $(($(date +%s) - t0)) s"

cd "$work"
server=
stop() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    server=
    $py -m bestofn.cli workers stop >/dev/null 2>&1 || true
}
trap stop EXIT

# run NAME CONFIG LEVELS: serve CONFIG, load it at LEVELS, results in OUT/NAME.json
run() {
    local name=$1 config=$2 lv=$3 t1
    stop
    $py -m bestofn.cli serve --config "$config" --port "$port" --max-batch "$max_batch" \
        >"$out/$name.serve.log" 2>&1 &
    server=$!
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        sleep 0.2
    done
    t1=$(date +%s)
    # shellcheck disable=SC2086
    $py -m lab.bench serve --url "http://127.0.0.1:$port" --concurrency "$lv" $requests "${text[@]}" \
        --json "$out/$name.json" 2>&1 | tee "$out/$name.bench.log" || failed="$failed $name"
    echo "bench $name: $(($(date +%s) - t1)) s"
    curl -sf "http://127.0.0.1:$port/health" >"$out/$name.health.json" || true
    if command -v nvidia-smi >/dev/null 2>&1; then  # what the worker holds now (cap included)
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv >"$out/$name.gpu.csv" || true
    fi
    for f in results/logs/workers/*.log; do
        [ -f "$f" ] && cp "$f" "$out/$name.$(basename "$f")"
    done
    stop
    rm -f results/logs/workers/*.log
}

failed=  # runs whose load generator failed: the script's exit status says so, after the rest
# PARTS=cap runs only the capped int8 case (e.g. when a first call ran out of device time)
parts=${PARTS:-main,cap}
if [[ ,$parts, == *,main,* ]]; then
    if [ -z "${STREAM_DECODES:-}" ]; then
        run serve speech.yaml "$levels"
    else
        for mode in ${STREAM_DECODES//,/ }; do run "serve-$mode" "speech-$mode.yaml" "$levels"; done
    fi
fi
[[ ,$parts, != *,cap,* ]] || run serve-cap speech-cap.yaml "$cap_levels"

$py - "$out" "$cap_gb" <<'EOF'
import json
import sys
from pathlib import Path

out, cap_gb = Path(sys.argv[1]), float(sys.argv[2])


def load(name):
    p = out / f"{name}.json"
    return json.loads(p.read_text()) if p.is_file() else None


def level(rep, c):
    return next((r for r in (rep or {}).get("levels", []) if r["concurrency"] == c), None)


def gpu_mib(name):
    p = out / f"{name}.gpu.csv"
    if not p.is_file():
        return None
    rows = [line.split(",") for line in p.read_text().splitlines()[1:] if line.strip()]
    return [int(r[1].strip().split()[0]) for r in rows] or None


main, cap = load("serve"), load("serve-cap")
# STREAM_DECODES: one run per mode (serve-MODE.json), each summed up side by side
modes = {f.stem[len("serve-"):]: load(f.stem) for f in sorted(out.glob("serve-*.json"))
         if "." not in f.stem}  # not serve-MODE.health.json
modes.pop("cap", None)
one = level(main, 1) or {}
capped = level(cap, 1) or {}
summary = {
    "stream_decodes": {
        mode: {
            "date": rep.get("date"),
            "hardware": rep.get("hardware"),
            "audio_s_per_s": {r["concurrency"]: r["audio_s_per_s"] for r in rep["levels"]},
            "ttfa_ms_mean": {r["concurrency"]: r["ttfa_ms_mean"] for r in rep["levels"]},
            "failed": {r["concurrency"]: r["failed"] for r in rep["levels"]},
        }
        for mode, rep in modes.items()
    },
    "date": (main or {}).get("date"),
    "hardware": (main or {}).get("hardware"),
    "anchor": "vLLM-Omni (published): 344 audio-s/s at concurrency 128, mean TTFA 685 ms",
    "ttfa_ms_c1": {k: one.get(f"ttfa_ms_{k}") for k in ("mean", "p50", "p95")},
    "audio_s_per_s": {r["concurrency"]: r["audio_s_per_s"] for r in (main or {}).get("levels", [])},
    "failed": {r["concurrency"]: r["failed"] for r in (main or {}).get("levels", [])},
    "levels": (main or {}).get("levels"),
    "speech_batching": (main or {}).get("speech_batching"),
    "cap": {
        "gpu_memory_gb": cap_gb,
        "weights": "int8",
        "gpu_memory_cap": (cap or {}).get("gpu_memory_cap"),
        "rtf_mean_c1": capped.get("rtf_mean"),
        "ttfa_ms_c1": {k: capped.get(f"ttfa_ms_{k}") for k in ("mean", "p50", "p95")},
        "audio_s_per_s_c1": capped.get("audio_s_per_s"),
        "failed": capped.get("failed"),
        "nvidia_smi_used_mib": gpu_mib("serve-cap"),
        "levels": (cap or {}).get("levels"),
    },
}
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
EOF
if [ -n "$failed" ]; then
    echo "load generator failed for:$failed" >&2
    exit 1
fi
