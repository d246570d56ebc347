"""CPU side by side of two trees' `bestofn serve`: audio-seconds per second and time to first
audio under `python -m lab.bench serve` load, the embedded piper generator on the CPU.

    .venv/bin/python docs/bench/serve_cpu_ab.py --old-src DIR [--levels 1,8] [--requests 24]
                                                [--rounds 2] [--json OUT]

``DIR`` is another tree's ``src`` (e.g. ``git worktree add /tmp/old COMMIT``: /tmp/old/src);
this checkout's ``src`` is the new side. Each side gets its own project directory under /tmp (a
speech-only config: the piper generator alone, its own worker state directory), so each server
starts its own worker from its own tree. The runs alternate, old new new old for two rounds,
one server at a time, so that a machine's load drifts over both sides alike. The load client
is this checkout's ``lab.bench serve`` for both (the same requests: streamed ``pcm``, one seed
each, a fresh connection per request). Prints one JSON object: per side and level, each run's
audio-s/s and TTFA mean, and their means.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def project(root: Path) -> Path:
    (root / "state").mkdir(parents=True)
    (root / "emotions.tsv").write_text("emotion\tdescription\ncalm\tA calm voice.\n")
    (root / "prompts.tsv").write_text("prompt_id\ttext\np1\tHello.\n")
    config = {
        "emotions": "emotions.tsv", "prompts": "prompts.tsv", "results": "results",
        "takes": 1, "device": "cpu", "max_words": 60,
        "models": {"generator": {"backend": "piper"}},
        "runtime": {"idle_timeout_s": 900, "state_dir": str(root / "state")},
        "selection": {"filter": "true", "score": "0"},
    }  # fmt: skip
    (root / "speech.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def run_side(src: Path, root: Path, args, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bestofn.cli", "serve", "--port", "0", "--config", "speech.yaml"],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if "listening on" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(120):
            raise SystemExit(f"{src}: the server did not start:\n{''.join(lines)}")
        line = next(x for x in lines if "listening on" in x)
        url = line.split("listening on ")[1].split()[0]
        client_env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'src'}"}
        bench = subprocess.run(
            [sys.executable, "-m", "lab.bench", "serve", "--url", url, "--concurrency",
             args.levels, "--requests", str(args.requests), "--json", str(out)],
            cwd=REPO, env=client_env, capture_output=True, text=True, timeout=3600,
        )  # fmt: skip
        if bench.returncode != 0 or not out.is_file():
            raise SystemExit(f"{src}: the bench failed:\n{bench.stdout}\n{bench.stderr}")
        return json.loads(out.read_text())
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        subprocess.run(
            [sys.executable, "-m", "bestofn.cli", "workers", "stop", "--state-dir",
             str(root / "state")], cwd=root, env=env, capture_output=True, timeout=120,
        )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-src", required=True, type=Path, help="the other tree's src/")
    ap.add_argument("--levels", default="1,8", help="concurrency levels (comma-separated)")
    ap.add_argument("--requests", type=int, default=24, help="requests per level")
    ap.add_argument("--rounds", type=int, default=2, help="old new new old, this many times")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    sides = {"old": args.old_src.resolve(), "new": (REPO / "src").resolve()}
    work = Path(tempfile.mkdtemp(prefix="bestofn-serve-ab-"))
    try:
        roots = {name: project(work / name) for name in sides}
        runs: dict[str, list[dict]] = {name: [] for name in sides}
        order = ["old", "new", "new", "old"] * args.rounds
        for i, name in enumerate(order):
            report = run_side(sides[name], roots[name], args, work / f"{i}-{name}.json")
            runs[name].append(report)
            print(f"run {i + 1}/{len(order)} {name}: " + ", ".join(
                f"c{r['concurrency']} {r['audio_s_per_s']} audio-s/s, TTFA {r['ttfa_ms_mean']} ms"
                for r in report["levels"]), file=sys.stderr, flush=True)  # fmt: skip
        summary = {"command": "python docs/bench/serve_cpu_ab.py " + " ".join(argv or sys.argv[1:]),
                   "hardware": runs["new"][0]["hardware"], "date": runs["new"][0]["date"],
                   "order": order, "sides": {k: str(v) for k, v in sides.items()},
                   "levels": {}}  # fmt: skip
        for level in [int(c) for c in args.levels.split(",")]:
            row = {}
            for name in sides:
                rows = [next(r for r in rep["levels"] if r["concurrency"] == level)
                        for rep in runs[name]]  # fmt: skip
                tput = [r["audio_s_per_s"] for r in rows]
                ttfa = [r["ttfa_ms_mean"] for r in rows]
                row[name] = {"audio_s_per_s": tput, "ttfa_ms_mean": ttfa,
                             "mean_audio_s_per_s": round(statistics.fmean(tput), 2),
                             "mean_ttfa_ms": round(statistics.fmean(ttfa), 1),
                             "failed": sum(r["failed"] for r in rows)}  # fmt: skip
            summary["levels"][level] = row
        text = json.dumps(summary)
        print(text)
        if args.json:
            args.json.write_text(text + "\n")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
