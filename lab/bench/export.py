"""`python -m lab.bench export`: `bestofn export` over synthetic groups, per format and
``--which``, each export in a child process (its wall time and peak RSS), then an incremental
re-export after more groups finished.

The synthetic results are what the workflow writes: ``groups/{emotion}/{prompt}/takes/*.flac``
(speech-like 48 kHz stereo PCM_16 by default, from ``bench.scorers.clips``) and a DuckDB built
by the product's ``build_database``. The takes' FLACs are hard links of ``--distinct`` files,
so the sources are read from the page cache: cold-disk reads are not in the figures. The export
writes (and fsyncs) its own files as it would."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf

from bestofn.select.base import BASE_COLUMNS

ARROW_TYPES = {
    "VARCHAR": pa.string(), "DOUBLE": pa.float64(), "INTEGER": pa.int32(),
    "BIGINT": pa.int64(), "BOOLEAN": pa.bool_(), "TIMESTAMPTZ": pa.timestamp("us", "UTC"),
}  # fmt: skip
FILTER, SCORE = "wer <= 0.1", "dnsmos_ovrl + 2 * speaker_sim - wer"


def make_results(root: Path, groups: int, takes: int, seconds: float, rate: int, channels: int,
                 distinct: int) -> Path:  # fmt: skip
    """Synthetic results: ``groups`` groups of ``takes`` takes (all passing the filter)."""
    from lab.bench.scorers import clips

    results = root / "results"
    base = root / "base"
    base.mkdir(parents=True)
    files = []
    for k in range(distinct):  # lengths from `seconds` to 1.25 x `seconds`
        (mono,) = clips(1, seconds * (1 + k / (4 * distinct)), rate, seed=k)
        audio = np.stack([mono] * channels, axis=1) if channels > 1 else mono
        sf.write(base / f"{k}.flac", audio, rate, format="FLAC", subtype="PCM_16")
        files.append((base / f"{k}.flac", len(mono)))
    rng = np.random.default_rng(0)
    n = groups * takes
    names = ("group_id", "emotion", "prompt_id", "take", "flac_path", "duration_s", "finished_at")
    cols: dict[str, list] = {c: [] for c in names}
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    for g in range(groups):
        emotion, prompt = f"emotion{g % 8}", f"prompt{g // 8:05d}"
        gid = f"{emotion}/{prompt}"
        tdir = results / "groups" / gid / "takes"
        tdir.mkdir(parents=True)
        for t in range(takes):
            src, frames = files[(g + t) % distinct]
            os.link(src, tdir / f"{t:03d}.flac")
            cols["group_id"].append(gid)
            cols["emotion"].append(emotion)
            cols["prompt_id"].append(prompt)
            cols["take"].append(t)
            cols["flac_path"].append(f"results/groups/{gid}/takes/{t:03d}.flac")
            cols["duration_s"].append(frames / rate)
            cols["finished_at"].append(start + datetime.timedelta(seconds=g))
    table = pa.table({
        **cols,
        "take": pa.array(cols["take"], pa.int32()),
        "seed": pa.array(rng.integers(0, 2**62, n), pa.int64()),
        "text": pa.array([f"Synthetic line {i}." for i in range(n)]),
        "sample_rate": pa.array([rate] * n, pa.int32()),
        "channels": pa.array([channels] * n, pa.int32()),
        "wer": rng.uniform(0, 0.1, n),
        "dnsmos_ovrl": rng.uniform(2, 4, n),
        "speaker_sim": rng.uniform(0.5, 1, n),
        "generator": ["synthetic"] * n,
        "models": ['{"generator": {"backend": "synthetic"}}'] * n,
        "models_hash": ["0000000000000000"] * n,
        "spec_hash": [f"{i:016x}" for i in range(n)],
        "bestofn_version": ["bench"] * n,
        "device": ["cpu"] * n,
    })  # fmt: skip
    for name, sql_type in BASE_COLUMNS.items():  # the rest of a scores.parquet row: NULL
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(n, ARROW_TYPES[sql_type]))
    pq.write_table(table, root / "takes.parquet")
    return results


def build_db(root: Path, results: Path, groups: int | None = None) -> None:
    """The database of every group, or of the first ``groups`` to finish."""
    from bestofn.select.database import build_database

    src = root / "takes.parquet"
    if groups is not None:
        t = pq.read_table(src)
        ids = list(dict.fromkeys(t.column("group_id").to_pylist()))[:groups]
        src = root / "takes_part.parquet"
        pq.write_table(t.filter(pa.compute.is_in(t.column("group_id"), pa.array(ids))), src)
    build_database([src], results / "bestofn.duckdb", FILTER, SCORE)


def one_export(results: Path, out: Path, fmt: str, which: str, overwrite: bool) -> dict:
    """One export in a child process: wall time, peak RSS and its summary line."""
    code = (
        "import sys, json; from bestofn.export import ExportSettings, export_results\n"
        "from bestofn.schemas import apply_defaults\n"
        "cfg = apply_defaults({'export': {}})['export']\n"
        f"s = ExportSettings.from_config(cfg, format={fmt!r}, out={str(out)!r}, which={which!r}, "
        f"overwrite={overwrite})\n"
        f"r = export_results({str(results)!r}, s, {{'filter': {FILTER!r}, 'score': {SCORE!r}}})\n"
        "d = dict(rows=r.rows, written=r.written, reused=r.reused, export_s=round(r.seconds, 2))\n"
        "print('SUMMARY ' + json.dumps(d))\n"
    )
    load = os.getloadavg()[0]  # the box is shared: how busy it was as this export started
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    out_text = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"export {fmt} {which} failed:\n{out_text}")
    summary = json.loads(out_text.split("SUMMARY ", 1)[1])
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return dict(format=fmt, which=which, overwrite=overwrite, wall_s=round(wall, 2),
                takes_per_s=round(summary["rows"] / summary["export_s"], 1),
                cpu_s=round(usage.ru_utime + usage.ru_stime, 2),
                peak_rss_mb=usage.ru_maxrss // 1024,
                export_mb=round(size / 2**20, 1), load_1min=round(load, 1), **summary)  # fmt: skip


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.bench export", description=__doc__)
    ap.add_argument("--dir", required=True, help="scratch directory (emptied)")
    ap.add_argument("--out", help="write export_bench.json here")
    ap.add_argument("--groups", type=int, default=4000)
    ap.add_argument("--takes", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=1.0, help="take length")
    ap.add_argument("--rate", type=int, default=48000)
    ap.add_argument("--channels", type=int, default=2)
    ap.add_argument("--distinct", type=int, default=16, help="distinct FLAC files")
    ap.add_argument("--formats", default="hf,webdataset,lhotse,nemo")
    ap.add_argument("--which", default="selected,passing")
    ap.add_argument("--added", type=int, default=40, help="groups finished before a re-export")
    ap.add_argument("--keep", action="store_true", help="keep the exports")
    args = ap.parse_args(argv)
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    results = make_results(root, args.groups, args.takes, args.seconds, args.rate,
                           args.channels, args.distinct)  # fmt: skip
    build_db(root, results)
    print(f"synthetic results: {args.groups} groups x {args.takes} takes in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
    rows = []

    def run(fmt, which, overwrite=False, **extra):
        out = root / f"export-{fmt}-{which}"
        rows.append(dict(one_export(results, out, fmt, which, overwrite), **extra))
        print(json.dumps(rows[-1]), flush=True)
        return out

    for which in args.which.split(","):
        for fmt in args.formats.split(","):
            out = run(fmt, which)
            if not args.keep:
                shutil.rmtree(out)
    if args.added:  # re-export after `added` more groups finished (the first format, passing)
        fmt = args.formats.split(",")[0]
        build_db(root, results, args.groups - args.added)
        run(fmt, "passing", groups=f"first {args.groups - args.added}")
        build_db(root, results)
        run(fmt, "passing", overwrite=True, groups=f"all {args.groups} (re-export)")
    # the rate past the fixed cost (Python and the format's library starting, the queries):
    # between the selected and the passing export of each format
    for fmt in args.formats.split(","):
        pair = {r["which"]: r for r in rows if r["format"] == fmt and "groups" not in r}
        if {"selected", "passing"} <= pair.keys():
            a, b = pair["selected"], pair["passing"]
            rate = (b["rows"] - a["rows"]) / max(b["export_s"] - a["export_s"], 1e-9)
            cpu = (b["cpu_s"] - a["cpu_s"]) / max(b["rows"] - a["rows"], 1)
            rows.append(dict(format=fmt, marginal_takes_per_s=round(rate, 1),
                             marginal_cpu_ms_per_take=round(1000 * cpu, 3)))  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    load = os.getloadavg()
    doc = dict(
        command="python -m lab.bench export " + " ".join(argv),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        host=platform.node(), cpus=os.cpu_count(), python=platform.python_version(),
        load_average_at_end=[round(x, 1) for x in load],
        settings=vars(args), rows=rows,
    )  # fmt: skip
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "export_bench.json").write_text(json.dumps(doc, indent=1) + "\n")
    if not args.keep:
        shutil.rmtree(root)
    return 0
