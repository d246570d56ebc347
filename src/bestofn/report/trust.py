"""The report over the trust tables (bestofn.select.trust): ``selection.md`` with the held-out
comparison, what best-of-N bought for every score, the correlation heatmap and the filter funnel;
HTML tables and PNGs for ``snakemake --report``; and the listening page (bestofn.report.listen)."""

from __future__ import annotations

import html
import json
from pathlib import Path

# Files this writes into the report directory (the report rule lists them as outputs).
FILES = {
    "selection": "selection.md",
    "held_out": "held_out.html",
    "score_gains": "score_gains.html",
    "correlation": "score_correlation.png",
    "funnel": "filter_funnel.png",
    "listen": "index.html",
}
ANNOTATED_CELLS = 16  # heatmaps of more columns than this carry no per-cell numbers
DOMINANT_RHO = 0.9  # a score term this correlated with the composite is all it measures


def _num(x, digits: int = 3, sign: bool = False) -> str:
    if x is None or x != x:  # None or NaN
        return "–"
    x = x + 0.0  # no "-0.000"
    if round(x, digits) == 0:
        x = 0.0
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _interval(mean, lo, hi) -> str:
    if mean is None:
        return "–"
    if lo is None:
        return f"{_num(mean, sign=True)} (too few groups for an interval)"
    return f"{_num(mean, sign=True)} [{_num(lo, sign=True)}, {_num(hi, sign=True)}]"


def _md_table(headers: list[str], rows: list[list[str]], right_from: int = 1) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(headers))]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _html_page(title: str, intro: str, headers: list[str], rows: list[list[str]], bad=()) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        f"<tr{' class=worse' if i in bad else ''}>"
        + "".join(f"<td>{html.escape(c)}</td>" for c in r)
        + "</tr>"
        for i, r in enumerate(rows)
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}tr.worse td{background:#fdd}</style>"
        f"</head><body><h2>{html.escape(title)}</h2><p>{html.escape(intro)}</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></body></html>\n"
    )


def _held_out_section(con) -> tuple[list[str], list[str], str]:
    """(markdown lines, summary lines for throughput.md, html page)."""
    settings = con.execute("SELECT seed, held_out, resamples FROM trust_settings").fetchone()
    entries = json.loads(settings[1])
    rows = con.execute(
        "SELECT column_name, better, coalesce(emotion, 'all'), n_groups, selected_mean, "
        "median_mean, random_mean, vs_median, vs_median_lo, vs_median_hi, vs_random, "
        "vs_random_lo, vs_random_hi, worse_than_median, worse_than_random, worse "
        "FROM held_out ORDER BY column_name, level DESC, emotion"
    ).fetchall()
    intro = (
        "Held-out scorers are computed for every take but never selected on. Per group: the "
        "selected take against the group's median and against one random take of the group "
        f"(seed {settings[0]}); means over groups with bootstrap 95 % intervals ({settings[2]} "
        "resamples of the groups). WORSE: an interval lies entirely on the worse side of zero."
    )
    md = ["## Held-out scorers", ""]
    summary = ["## Held-out scorers", ""]
    if not entries:
        md += ["No `selection.held_out` columns are configured: nothing checks what selection "
               "does to a score it does not select on (see config/README.md).", ""]  # fmt: skip
        summary += ["No held-out scorer configured (`selection.held_out`).", ""]
        return md, summary, _html_page("Held-out scorers", intro + " None configured.", [], [])
    headers = [
        "column", "better", "emotion", "groups", "selected", "median", "random",
        "selected − median [95 %]", "selected − random [95 %]", "verdict",
    ]  # fmt: skip
    table, bad = [], set()
    for i, r in enumerate(rows):
        verdict = {True: "WORSE", False: "not worse", None: "–"}[r[15]]
        if r[15]:
            bad.add(i)
        table.append(
            [r[0], r[1], r[2], str(r[3]), _num(r[4]), _num(r[5]), _num(r[6]),
             _interval(r[7], r[8], r[9]), _interval(r[10], r[11], r[12]), verdict]
        )  # fmt: skip
    md += [intro, ""]
    md += _md_table(
        headers,
        [[*r[:-1], f"**{r[-1]}**" if i in bad else r[-1]] for i, r in enumerate(table)],
        right_from=3,
    )
    md.append("")
    worse = [r for r in rows if r[15]]
    if worse:
        for col in dict.fromkeys(r[0] for r in worse):
            where = "; ".join(
                f"{r[2]}: selected − median {_interval(r[7], r[8], r[9])}, "
                f"selected − random {_interval(r[10], r[11], r[12])}"
                for r in worse
                if r[0] == col
            )
            summary.append(f"- **WARNING: selection made held-out `{col}` worse** ({where})")
    else:
        names = ", ".join(f"`{e['column']}`" for e in entries)
        summary.append(f"- no held-out column got worse under selection ({names})")
    summary.append("")
    page = _html_page("Held-out scorers", intro, headers, table, bad)
    return md, summary, page


def _gains_section(con) -> tuple[list[str], str]:
    rows = con.execute(
        "SELECT column_name, coalesce(emotion, 'all'), better, n_groups, selected_mean, "
        "median_mean, best_mean, selected_minus_median, share_of_best FROM score_gains "
        "ORDER BY level DESC, column_name = 'score' DESC, column_name, emotion"
    ).fetchall()
    intro = (
        "Per selected group: the selected take, the group's median take and the best take the "
        "group had (by the column's direction; – where bestofn does not know which way is "
        "better), averaged over groups. share = (selected − median) / (best − median): the part "
        "of what the best take offered that selection took; negative means selection moved "
        "that score the wrong way."
    )
    headers = [
        "column", "emotion", "better", "groups", "selected", "median", "best possible",
        "selected − median", "share",
    ]  # fmt: skip
    table = [
        [r[0], r[1], r[2] or "–", str(r[3]), _num(r[4]), _num(r[5]), _num(r[6]),
         _num(r[7], sign=True), _num(r[8], 2)]
        for r in rows
    ]  # fmt: skip
    md = ["## What best-of-N bought, for every score", "", intro, ""]
    md += _md_table(headers, table, right_from=3)
    md.append("")
    return md, _html_page("What best-of-N bought, for every score", intro, headers, table)


def _correlation_section(con, out: Path, plt) -> list[str]:
    held = {e["column"] for e in json.loads(con.execute("SELECT held_out FROM trust_settings")
                                            .fetchone()[0])}  # fmt: skip
    rows = con.execute("SELECT column_a, column_b, rho FROM score_correlation").fetchall()
    rho = {(a, b): r for a, b, r in rows}
    cols = list(dict.fromkeys(a for a, _, _ in rows))
    # Columns that never vary inside a group carry no ranking information: left out.
    cols = [c for c in cols if rho.get((c, c)) is not None]
    if "score" in cols:
        cols = [c for c in cols if c != "score"] + ["score"]
    md = ["## How the scores correlate", ""]
    md += [
        "Pooled within-group rank correlation (Spearman-like: each column ranked inside its "
        "group, ranks centred and scaled by group size, Pearson over all takes), so it shows "
        "what selection inside a group trades; differences between groups do not enter. "
        "Held-out columns are marked *. Columns constant within every group are left out.",
        "",
        "![score correlation](score_correlation.png)",
        "",
    ]
    if "score" in cols and len(cols) > 1:
        terms = sorted(
            (
                (c, rho[(c, "score")])
                for c in cols
                if c != "score" and rho[(c, "score")] is not None
            ),
            key=lambda t: -abs(t[1]),
        )
        md.append(
            "Correlation with the composite `score`: "
            + ", ".join(f"`{c}` {_num(r, 2, sign=True)}" for c, r in terms)
            + "."
        )
        dominant = [c for c, r in terms if abs(r) >= DOMINANT_RHO and c not in held]
        if dominant:
            md.append(
                f"\n**`score` is mostly {', '.join(f'`{c}`' for c in dominant)}** "
                f"(|ρ| ≥ {DOMINANT_RHO}): the other terms barely change which take wins."
            )
        md.append("")
    import numpy as np

    n = len(cols)
    # Cells big enough for their numbers where annotated; past that, small ones (a 57-column
    # heatmap at the annotated size was 4,300 px square: seconds to draw and encode).
    cell = 0.6 if n <= ANNOTATED_CELLS else 0.22
    fig, ax = plt.subplots(figsize=(max(5.5, 2.0 + cell * n), max(4.5, 1.4 + 0.92 * cell * n)))
    if n:
        m = np.array([[np.nan if rho.get((a, b)) is None else rho[(a, b)] for b in cols]
                      for a in cols])  # fmt: skip
        im = ax.imshow(m, cmap="RdBu_r", vmin=-1, vmax=1)
        labels = [f"{c} *" if c in held else c for c in cols]
        size = 8 if n <= ANNOTATED_CELLS else 6
        ax.set_xticks(range(n), labels, rotation=60, ha="right", fontsize=size)
        ax.set_yticks(range(n), labels, fontsize=size)
        for i in range(n if n <= ANNOTATED_CELLS else 0):  # past that, the colour says it
            for j in range(n):
                if not np.isnan(m[i, j]):
                    ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if abs(m[i, j]) > 0.6 else "black")  # fmt: skip
        fig.colorbar(im, ax=ax, shrink=0.8, label="ρ within groups")
    ax.set_title("Score correlations (* held out)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / FILES["correlation"], dpi=100)
    plt.close(fig)
    return md


def _funnel_section(con, out: Path, plt) -> list[str]:
    rows = con.execute(
        "SELECT step, clause, takes_in, removed, takes_left, groups_left FROM filter_funnel "
        "WHERE level = 'overall' ORDER BY step"
    ).fetchall()
    per_emotion = con.execute(
        "SELECT emotion, step, removed, takes_left, groups_left FROM filter_funnel "
        "WHERE level = 'emotion' AND step > 0 ORDER BY emotion, step"
    ).fetchall()
    md = ["## Filter funnel", ""]
    md += [
        f"Filter: `{con.execute('SELECT filter FROM trust_settings').fetchone()[0]}`. Each "
        "top-level AND clause in order; a clause removes the takes the earlier clauses left and "
        "it does not pass (NULL fails, as in selection). `groups left`: groups with at least one "
        "take left.",
        "",
    ]
    md += _md_table(
        ["step", "clause", "takes in", "removed", "takes left", "groups left"],
        [
            [str(s), f"`{c}`" if s else c, str(a), str(r), str(b), str(g)]
            for s, c, a, r, b, g in rows
        ],  # fmt: skip
        right_from=2,
    )
    md += ["", "![filter funnel](filter_funnel.png)", ""]
    if per_emotion:
        md += ["Per emotion (removed / takes left / groups left):", ""]
        steps = [r for r in rows if r[0] > 0]
        emotions = list(dict.fromkeys(e for e, *_ in per_emotion))
        cell = {(e, s): f"{r} / {t} / {g}" for e, s, r, t, g in per_emotion}
        md += _md_table(
            ["emotion", *[f"`{c}`" for _, c, *_ in steps]],
            [[e, *[cell.get((e, s), "–") for s, *_ in steps]] for e in emotions],
        )
        md.append("")

    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.5 * len(rows)))
    labels = [c if len(c) <= 40 else c[:37] + "..." for _, c, *_ in rows][::-1]
    left = [r[4] for r in rows][::-1]
    ax.barh(range(len(rows)), left, color="#4477aa")
    for i, r in enumerate(rows[::-1]):
        note = f"{r[4]} left" + (f", −{r[3]}" if r[0] else "") + f" ({r[5]} groups)"
        ax.text(r[4], i, " " + note, va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_xlabel("takes left after the clause (cumulative, in filter order)")
    ax.set_xlim(0, max([r[2] for r in rows] + [1]) * 1.45)
    ax.set_title("Filter funnel")
    fig.tight_layout()
    fig.savefig(out / FILES["funnel"], dpi=120)
    plt.close(fig)
    return md


def write_selection_report(
    db_path: str | Path, out_dir: str | Path, database: dict | None = None
) -> list[str]:
    """Write FILES into ``out_dir``; return the short summary for throughput.md (the held-out
    verdicts, and links). ``database``: as for ``bestofn.report.throughput.write_report``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bestofn.report.listen import write_listening_page
    from bestofn.report.listeners import listener_section
    from bestofn.select.database import open_read_only

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    con = open_read_only(db_path, database)
    try:
        held_md, summary, held_html = _held_out_section(con)
        gains_md, gains_html = _gains_section(con)
        corr_md = _correlation_section(con, out, plt)
        funnel_md = _funnel_section(con, out, plt)
        write_listening_page(con, Path(db_path).parent, out / FILES["listen"])
    finally:
        con.close()
    (out / FILES["held_out"]).write_text(held_html)
    (out / FILES["score_gains"]).write_text(gains_html)
    lines = ["# Selection you can trust", ""]
    lines += [
        "Best-of-N buys whatever its score rewards. This page shows what it bought and what it "
        "cost on scores it was not selected on. Listen to it: [index.html](index.html).",
        "",
    ]
    lines += held_md + gains_md + corr_md + funnel_md
    # Listener votes (bestofn.report.listeners): agreement with the selection, or "no votes yet".
    votes_md, votes_summary = listener_section(db_path, out, database)
    lines += votes_md
    (out / FILES["selection"]).write_text("\n".join(lines))
    summary += [
        "Per-score gains, score correlations and the filter funnel: "
        "[selection.md](selection.md). Listen to selected vs random takes: "
        "[index.html](index.html).",
        "",
    ]
    return summary + votes_summary
