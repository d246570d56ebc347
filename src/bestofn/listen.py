"""The listening page, ``results/report/index.html``: per group, the selected take beside one
random other take (in the seeded order of the ``listening`` table), with audio players, scores
and transcripts; a filter by emotion; the worst groups. Links are relative, so the results folder
can be copied anywhere and opened."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from urllib.parse import quote

import duckdb

from bestofn.trust import measure_columns, seeded_rng

WORST = 10  # lowest selected scores listed
NO_PASS_LISTED = 200
MAX_GROUPS = 2000  # more: a seeded sample, plus every group the worst lists link to

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.2em;color:#222;max-width:1400px}
h1{font-size:1.4em;margin:.2em 0}h2{font-size:1.15em;margin-top:1.4em}
.muted{color:#666;font-size:.9em}[hidden]{display:none!important}
#controls{position:sticky;top:0;background:#fff;padding:.5em 0;border-bottom:1px solid #ddd;
  z-index:1}
#worst{display:flex;gap:2em;flex-wrap:wrap}#worst ol,#worst ul{margin:.3em 0;padding-left:1.4em}
.group{border:1px solid #ccc;border-radius:6px;padding:.6em .9em;margin:.8em 0}
.group h3{margin:.1em 0;font-size:1em}.group .text{margin:.3em 0 .6em;font-style:italic}
.status-no_take_passed{border-color:#c33;background:#fff6f6}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:1em}
.take{border:1px solid #e3e3e3;border-radius:4px;padding:.4em .6em}
.take.selected{border-color:#393;background:#f5fbf5}
.take .head{font-weight:600}.role{font-weight:400;padding:0 .4em;border-radius:3px;
  background:#eee}.selected .role{background:#cfc}
audio{width:100%;margin:.3em 0}
table.scores{border-collapse:collapse;font-size:.82em}
table.scores td{padding:0 .6em 0 0}table.scores td.v{text-align:right}
.transcript{font-size:.9em;margin:.3em 0 0}
body.blind .role,body.blind .scores,body.blind .verdict{visibility:hidden}
body.blind .take.selected{border-color:#e3e3e3;background:none}
"""

_JS = """
const pick = document.getElementById('emotion');
const blind = document.getElementById('blind');
function apply() {
  const e = pick.value;
  let shown = 0;
  document.querySelectorAll('[data-emotion]').forEach(el => {
    el.hidden = Boolean(e) && el.dataset.emotion !== e;
    if (!el.hidden && el.classList.contains('group')) shown++;
  });
  document.getElementById('shown').textContent = shown;
  document.body.classList.toggle('blind', blind.checked);
}
pick.addEventListener('change', apply);
blind.addEventListener('change', apply);
apply();
"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _fmt(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return "–" if x != x else f"{x:.3f}"
    return str(x)


def _anchor(group_id: str) -> str:
    return "g-" + "".join(c if c.isalnum() or c in "-_." else "--" for c in group_id)


def flac_link(results_dir: Path, page: Path, emotion: str, prompt_id: str, take: int) -> str:
    """The take's FLAC as a URL relative to the page (the data layout, not the parquet's
    working-directory path, so a copied results folder still plays)."""
    flac = results_dir.resolve() / "groups" / emotion / prompt_id / "takes" / f"{take:03d}.flac"
    rel = os.path.relpath(flac, page.resolve().parent)
    return "/".join(quote(part) for part in Path(rel).parts)


def write_listening_page(
    con: duckdb.DuckDBPyConnection, results_dir: str | Path, page: str | Path
) -> Path:
    """Write the page from an open results database (needs the trust tables)."""
    results_dir, page = Path(results_dir), Path(page)
    seed, held = con.execute("SELECT seed, held_out FROM trust_settings").fetchone()
    held = {h["column"] for h in json.loads(held)}
    measures = measure_columns(con, "scored")
    have = {r[0] for r in con.execute("DESCRIBE scored").fetchall()}
    transcript = "transcript" if "transcript" in have else "NULL"
    cols = ", ".join(f's."{c}"' for c in measures)
    # Which groups the page shows, picked in SQL from the groups table, so the page and the
    # memory stay the same size whatever the run's: all of them up to MAX_GROUPS, else the
    # worst, the first groups with no passing take and a seeded sample of the rest.
    total, n_no_pass = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE status <> 'selected') FROM groups"
    ).fetchone()
    emotions = [
        e for (e,) in con.execute("SELECT DISTINCT emotion FROM groups ORDER BY 1").fetchall()
    ]
    worst = con.execute(
        "SELECT group_id, emotion, best_score, median_score FROM groups "
        "WHERE status = 'selected' ORDER BY best_score ASC NULLS FIRST, group_id LIMIT ?",
        [WORST],
    ).fetchall()
    no_pass = con.execute(
        "SELECT group_id, emotion, prompt_id, n_takes FROM groups WHERE status <> 'selected' "
        "ORDER BY emotion, prompt_id LIMIT ?",
        [NO_PASS_LISTED],
    ).fetchall()
    shown = "groups"
    sampled = ""
    if total > MAX_GROUPS:
        keep = {w[0] for w in worst} | {g[0] for g in no_pass}
        ids = con.execute("SELECT group_id FROM groups ORDER BY emotion, prompt_id").fetchall()
        rest = [g for (g,) in ids if g not in keep]
        n = min(len(rest), max(0, MAX_GROUPS - len(keep)))
        pick = seeded_rng(seed, "page").choice(len(rest), n, replace=False)
        keep |= {rest[i] for i in pick}
        con.execute("CREATE OR REPLACE TEMP TABLE page_groups (group_id VARCHAR)")
        con.executemany("INSERT INTO page_groups VALUES (?)", [(g,) for g in sorted(keep)])
        shown = "(SELECT * FROM groups WHERE group_id IN (SELECT group_id FROM page_groups))"
        sampled = (
            f" Showing {len(keep)} of them: every group the worst lists name, and a random "
            f"sample (seed {seed}) of the rest; the database has them all."
        )
    takes = con.execute(
        f"""
        SELECT l.group_id, l.listen_order, l.take, l.role, s.score, s.passes,
               {transcript} AS transcript{", " + cols if cols else ""}
        FROM listening l JOIN scored s USING (group_id, take)
        WHERE l.group_id IN (SELECT group_id FROM {shown})
        ORDER BY l.group_id, l.listen_order
        """
    ).fetchall()
    by_group: dict[str, list] = {}
    for row in takes:
        by_group.setdefault(row[0], []).append(row)
    groups = con.execute(
        "SELECT g.group_id, g.emotion, g.prompt_id, g.n_takes, g.n_pass, g.best_score, "
        "g.median_score, g.status, "
        + (
            "(SELECT any_value(t.text) FROM takes t WHERE t.group_id = g.group_id) "
            if "text" in have
            else "NULL "
        )
        + f"AS text FROM {shown} g ORDER BY g.emotion, g.prompt_id"
    ).fetchall()
    filt = con.execute("SELECT filter FROM trust_settings").fetchone()[0]

    out = [
        "<!doctype html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        "<title>bestofn: listen to the selection</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Listen: the selected take beside one random other take</h1>",
        f"<p class='muted'>{total} groups ({n_no_pass} with no passing take).{sampled} "
        f"Filter: <code>{_e(filt)}</code>. The two takes of a group appear in a seeded random "
        f"order (seed {_e(seed)}; the <code>listening</code> table records it), so the selected "
        "take is not always first: listeners favour positions. Held-out columns are marked *."
        "</p>",
        "<div id='controls'><label>Emotion <select id='emotion'>"
        "<option value=''>all</option>"
        + "".join(f"<option value='{_e(e)}'>{_e(e)}</option>" for e in emotions)
        + "</select></label> <label><input type='checkbox' id='blind'> blind (hide which take "
        "was selected, and the scores)</label> <span class='muted'>showing <span id='shown'>"
        f"{len(groups)}</span> groups</span></div>",
        "<h2>Worst groups</h2><div id='worst'>",
        "<div><h3>Lowest selected score</h3><ol id='lowest'>",
    ]
    for group_id, emotion, best, median in worst:
        out.append(
            f"<li data-emotion='{_e(emotion)}'><a href='#{_anchor(group_id)}'>{_e(group_id)}</a>"
            f" <span class='muted'>score {_fmt(best)} (group median {_fmt(median)})</span></li>"
        )
    out.append("</ol></div>")
    out.append(f"<div><h3>No passing take ({n_no_pass})</h3><ul id='no-pass'>")
    for g in no_pass:
        out.append(
            f"<li data-emotion='{_e(g[1])}'><a href='#{_anchor(g[0])}'>{_e(g[0])}</a>"
            f" <span class='muted'>0 of {g[3]} takes passed</span></li>"
        )
    if n_no_pass > NO_PASS_LISTED:
        out.append(f"<li>… and {n_no_pass - NO_PASS_LISTED} more (table groups)</li>")
    if not no_pass:
        out.append("<li class='muted'>none</li>")
    out.append("</ul></div></div>")

    out.append("<h2>Groups</h2>")
    labels = "AB" + "".join(chr(ord("C") + i) for i in range(24))
    for group_id, emotion, prompt_id, n_takes, n_pass, best, median, status, text in groups:
        verdict = (
            f"{n_pass} of {n_takes} takes passed; selected score {_fmt(best)}, "
            f"median {_fmt(median)}"
            if status == "selected"
            else f"no take passed the filter (of {n_takes}); shown: the best-scoring take"
        )
        out += [
            f"<article class='group status-{_e(status)}' id='{_anchor(group_id)}' "
            f"data-emotion='{_e(emotion)}'>",
            f"<h3>{_e(group_id)}</h3><p class='text'>{_e(text)}</p>",
            f"<p class='muted verdict'>{_e(verdict)}</p><div class='pair'>",
        ]
        for row in by_group.get(group_id, []):
            _, order, take, role, sc, passes, said, *values = row
            link = flac_link(results_dir, page, emotion, prompt_id, take)
            role_text = {"selected": "selected", "random": "random other take",
                         "best_failing": "best score, failed filter"}[role]  # fmt: skip
            cells = [("score", sc), ("passes filter", passes)] + [
                (f"{c} *" if c in held else c, v) for c, v in zip(measures, values, strict=True)
            ]
            table = "".join(
                f"<tr><td>{_e(k)}</td><td class='v'>{_e(_fmt(v))}</td></tr>" for k, v in cells
            )
            out += [
                f"<div class='take {_e(role)}' data-take='{take}' data-listen-order='{order}'>",
                f"<div class='head'>{labels[order - 1]} · take {take} "
                f"<span class='role'>{_e(role_text)}</span></div>",
                f"<audio controls preload='none' src='{_e(link)}'></audio>",
                f"<table class='scores'>{table}</table>",
                f"<p class='transcript'><span class='muted'>heard:</span> {_e(said or '–')}</p>"
                if transcript != "NULL"
                else "",
                "</div>",
            ]
        out.append("</div></article>")
    out += [f"<script>{_JS}</script>", "</body></html>", ""]
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(out))
    return page
