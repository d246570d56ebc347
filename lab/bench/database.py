"""`python -m lab.bench database`: the final rules (database, report) over synthetic groups.

Synthetic groups carry every production scorer's columns as the backends declare them
(duration, Parakeet, VoiceCLAP, Empathic-Insight widened to ``--ei-heads`` heads: 43 by default,
about 55 score columns in all) beside the base columns every scores.parquet has, in the real
layout ``OUT/results/groups/{emotion}/{prompt_id}/scores.parquet`` (no FLACs: neither rule reads
them). Values are random but shaped like a run's: group-level offsets, ~5 % truncated takes, a
few empty ones, provenance strings of a real row's length.

Then the product's own ``bestofn.select.database.build_database`` and
``bestofn.report.throughput.write_report``
run, each in a fresh Python process (as Snakemake's ``script:`` runs them), and their wall time
and peak RSS (``wait4``'s ``ru_maxrss`` of that process) are printed and written as JSON:

    python -m lab.bench database --groups 4000 --takes 64 --out /tmp/db4k --json r.json

``--reuse`` keeps already written groups (the generator is deterministic in ``--seed``), so a
before/after comparison runs both trees over the same files."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# The production selection (config/recipes/base.yaml) with its wer clause held out instead:
# a held-out column may not appear in the filter or the score.
FILTER = "cer <= 0.1 AND NOT truncated AND stop_reason = 'eos'"
SCORE = "vc_genuineness / 6 + vc_prompt_sim - cer"
HELD_OUT = ["wer"]
EMOTIONS = ("angry", "calm", "happy", "sad", "fearful", "surprised", "disgusted", "neutral")
SCORER_CLASSES = (
    "bestofn.backends.duration:DurationScorer",
    "bestofn.backends.parakeet:ParakeetScorer",
    "bestofn.backends.voiceclap:VoiceCLAPScorer",
)


def _declared_columns() -> dict[str, str]:
    import importlib

    out: dict[str, str] = {}
    for target in SCORER_CLASSES:
        module, _, name = target.partition(":")
        out.update(getattr(importlib.import_module(module), name).columns)
    return out


def ei_columns(n_heads: int) -> list[str]:
    """Empathic-Insight columns as the scorer names them (``ei_`` + the head file's name)."""
    from bestofn.backends.empathic import column_name
    from bestofn.fakes.empathic import head_names

    emotion, quality = head_names(max(0, n_heads - 4), min(4, n_heads))
    return [column_name(n, "ei_") for n in [*emotion, *quality]]


def schema(n_heads: int = 43):
    """The arrow schema of a synthetic scores.parquet: base columns, then the scorers'."""
    import pyarrow as pa

    from bestofn.select.base import BASE_COLUMNS

    arrow = {
        "VARCHAR": pa.string(),
        "INTEGER": pa.int32(),
        "BIGINT": pa.int64(),
        "DOUBLE": pa.float64(),
        "BOOLEAN": pa.bool_(),
        "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
    }
    cols = dict(BASE_COLUMNS) | _declared_columns() | dict.fromkeys(ei_columns(n_heads), "DOUBLE")
    return pa.schema([(c, arrow[t]) for c, t in cols.items()])


_MODELS = json.dumps(  # a provenance string of a real row's size (~1.5 kB)
    {
        "generator": {"backend": "moss-fast", "model_dir": "/models/MOSS-TTS-Local-v1.5",
                      "sha256": "0" * 64, "dtype": "bfloat16", "decode_attention": "splitk",
                      "local_attention": "reduce", "temperature": 1.0, "top_p": 0.95,
                      "top_k": 50, "max_frames": 1500},
        "restorer": {"backend": "sidon", "model_dir": "/models/sidon", "sha256": "1" * 64},
        "scorers": [{"backend": b, "path": f"/models/{b}", "sha256": str(i) * 64}
                    for i, b in enumerate(("duration", "parakeet", "voiceclap", "empathic"))],
    }
)  # fmt: skip


def group_table(schema_, emotion: str, prompt_id: str, takes: int, rng, base_ts: float):
    """One group's rows, like a worker writes them."""
    import pyarrow as pa

    n = takes
    gid = f"{emotion}/{prompt_id}"
    text = (
        f"Synthetic line {prompt_id} spoken {emotion}ly for the database benchmark, twelve words."
    )
    group_dir = f"results/groups/{emotion}/{prompt_id}"
    level = rng.normal(0, 1)
    stop = rng.choice(["eos", "budget", "empty"], n, p=[0.93, 0.05, 0.02])
    wer = np.clip(rng.exponential(0.05 + 0.05 * abs(level), n), 0, 2)
    wer[rng.random(n) < 0.4] = 0.0
    t0 = base_ts + rng.uniform(0, 1e5)
    gen_s, res_s, score_s, write_s = rng.uniform(0.5, 2.0, 4)
    wall = gen_s + res_s + score_s + write_s
    values = {
        "group_id": [gid] * n,
        "emotion": [emotion] * n,
        "prompt_id": [prompt_id] * n,
        "take": np.arange(n, dtype=np.int32),
        "seed": rng.integers(0, 2**62, n),
        "text": [text] * n,
        "flac_path": [f"{group_dir}/takes/{i:03d}.flac" for i in range(n)],
        "duration_s": rng.uniform(1.0, 9.0, n),
        "sample_rate": np.full(n, 48000, np.int32),
        "channels": np.full(n, 2, np.int32),
        "n_frames": rng.integers(10, 1500, n).astype(np.int32),
        "truncated": stop == "budget",
        "stop_reason": stop,
        "reference_audio": ["config/voices/ref.wav"] * n,
        "generator": ["moss-fast"] * n,
        "models": [_MODELS] * n,
        "models_hash": ["a" * 16] * n,
        "spec_hash": [hashlib.blake2b(gid.encode(), digest_size=8).hexdigest()] * n,
        "bestofn_version": ["0.1.0"] * n,
        "host": ["bench-host"] * n,
        "group_generate_s": np.full(n, gen_s),
        "group_restore_s": np.full(n, res_s),
        "group_score_s": np.full(n, score_s),
        "group_load_s": np.zeros(n),
        "worker_idle_s": np.full(n, rng.uniform(0, 0.05)),
        "score_seconds": [json.dumps({"parakeet": 0.3, "voiceclap": 0.2, "empathic": 0.5})] * n,
        "device": ["cuda:0 NVIDIA H200"] * n,
        "worker_slot": np.zeros(n, np.int32),
        "worker_pid": np.full(n, 4242, np.int64),
        "slurm_job_id": [""] * n,
        "started_at": np.full(n, int(t0 * 1e6)),
        "group_write_s": np.full(n, write_s),
        "group_wall_s": np.full(n, wall),
        "finished_at": np.full(n, int((t0 + wall) * 1e6)),
        "group_generate_gpu_s": np.full(n, gen_s * 0.9),
        "group_restore_gpu_s": np.full(n, res_s * 0.9),
        "group_score_gpu_s": np.full(n, score_s * 0.9),
        "score_gpu_seconds": [json.dumps({"parakeet": 0.25, "voiceclap": 0.15})] * n,
        "overlap": ["full"] * n,
        "words_per_s": rng.uniform(1.5, 4.0, n),
        "n_words": np.full(n, 12, np.int64),
        "transcript": [text.lower()] * n,
        "wer": wer,
        "cer": np.clip(wer * rng.uniform(0.3, 0.8, n), 0, 2),
        "vc_genuineness": rng.normal(3 + 0.5 * level, 1.0, n),
        "vc_blend": rng.normal(0, 1, n),
        "vc_prompt_sim": rng.uniform(0.2, 0.9, n),
    }
    arrays = []
    for field in schema_:
        v = values.get(field.name)
        if v is None:  # an Empathic-Insight head
            v = rng.normal(level, 1.0, n)
        arrays.append(pa.array(v, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema_)


def group_names(groups: int) -> list[tuple[str, str]]:
    return [(EMOTIONS[i % len(EMOTIONS)], f"p{i // len(EMOTIONS):06d}") for i in range(groups)]


def write_groups(results: Path, groups: int, takes: int, seed: int, n_heads: int, reuse: bool):
    """Write the synthetic groups; returns the parquet paths (in group order)."""
    import pyarrow.parquet as pq

    schema_ = schema(n_heads)
    base_ts = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC).timestamp()
    paths = []
    for i, (emotion, prompt_id) in enumerate(group_names(groups)):
        path = results / "groups" / emotion / prompt_id / "scores.parquet"
        paths.append(path)
        if reuse and path.is_file():
            continue
        rng = np.random.default_rng([seed, i])
        table = group_table(schema_, emotion, prompt_id, takes, rng, base_ts)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        pq.write_table(table, tmp)
        tmp.replace(path)
    return paths


# self_peak_rss_mib: the rule's process; children_peak_rss_mib: the largest process it started
# (the report's selection half); wait4's peak_rss_mib is the larger of the two, not their sum.
_CHILD = r"""
import json, resource, sys, time
args = json.loads(open(sys.argv[1]).read())
t0 = time.perf_counter()
if args["phase"] == "database":
    from bestofn.select.database import build_database
    out = build_database(**args["kwargs"])
else:
    from bestofn.report.throughput import write_report
    out = str(write_report(**args["kwargs"]))
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("BENCH_RESULT", json.dumps({"inner_s": time.perf_counter() - t0, "result": out,
                                  "self_peak_rss_mib": own, "children_peak_rss_mib": children}))
"""


def run_phase(
    phase: str, kwargs: dict, cwd: Path, profile: Path | None = None, pythonpath: str = ""
) -> dict:
    """Run one rule's library call in a fresh process; wall s, peak RSS (MiB), its answer.
    ``pythonpath`` runs another tree's library (the before side of a comparison)."""
    job = cwd / f".bench-{phase}.json"  # a file: 100k paths do not fit on a command line
    job.write_text(json.dumps({"phase": phase, "kwargs": kwargs}))
    cmd = [sys.executable, "-c", _CHILD, str(job)]
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    if profile is not None:
        cmd = ["py-spy", "record", "-r", "50", "-f", "speedscope", "-o", str(profile), "--", *cmd]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, text=True, env=env)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{phase} failed (exit {proc.returncode})")
    # after the last marker: DuckDB's progress bar may share the line
    answer = json.loads(out.rpartition("BENCH_RESULT ")[2].splitlines()[0])
    # CPU seconds beside the wall: on a shared machine the wall follows the neighbours' load
    cpu = usage.ru_utime + usage.ru_stime
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mib": usage.ru_maxrss / 1024, **answer}


def database_kwargs(results: Path, paths: list[Path], args) -> dict:
    kwargs = dict(
        parquets=[str(p.relative_to(results.parent)) for p in paths],
        db_path=str((results / "bestofn.duckdb").relative_to(results.parent)),
        filter_sql=args.filter,
        score_sql=args.score,
        held_out=args.held_out,
        seed=0,
    )
    if args.directions:  # as the workflow hands them over (held_out.scorer_directions)
        from bestofn.select.held_out import scorer_directions

        scorers = [*SCORER_CLASSES, "bestofn.backends.empathic:EmpathicInsightScorer"]
        kwargs["directions"] = scorer_directions({"scorers": [{"backend": b} for b in scorers]})
    return kwargs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.bench database", description=__doc__)
    p.add_argument("--groups", type=int, default=200)
    p.add_argument("--takes", type=int, default=64)
    p.add_argument("--ei-heads", type=int, default=43)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="project folder (results/ inside)")
    p.add_argument("--reuse", action="store_true", help="keep groups already written")
    p.add_argument("--filter", default=FILTER)
    p.add_argument("--score", default=SCORE)
    p.add_argument("--held-out", nargs="*", default=HELD_OUT)
    p.add_argument("--phases", default="database,report")
    p.add_argument("--profile", type=Path, help="py-spy speedscope files into this folder")
    p.add_argument("--json", type=Path)
    p.add_argument("--pythonpath", default="", help="run the rules from this source tree")
    p.add_argument("--label", default="")
    p.add_argument(
        "--no-directions",
        dest="directions",
        action="store_false",
        help="do not pass the scorers' declared directions (selection as before they had any)",
    )
    args = p.parse_args(argv)
    results = args.out / "results"
    t0 = time.perf_counter()
    paths = write_groups(results, args.groups, args.takes, args.seed, args.ei_heads, args.reuse)
    write_s = time.perf_counter() - t0
    row = {
        "bench": "database",
        "label": args.label,
        "groups": args.groups,
        "takes_per_group": args.takes,
        "takes": args.groups * args.takes,
        "columns": len(schema(args.ei_heads)),
        "write_groups_s": round(write_s, 2),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        # the machine's load beside the timings (a shared machine: neighbours move the wall)
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
    print(f"{args.groups} groups x {args.takes} takes, {row['columns']} columns "
          f"(written/checked in {write_s:.1f} s)", flush=True)  # fmt: skip
    phases = [s for s in args.phases.split(",") if s]
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    total = 0.0
    for phase in phases:
        kwargs = (
            database_kwargs(results, paths, args)
            if phase == "database"
            else dict(db_path="results/bestofn.duckdb", out_dir="results/report")
        )
        prof = args.profile / f"{phase}-{args.groups}.json" if args.profile else None
        r = run_phase(phase, kwargs, args.out, prof, args.pythonpath)
        total += r["wall_s"]
        row[phase] = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}
        print(
            f"{phase}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, "
            f"peak RSS {r['peak_rss_mib']:.0f} MiB",
            flush=True,
        )
    row["total_s"] = round(total, 2)
    row["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"total: {total:.1f} s")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
