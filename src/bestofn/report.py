"""Throughput report: per-stage seconds per clip, totals, and the best-of-N gain, as markdown
with PNG plots, from the DuckDB file."""

from __future__ import annotations

from pathlib import Path

import duckdb

STAGES = ["load", "generate", "restore", "score", "write", "idle"]


def _fmt(x, digits=3) -> str:
    if x is None:
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def write_report(db_path: str | Path, out_dir: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(db_path), read_only=True)
    overall = con.execute("SELECT * FROM throughput WHERE level = 'overall'").fetchdf().iloc[0]
    groups = con.execute("SELECT * FROM groups").fetchdf()
    workers = con.execute(
        "SELECT worker, slurm_job_id, groups, loads, load_s, wall_s, idle_s, idle_fraction "
        "FROM throughput WHERE level = 'worker' ORDER BY started_at"
    ).fetchall()
    clips = int(overall["clips"])

    per_clip = {s: float(overall[f"{s}_s"]) / clips for s in STAGES}
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(STAGES[::-1], [per_clip[s] for s in STAGES[::-1]], color="#4477aa")
    ax.set_xlabel("seconds per clip (summed over groups)")
    ax.set_title("Where the time goes")
    fig.tight_layout()
    fig.savefig(out_dir / "stage_seconds.png", dpi=120)
    plt.close(fig)

    gain = groups["best_minus_median"].dropna()
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.hist(gain, bins=min(30, max(5, len(gain))), color="#228833")
    ax.set_xlabel("selected score − median score of the group")
    ax.set_ylabel("groups")
    ax.set_title("Best-of-N gain")
    fig.tight_layout()
    fig.savefig(out_dir / "bestofn_gain.png", dpi=120)
    plt.close(fig)

    n_groups = len(groups)
    n_unselected = int((groups["status"] != "selected").sum())
    elapsed = float(overall["elapsed_s"] or 0.0)
    lines = [
        "# bestofn throughput report",
        "",
        f"- groups: {n_groups} ({n_groups - n_unselected} selected, "
        f"{n_unselected} with no passing take)",
        f"- clips: {clips}, audio: {float(overall['audio_s']):.1f} s",
        f"- device(s): {overall['device']}",
        f"- elapsed (first group start → last group end): {elapsed:.1f} s",
        f"- summed group wall time: {float(overall['wall_s']):.1f} s "
        f"({float(overall['wall_s_per_clip']):.3f} s/clip)",
        f"- audio seconds per wall second (summed): {float(overall['audio_s_per_wall_s']):.2f}",
        "",
        "## Seconds per clip by stage",
        "",
        "| stage | total s | s/clip |",
        "|---|---:|---:|",
        *[f"| {s} | {float(overall[f'{s}_s']):.2f} | {per_clip[s]:.4f} |" for s in STAGES],
        "",
        "`load` is model loading charged to groups (once per process that loaded models); "
        "`idle` is worker time spent waiting for the next group.",
        "",
        "![stage seconds](stage_seconds.png)",
        "",
        "## Workers",
        "",
        "One row per warm worker process (on SLURM: one per job, serving its bundle). `idle %` "
        "is the worker's time between groups, of its working + waiting time.",
        "",
        "| worker | SLURM job | groups | model loads | load s | group wall s | idle s | idle % |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {w} | {job or '–'} | {n} | {loads} | {load:.1f} | {wall:.1f} | {idle:.2f} | "
            f"{100 * (frac or 0.0):.2f} |"
            for w, job, n, loads, load, wall, idle, frac in workers
        ],
        "",
        "## Best-of-N gain",
        "",
        "Median over groups of (selected − median take score): "
        f"{_fmt(float(gain.median()) if len(gain) else None)}",
        "",
        "![best-of-N gain](bestofn_gain.png)",
        "",
    ]
    # Held-out verdicts (selection.md, the heatmap, the funnel and index.html are written too).
    from bestofn.trust_report import write_selection_report

    lines += write_selection_report(db_path, out_dir)
    if n_unselected:
        lines += ["## Groups with no passing take", ""]
        lines += [f"- {g}" for g in groups.loc[groups["status"] != "selected", "group_id"]]
        lines.append("")
    report = out_dir / "throughput.md"
    report.write_text("\n".join(lines))
    con.close()
    return report
