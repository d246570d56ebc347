"""The report's listener section (bestofn.report.votes): agreement with the selection per emotion,
each listener's left-position preference, and agreement against the score margin as a plot.
Computed from the votes store and the database, read-only, so the report is right even when
the database's listener tables are older than the store."""

from __future__ import annotations

import html
import sys
from pathlib import Path

from bestofn.report.votes import compute_votes, stored_files

FILES = {"table": "listener_agreement.html", "plot": "listener_agreement.png"}


def _num(x, digits: int = 2) -> str:
    return "–" if x is None or x != x else f"{x:.{digits}f}"


def _share(share, lo, hi) -> str:
    return "–" if share is None else f"{_num(share)} [{_num(lo)}, {_num(hi)}]"


def _tables(rows: dict) -> tuple[list[str], list[list[list[str]]]]:
    agreement = [
        [e or "all", str(n), str(dec), str(same), str(k), _share(a, lo, hi)]
        for _, e, n, dec, same, k, a, lo, hi, _ in rows["listener_agreement"]
    ]
    position = [
        [who, str(dec), str(k), _share(s, lo, hi), "WARNING" if warn else "ok"]
        for who, _, dec, k, s, lo, hi, warn in rows["listener_position"]
    ]
    margin = [
        [f"{_num(a, 3)} … {_num(b, 3)}", str(dec), str(same), _share(s, lo, hi)]
        for _, a, b, _, dec, same, _, s, lo, hi in rows["listener_margin"]
    ]
    warnings = [
        f"WARNING: listener {who!r} chose the left take in {k} of {dec} decisive votes "
        f"({_share(s, lo, hi)}): the interval excludes 0.5, so position sways this listener"
        for who, _, dec, k, s, lo, hi, warn in rows["listener_position"]
        if warn
    ]
    return warnings, [agreement, position, margin]


HEADS = [
    ["emotion", "votes", "decisive", "same", "for selected", "agreement [95 %]"],
    ["listener", "decisive", "left", "left share [95 %]", "position"],
    ["score margin (selected − other)", "decisive", "same", "agreement [95 %]"],
]
INTRO = (
    "Blind A/B votes from the listening page: per group the selected take beside one random "
    "other take, in an order seeded per listener. Agreement is the share of decisive votes "
    "(not 'same') that went to the selected take: 0.5 is what a coin would give. It says "
    "whether listeners hear what the score rewards on these pairs; it is no measure of the "
    "data's quality, and a few votes say little (intervals: bootstrap over groups, never "
    "narrower than Wilson's)."
)


def _md(head: list[str], body: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    return out + ["| " + " | ".join(r) + " |" for r in body]


def _plot(margin_rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    if margin_rows:
        mids = [(a + b) / 2 for _, a, b, *_ in margin_rows]
        shares = [r[7] for r in margin_rows]
        lo = [r[8] for r in margin_rows]
        hi = [r[9] for r in margin_rows]
        pts = [
            (m, s, s - lo_, hi_ - s)
            for m, s, lo_, hi_ in zip(mids, shares, lo, hi, strict=True)
            if s is not None
        ]
        if pts:
            m, s, dlo, dhi = zip(*pts, strict=True)
            ax.errorbar(m, s, yerr=[dlo, dhi], fmt="o-", color="#4477aa", capsize=3)
        for b, lo_edge, hi_edge, *_ in margin_rows:
            ax.axvspan(lo_edge, hi_edge, color="#eeeeee" if b % 2 else "#f7f7f7", zorder=0)
    ax.axhline(0.5, color="black", lw=0.7, ls="--")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("score margin: selected − other take (bins of votes)")
    ax.set_ylabel("share of decisive votes\nfor the selected take")
    ax.set_title("Listener agreement against the score margin")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def votes_section(con, results_dir: str | Path, out_dir: str | Path | None) -> tuple[list, list]:
    """Write FILES into ``out_dir`` (unless None); return (markdown for selection.md, summary
    lines for throughput.md). Without votes: "no votes yet" and an empty plot."""
    out = Path(out_dir) if out_dir is not None else None
    md = ["## Listeners: do they agree with the selection?", ""]
    if not stored_files(results_dir):
        note = (
            "No votes yet. Open [index.html](index.html), tick *blind*, enter your name, vote, "
            "export, then `bestofn listen import VOTES.json` (config/README.md)."
        )
        md += [note, ""]
        if out is not None:
            (out / FILES["table"]).write_text(_page("<p>No votes yet.</p>"))
            _plot([], out / FILES["plot"])
        return md, ["## Listeners", "", "No votes yet (index.html, blind mode).", ""]
    rows = compute_votes(con, results_dir)
    warnings, bodies = _tables(rows)
    votes = rows["listener_votes"]
    stale = sum(1 for v in votes if not v[20])
    md += [INTRO, ""]
    if stale:
        md += [f"{stale} stored vote(s) are stale (their group no longer shows the pair they "
               "heard) and do not count; see `listener_votes.stale_reason`.", ""]  # fmt: skip
    for head, body in zip(HEADS, bodies, strict=True):
        md += [*_md(head, body), ""]
    md += [f"- **{w}**" for w in warnings]
    md += ["", f"![agreement against the score margin]({FILES['plot']})", ""]
    if out is not None:
        _plot(rows["listener_margin"], out / FILES["plot"])
    parts = [f"<p>{html.escape(INTRO)}</p>"]
    parts += [f"<p class=warn>{html.escape(w)}</p>" for w in warnings]
    for head, body in zip(HEADS, bodies, strict=True):
        parts.append(
            "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                      for r in body)
            + "</table>"
        )  # fmt: skip
    if out is not None:
        (out / FILES["table"]).write_text(_page("".join(parts)))
    overall = next(r for r in rows["listener_agreement"] if r[0] == "overall")
    summary = [
        "## Listeners",
        "",
        f"- agreement with the selection: {_share(*overall[6:9])} over {overall[3]} decisive "
        f"votes ({overall[4]} 'same'; {len(rows['listener_position'])} listener(s))",
        *[f"- **{w}**" for w in warnings],
        "",
    ]
    return md, summary


def _page(body: str) -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Listener agreement</title>"
        "<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;"
        "margin:.8em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}.warn{color:#a00;font-weight:600}"
        "</style></head><body><h2>Listener agreement with the selection</h2>"
        f"{body}</body></html>\n"
    )


def import_main(files: list[str], results_dir: str, db_path: str | None = None) -> int:
    """``bestofn listen import``: import, print what happened and the tables, refresh the
    report's listener files when the report directory exists."""
    import duckdb

    from bestofn.report.votes import VotesError, import_files

    results = Path(results_dir)
    db = Path(db_path) if db_path else results / "bestofn.duckdb"
    if not db.is_file():
        print(f"error: {db}: no results database (the workflow builds it)", file=sys.stderr)
        return 2
    try:
        summary = import_files(db, results, files)
    except (VotesError, duckdb.Error) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for e in summary["errors"]:
        print(f"error: {e}", file=sys.stderr)
    for f in summary["already_imported"]:
        print(f"{f}: already imported, adds nothing")
    print(
        f"imported {len(summary['added_files'])} file(s), {summary['new_votes']} new or changed "
        f"vote(s); {summary['counted']} vote(s) count ({summary['stale']} stale) from "
        f"{summary['files']} file(s) in {results / 'votes'}"
    )
    con = duckdb.connect(str(db), read_only=True)
    try:
        report = results / "report"  # refreshed here; the next report rule run redoes it
        # nothing added: nothing on disk changes, the report's files included
        out = report if report.is_dir() and summary["added_files"] else None
        md, _ = votes_section(con, results, out)
    finally:
        con.close()
    plot = f"plot: {report / FILES['plot']}" if out else ""
    print(
        "\n".join(md[2:]).replace(f"![agreement against the score margin]({FILES['plot']})", plot)
    )
    if summary["errors"] and not summary["added_files"] and not summary["already_imported"]:
        return 2  # every file refused: bad input, nothing changed
    return 1 if summary["errors"] else 0


def listener_section(
    db_path: str | Path, out_dir: str | Path, database: dict | None = None
) -> tuple[list, list]:
    """:func:`votes_section` for the report: the database read-only (``database``: the config's
    settings, as the report's other connections), the results directory its parent (as for the
    listening page)."""
    from bestofn.select.database import open_read_only

    con = open_read_only(db_path, database)
    try:
        return votes_section(con, Path(db_path).parent, out_dir)
    finally:
        con.close()
