"""Throughput report: per-stage seconds per clip, totals, and the best-of-N gain, as markdown
with PNG plots, from the DuckDB file."""

from __future__ import annotations

from pathlib import Path

import duckdb

from bestofn.report.fresh_process import FreshProcess
from bestofn.select.database import open_read_only

STAGES = ["load", "generate", "restore", "score", "write", "idle"]
UNSELECTED_LISTED = 200  # groups with no passing take named in throughput.md at most
# The selection half's bound: it reads per-group tables and the takes of at most
# bestofn.report.listen.MAX_GROUPS groups, and the database and report rules over 4M takes took
# 415 s together; a child with no answer after this is stuck, and the rule fails saying so.
SELECTION_TIMEOUT_S = 1800


def _fmt(x, digits=3) -> str:
    if x is None:
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def gain_histogram(gain):
    """Histogram of per-group gains; its y axis counts groups, so its ticks are integers."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.hist(gain, bins=min(30, max(5, len(gain))), color="#228833")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("selected score − median score of the group")
    ax.set_ylabel("groups")
    ax.set_title("Best-of-N gain")
    fig.tight_layout()
    return fig


def score_gains(con) -> list[tuple]:
    """(column, emotion or None for all, better, selected − median, best − median) from the
    ``score_gains`` view (bestofn.select.trust), score first; empty for a database without it."""
    try:
        return con.execute(
            "SELECT column_name, emotion, better, selected_minus_median, best_minus_median "
            "FROM score_gains ORDER BY column_name <> 'score', column_name, emotion NULLS LAST"
        ).fetchall()
    except duckdb.CatalogException:
        return []


def _signed(x: float) -> str:
    text = f"{x:+.3f}"
    return "+0.000" if text == "-0.000" else text


def score_gain_table(rows: list[tuple]) -> list[str]:
    """Markdown: one row per score column, one column per emotion and 'all'; each cell the mean
    over selected groups of (selected take − group median)."""
    emotions = sorted({e for _, e, *_ in rows if e is not None})
    cell = {(c, e): v for c, e, _, v, _ in rows}
    better = {c: b for c, _, b, *_ in rows}
    head = ["column", "better", *emotions, "all"]
    out = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(emotions) + 1)]
    for col in dict.fromkeys(c for c, *_ in rows):
        vals = [cell.get((col, e)) for e in [*emotions, None]]
        out.append(
            f"| {col} | {better[col] or '–'} | "
            + " | ".join("–" if v is None else _signed(v) for v in vals)
            + " |"
        )
    return out


# Panels of the gain plot at most (the table in throughput.md has every column): 24 panels
# took ~2.5 s to draw, most of the fixed cost of a report.
GAIN_PANELS = 12


def gain_plot_columns(rows: list[tuple]) -> list[str]:
    """The columns the gain plot shows: the composite first, then those with a direction,
    then the rest, at most GAIN_PANELS (a plot of 55 panels is unreadable and slow to draw)."""
    cols = list(dict.fromkeys(c for c, *_ in rows))
    better = {c: b for c, _, b, *_ in rows}
    ranked = sorted(cols, key=lambda c: (c != "score", better.get(c) is None))
    keep = set(ranked[:GAIN_PANELS])
    return [c for c in cols if c in keep]


def score_gain_plot(rows: list[tuple]):
    """One panel per score column (gain_plot_columns): selected − median per emotion (bars,
    green where selection moved it the better way, red the worse way, grey where the
    direction is unknown) and best − median (black ticks: what the best take of each group
    would have given)."""
    import matplotlib.pyplot as plt

    cols = gain_plot_columns(rows)
    emotions = sorted({e for _, e, *_ in rows if e is not None})
    labels = [*emotions, "all"]
    by = {(c, e or "all"): (b, sel, best) for c, e, b, sel, best in rows}
    ncols = min(4, max(1, len(cols)))
    nrows = -(-len(cols) // ncols) if cols else 1
    # One y axis for all panels (the same emotions): labels drawn once per row of panels,
    # which halves the plot's drawing time.
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(3.2 * ncols, 0.35 * len(labels) * nrows + 1.2), squeeze=False,
        sharey=True,
    )  # fmt: skip
    y = range(len(labels))
    axes[0, 0].set_yticks(list(y), labels)
    axes[0, 0].invert_yaxis()  # shared: once for all
    for ax in axes.flat[len(cols) :]:
        ax.axis("off")
    for ax, col in zip(axes.flat, cols, strict=False):
        sel = [by.get((col, e), (None, None, None))[1] for e in labels]
        best = [by.get((col, e), (None, None, None))[2] for e in labels]
        better = by.get((col, "all"), (None,))[0]
        sign = {"higher": 1, "lower": -1}.get(better or "", 0)
        colors = [
            "#999999" if not sign or v is None else ("#228833" if v * sign >= 0 else "#cc3311")
            for v in sel
        ]
        ax.barh(y, [v or 0.0 for v in sel], color=colors)
        ticks = [(v, i) for i, v in enumerate(best) if v is not None]
        if ticks:
            ax.scatter(*zip(*ticks, strict=True), marker="|", color="black", s=80, zorder=3)
        ax.axvline(0, color="black", lw=0.6)
        ax.set_title(f"{col} ({better or 'direction unknown'})", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        ax.tick_params(axis="y", labelsize=8)
    fig.suptitle("Selected take − group median per emotion (tick: best take − median)", fontsize=10)
    fig.subplots_adjust(left=0.12, right=0.98, bottom=0.04, top=0.94, wspace=0.6, hspace=0.6)
    return fig


GPU_STAGES = ["generate", "restore", "score"]


def gpu_busy_rows(con) -> list[tuple]:
    """(worker, overlap, elapsed s, clips, generate/restore/score GPU s, busy fraction) per
    worker that recorded GPU time (CUDA workers; a database without the columns gives [])."""
    try:
        return con.execute(
            "SELECT worker, overlap, elapsed_s, clips, generate_gpu_s, restore_gpu_s, "
            "score_gpu_s, gpu_busy_fraction FROM throughput "
            "WHERE level = 'worker' AND gpu_busy_s IS NOT NULL ORDER BY started_at"
        ).fetchall()
    except duckdb.BinderException:
        return []


def gpu_busy_table(rows: list[tuple]) -> list[str]:
    """Markdown: GPU seconds per clip by stage and the GPU's busy share, per CUDA worker."""
    if not rows:
        return []
    out = [
        "## GPU time by stage",
        "",
        "Per CUDA worker: the GPU time of each stage (CUDA events on the stage's stream), per "
        "clip, and the GPU's busy share of the worker's elapsed time (first group start to "
        "last group end). `overlap` says how the worker overlapped groups (runtime.overlap): "
        "with `host` the next group's GPU stages run while one is written; with `full` the "
        "GPU stages of three groups run at once (generate, restore, score), so stages can add "
        "up to more than the elapsed time.",
        "",
        "| worker | overlap | clips | generate s/clip | restore s/clip | score s/clip "
        "| GPU busy s/clip | GPU busy % |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for worker, overlap, _elapsed, clips, gen, rest, score, frac in rows:
        busy = (gen + rest + score) / clips
        pct = _fmt(None if frac is None else 100 * frac, 1)
        out.append(
            f"| {worker} | {overlap or '–'} | {clips} | {gen / clips:.4f} | {rest / clips:.4f} | "
            f"{score / clips:.4f} | {busy:.4f} | {pct} |"
        )
    return [*out, ""]


def write_report(db_path: str | Path, out_dir: str | Path, database: dict | None = None) -> Path:
    """The report's files in ``out_dir``; ``database``: the config's ``database:`` settings
    (DuckDB's memory limit and threads; None: the schema's defaults).

    The selection report (bestofn.report.trust: selection.md, its plots, the listening page)
    is written by another process meanwhile (bestofn.report.fresh_process): each half is ~half
    the report's fixed cost, mostly matplotlib (measured at 12 groups), so the two use two
    cores. Only that half reads the takes (the listening page); this one reads per-group
    tables."""
    from bestofn.report.trust import write_selection_report

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Started before matplotlib is imported here: the child's imports overlap this one's.
    with FreshProcess(
        write_selection_report, str(db_path), str(out_dir), database,
        timeout_s=SELECTION_TIMEOUT_S, label="the selection report's process",
    ) as selection:  # fmt: skip
        con = open_read_only(db_path, database)
        try:
            lines, n_unselected = _throughput_lines(con, out_dir)
            # Held-out verdicts (selection.md, the heatmap, the funnel and index.html are
            # written too).
            lines += selection.result()
            lines += _unselected_lines(con, n_unselected)
        finally:
            con.close()
    report = out_dir / "throughput.md"
    report.write_text("\n".join(lines))
    return report


def _throughput_lines(con, out_dir: Path) -> tuple[list[str], int]:
    """The throughput half: its plots in ``out_dir``, its lines of throughput.md, and the
    number of groups with no passing take."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one row as a dict (no pandas: its import alone is ~0.5 s of a report that has ~2 s)
    cur = con.execute("SELECT * FROM throughput WHERE level = 'overall'")
    overall = dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))

    def num(key: str) -> float:  # NULL reads as NaN, as the data frame read it
        return float("nan") if overall[key] is None else float(overall[key])

    # Per-group values only as one column of numbers; counts and lists come from SQL, so the
    # report's memory and size do not follow the run's.
    n_groups, n_unselected = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE status <> 'selected') FROM groups"
    ).fetchone()
    workers = con.execute(
        "SELECT worker, slurm_job_id, groups, loads, load_s, wall_s, idle_s, idle_fraction "
        "FROM throughput WHERE level = 'worker' ORDER BY started_at"
    ).fetchall()
    gpu_rows = gpu_busy_rows(con)
    clips = int(overall["clips"])

    per_clip = {s: num(f"{s}_s") / clips for s in STAGES}
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(STAGES[::-1], [per_clip[s] for s in STAGES[::-1]], color="#4477aa")
    ax.set_xlabel("seconds per clip (summed over groups)")
    ax.set_title("Where the time goes")
    fig.tight_layout()
    fig.savefig(out_dir / "stage_seconds.png", dpi=120)
    plt.close(fig)

    import numpy as np

    gain = con.sql("SELECT best_minus_median FROM groups WHERE best_minus_median IS NOT NULL")
    gain = np.asarray(gain.fetchnumpy()["best_minus_median"], dtype=float)
    fig = gain_histogram(gain)
    fig.savefig(out_dir / "bestofn_gain.png", dpi=120)
    plt.close(fig)

    gains = score_gains(con)
    fig = score_gain_plot(gains)
    fig.savefig(out_dir / "gain_by_score.png", dpi=100)
    plt.close(fig)

    from bestofn.report import best_of_k

    curve_lines = best_of_k.write(con, out_dir)
    elapsed = float(overall["elapsed_s"] or 0.0)
    lines = [
        "# bestofn throughput report",
        "",
        f"- groups: {n_groups} ({n_groups - n_unselected} selected, "
        f"{n_unselected} with no passing take)",
        f"- clips: {clips}, audio: {num('audio_s'):.1f} s",
        f"- device(s): {overall['device']}",
        f"- elapsed (first group start → last group end): {elapsed:.1f} s",
        f"- summed group wall time: {num('wall_s'):.1f} s ({num('wall_s_per_clip'):.3f} s/clip)",
        f"- audio seconds per wall second (summed): {num('audio_s_per_wall_s'):.2f}",
        "",
        "## Seconds per clip by stage",
        "",
        "| stage | total s | s/clip |",
        "|---|---:|---:|",
        *[f"| {s} | {num(f'{s}_s'):.2f} | {per_clip[s]:.4f} |" for s in STAGES],
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
        *gpu_busy_table(gpu_rows),
        "## Best-of-N gain",
        "",
        "Median over groups of (selected − median take score): "
        f"{_fmt(float(np.median(gain)) if len(gain) else None)}",
        "",
        "![best-of-N gain](bestofn_gain.png)",
        "",
        "### Gain of every score, per emotion",
        "",
        "Mean over groups with a selected take of (selected take − the group's median take), "
        "for every numeric take column and the composite `score`; `better` says which way is "
        "better where bestofn knows it (for `wer`, a negative gain is an improvement).",
        "",
        *score_gain_table(gains),
        "",
        "![gain of every score](gain_by_score.png)",
        "",
        *curve_lines,
    ]
    return lines, n_unselected


def _unselected_lines(con, n_unselected: int) -> list[str]:
    """throughput.md's list of the groups with no passing take (at most UNSELECTED_LISTED)."""
    if not n_unselected:
        return []
    lines = ["## Groups with no passing take", ""]
    listed = con.execute(
        "SELECT group_id FROM groups WHERE status <> 'selected' ORDER BY group_id LIMIT ?",
        [UNSELECTED_LISTED],
    ).fetchall()
    lines += [f"- {g}" for (g,) in listed]
    if n_unselected > len(listed):
        lines.append(
            f"- … and {n_unselected - len(listed)} more (`SELECT * FROM unselected` in "
            "the database)"
        )
    lines.append("")
    return lines
