"""The listening page, ``results/report/index.html``: per group, the selected take beside one
random other take (in the seeded order of the ``listening`` table), with audio players, scores
and transcripts; a filter by emotion; the worst groups. Links are relative, so the results folder
can be copied anywhere and opened.

In blind mode a listener votes per group (A better, B better, same; keyboard shortcuts) on the
pair in an order seeded per listener; votes stay in the browser's localStorage and leave as one
JSON file through the page's export button, for ``bestofn listen import`` (bestofn.report.votes).
The
page is static: no server, no fetch, so it works from file://."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from urllib.parse import quote

import duckdb

from bestofn.report.votes import FORMAT, group_pairs, page_build, results_id
from bestofn.select.trust import measure_columns, seeded_rng

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
body:not(.blind) .vote,body:not(.blind) .voting{display:none}
.group.current{outline:3px solid #4488cc;outline-offset:2px}
.vote{margin:.5em 0 .1em;display:flex;gap:.5em;align-items:center;flex-wrap:wrap}
.vote button{font-size:.95em;padding:.2em .8em}.vote button.on{background:#4488cc;color:#fff}
.vote button.on kbd{background:none;color:#fff;border-color:#fff}
body.blind #worst .muted{visibility:hidden}
.vote .mine{font-size:.9em;color:#357}.voting{margin:.4em 0 0;font-size:.9em}
kbd{border:1px solid #bbb;border-radius:3px;padding:0 .3em;font-size:.85em;background:#f6f6f6}
#note{color:#a00}
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

# Votes (blind mode only). The left/right order is seeded per listener by the same function as
# bestofn.report.votes.order_seed/left_first, so the import can check what the listener heard left.
_VOTE_JS = """
const META = JSON.parse(document.getElementById('votes-meta').textContent);
const who = document.getElementById('listener');
const note = document.getElementById('note');
const LABEL = {left: 'A better', right: 'B better', same: 'same'};
const CONF = {1: 'unsure', 2: 'fairly sure', 3: 'sure'};
function mix32(s) {
  let h = 0x811c9dc5;
  for (const b of new TextEncoder().encode(s)) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  h ^= h >>> 16; h = Math.imul(h, 0x85ebca6b) >>> 0;
  h ^= h >>> 13; h = Math.imul(h, 0xc2b2ae35) >>> 0;
  return (h ^ (h >>> 16)) >>> 0;
}
const listener = () => who.value.trim();
const orderSeed = l => mix32(META.seed + '/' + l);
const storeKey = l => 'bestofn-votes/' + META.results_id + '/' + l;
let votes = {}, stale = 0, cur = null;
function loadVotes() {
  votes = {}; stale = 0;
  const l = listener();
  if (!l) return;
  let all = {};
  try { all = JSON.parse(localStorage.getItem(storeKey(l)) || '{}'); } catch (e) { all = {}; }
  for (const [g, v] of Object.entries(all.votes || {})) {
    if (v.build === META.build) votes[g] = v; else stale++;
  }
}
function saveVote(v) {
  const k = storeKey(v.listener);
  let all = {};
  try { all = JSON.parse(localStorage.getItem(k) || '{}'); } catch (e) { all = {}; }
  all.votes = all.votes || {};
  all.votes[v.group_id] = v;
  localStorage.setItem(k, JSON.stringify(all));
}
const voteable = () => [...document.querySelectorAll('article.group')].filter(
  a => !a.hidden && a.querySelectorAll('.pair .take').length === 2);
function arrange() {
  const l = listener(), on = blind.checked && Boolean(l), seed = orderSeed(l);
  document.querySelectorAll('article.group').forEach(art => {
    const pair = art.querySelector('.pair');
    const takes = [...pair.querySelectorAll('.take')].sort(
      (a, b) => a.dataset.listenOrder - b.dataset.listenOrder);
    const swap = on && takes.length === 2 && (mix32(seed + '/' + art.dataset.group) >>> 31);
    if (swap) takes.reverse();
    takes.forEach((t, i) => {
      pair.appendChild(t); t.querySelector('.pos').textContent = 'AB'[i] || '?';
    });
    show(art);
  });
  const n = voteable().length, done = voteable().filter(a => votes[a.dataset.group]).length;
  document.getElementById('tally').textContent = `${done} of ${n} shown groups voted`
    + (stale ? ` (${stale} vote(s) from an earlier build of this page are not exported)` : '');
}
function show(art) {
  const v = votes[art.dataset.group], panel = art.querySelector('.vote');
  if (!panel) return;
  panel.querySelectorAll('button').forEach(
    b => b.classList.toggle('on', Boolean(v) && b.dataset.choice === v.choice));
  const conf = v ? v.confidence : (art.dataset.confidence ? +art.dataset.confidence : null);
  panel.querySelectorAll('input[type=radio]').forEach(r => { r.checked = +r.value === conf; });
  panel.querySelector('.mine').textContent = v ? 'your vote: ' + LABEL[v.choice]
    + (v.confidence ? ' (' + CONF[v.confidence] + ')' : '') : 'not voted';
}
function setCurrent(art) {
  if (cur) cur.classList.remove('current');
  cur = art;
  if (cur) { cur.classList.add('current'); cur.scrollIntoView({block: 'nearest'}); }
}
function move(step) {
  const list = voteable();
  if (!list.length) return setCurrent(null);
  const i = list.indexOf(cur);
  setCurrent(list[i < 0 ? 0 : Math.min(list.length - 1, Math.max(0, i + step))]);
}
function vote(art, choice) {
  const l = listener();
  if (!l) {
    note.textContent = 'Enter your name first (votes are kept per listener).';
    who.focus(); return false;
  }
  const takes = art.querySelectorAll('.pair .take');
  if (takes.length !== 2) return false;
  const prev = votes[art.dataset.group];
  const conf = art.dataset.confidence ? +art.dataset.confidence : (prev ? prev.confidence : null);
  const v = {group_id: art.dataset.group, left_take: +takes[0].dataset.take,
    right_take: +takes[1].dataset.take, choice: choice, confidence: conf, listener: l,
    time: new Date().toISOString(), page_seed: META.seed, order_seed: orderSeed(l),
    build: META.build, pair: art.dataset.pair};
  votes[v.group_id] = v; saveVote(v); note.textContent = ''; arrange();
  return true;
}
function setConfidence(art, c) {
  art.dataset.confidence = c;
  const v = votes[art.dataset.group];
  if (v) { v.confidence = c; saveVote(v); }
  show(art);
}
function play(art, i) {
  const players = art.querySelectorAll('.pair audio');
  players.forEach((p, j) => { if (j !== i) p.pause(); });
  if (players[i]) players[i].play();
}
document.querySelectorAll('.vote button').forEach(b => b.addEventListener('click', () => {
  const art = b.closest('article'); setCurrent(art);
  if (vote(art, b.dataset.choice)) move(1);
}));
document.querySelectorAll('.vote input[type=radio]').forEach(r => r.addEventListener('change',
  () => setConfidence(r.closest('article'), +r.value)));
document.addEventListener('keydown', ev => {
  if (!blind.checked || ev.ctrlKey || ev.metaKey || ev.altKey) return;
  if (ev.target.matches('input[type=text], select, textarea')) return;
  if (!cur || cur.hidden) move(0);
  if (!cur) return;
  const choice = {a: 'left', ArrowLeft: 'left', b: 'right', ArrowRight: 'right', s: 'same',
    ArrowDown: 'same'}[ev.key];
  if (choice) { ev.preventDefault(); if (vote(cur, choice)) move(1); }
  else if (['1', '2', '3'].includes(ev.key)) setConfidence(cur, +ev.key);
  else if (ev.key === 'j') move(1);
  else if (ev.key === 'k') move(-1);
  else if (ev.key === 'q' || ev.key === 'w') play(cur, ev.key === 'q' ? 0 : 1);
});
function exportVotes() {
  const l = listener();
  if (!l) { note.textContent = 'Enter your name first.'; who.focus(); return; }
  const list = Object.values(votes).sort((a, b) => (a.group_id < b.group_id ? -1 : 1));
  const now = new Date().toISOString();
  const doc = {format: META.format, results_id: META.results_id, results: META.results,
    build: META.build, page_seed: META.seed, listener: l, order_seed: orderSeed(l),
    exported_at: now, votes: list};
  const a = document.createElement('a');
  const blob = new Blob([JSON.stringify(doc, null, 1)], {type: 'application/json'});
  a.href = URL.createObjectURL(blob);
  a.download = 'votes-' + l.replace(/[^A-Za-z0-9_.-]+/g, '_') + '-'
    + now.replace(/[^0-9]/g, '').slice(0, 14) + '.json';
  document.body.appendChild(a); a.click(); a.remove();
  note.textContent = `exported ${list.length} vote(s) as ${a.download}`;
}
document.getElementById('export').addEventListener('click', exportVotes);
const lastKey = 'bestofn-listener/' + META.results_id;
who.value = localStorage.getItem(lastKey) || '';
who.addEventListener('input', () => {
  localStorage.setItem(lastKey, listener()); loadVotes(); arrange();
});
blind.addEventListener('change', () => {
  arrange();
  if (blind.checked) { move(0); if (!listener()) who.focus(); }
});
pick.addEventListener('change', () => { arrange(); move(0); });
loadVotes(); arrange();
"""


def _vote_panel() -> str:
    return (
        "<div class='vote'><button type='button' data-choice='left'>A better <kbd>a</kbd>"
        "</button><button type='button' data-choice='right'>B better <kbd>b</kbd></button>"
        "<button type='button' data-choice='same'>same <kbd>s</kbd></button>"
        "<span class='muted'>confidence:</span>"
        + "".join(
            f"<label><input type='radio' value='{i}'> {name} <kbd>{i}</kbd></label>"
            for i, name in ((1, "unsure"), (2, "fairly sure"), (3, "sure"))
        )
        + " <span class='mine'></span></div>"
    )


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


def _flac_link(root: Path, here: Path, emotion: str, prompt_id: str, take: int) -> str:
    """The take's FLAC as a URL relative to the page (the data layout, not the parquet's
    working-directory path, so a copied results folder still plays). ``root`` (the results
    folder) and ``here`` (the page's folder) come resolved, once per page: each resolve is a
    system call per path component (1.2 s of a 4,000-take page)."""
    flac = root / "groups" / emotion / prompt_id / "takes" / f"{take:03d}.flac"
    rel = os.path.relpath(flac, here)
    return "/".join(quote(part) for part in Path(rel).parts)


def _cell(v) -> str:
    """A score cell: numbers, booleans and NULL need no escaping (220k cells a page)."""
    text = _fmt(v)
    return text if v is None or isinstance(v, int | float) else html.escape(text)


def write_listening_page(
    con: duckdb.DuckDBPyConnection, results_dir: str | Path, page: str | Path
) -> Path:
    """Write the page from an open results database (needs the trust tables)."""
    results_dir, page = Path(results_dir), Path(page)
    seed, held = con.execute("SELECT seed, held_out FROM trust_settings").fetchone()
    held = {h["column"] for h in json.loads(held)}
    measures = measure_columns(con, "scored")
    # the score table's row heads, escaped once per page (the same for every take)
    heads = [_e(k) for k in ("score", "passes filter", *(f"{c} *" if c in held else c
                                                         for c in measures))]  # fmt: skip
    root, here = results_dir.resolve(), page.resolve().parent
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
        # one statement (executemany inserts row by row: 0.5 s for 2,000 groups)
        con.execute("INSERT INTO page_groups SELECT unnest(?::VARCHAR[])", [sorted(keep)])
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
    pairs = group_pairs(con)  # what each vote heard: a fingerprint of its group's two takes
    meta = {
        "format": FORMAT,
        "results_id": results_id(results_dir, create=True),
        "results": str(results_dir.resolve()),
        "build": page_build(con, pairs),
        "seed": seed,
    }

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
        f"{len(groups)}</span> groups</span>",
        "<div class='voting'><label>Listener <input type='text' id='listener' size='14' "
        "placeholder='your name'></label> <button type='button' id='export'>export votes "
        "(JSON)</button> <span id='tally' class='muted'></span> <span id='note'></span><br>"
        "<span class='muted'>Vote on the current (outlined) group: <kbd>a</kbd>/<kbd>←</kbd> A "
        "better, <kbd>b</kbd>/<kbd>→</kbd> B better, <kbd>s</kbd>/<kbd>↓</kbd> same; "
        "<kbd>1</kbd>–<kbd>3</kbd> confidence (before or after the vote); <kbd>q</kbd>/"
        "<kbd>w</kbd> play A/B; <kbd>j</kbd>/<kbd>k</kbd> next/previous. The order of A and B "
        f"is seeded per listener (page seed {_e(seed)}, build {_e(meta['build'])}). Votes stay "
        "in this browser until you export them; then <code>bestofn listen import FILE</code>."
        "</span></div></div>",
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
            f"data-emotion='{_e(emotion)}' data-group='{_e(group_id)}' "
            f"data-pair='{_e(pairs[group_id][3] if group_id in pairs else '')}'>",
            f"<h3>{_e(group_id)}</h3><p class='text'>{_e(text)}</p>",
            f"<p class='muted verdict'>{_e(verdict)}</p><div class='pair'>",
        ]
        for row in by_group.get(group_id, []):
            _, order, take, role, sc, passes, said, *values = row
            link = _flac_link(root, here, emotion, prompt_id, take)
            role_text = {"selected": "selected", "random": "random other take",
                         "best_failing": "best score, failed filter"}[role]  # fmt: skip
            table = "".join(
                f"<tr><td>{k}</td><td class='v'>{_cell(v)}</td></tr>"
                for k, v in zip(heads, (sc, passes, *values), strict=True)
            )
            out += [
                f"<div class='take {_e(role)}' data-take='{take}' data-listen-order='{order}'>",
                f"<div class='head'><span class='pos'>{labels[order - 1]}</span> · take {take} "
                f"<span class='role'>{_e(role_text)}</span></div>",
                f"<audio controls preload='none' src='{_e(link)}'></audio>",
                f"<table class='scores'>{table}</table>",
                f"<p class='transcript'><span class='muted'>heard:</span> {_e(said or '–')}</p>"
                if transcript != "NULL"
                else "",
                "</div>",
            ]
        out.append("</div>")
        if len(by_group.get(group_id, [])) == 2:
            out.append(_vote_panel())
        out.append("</article>")
    meta_json = json.dumps(meta).replace("<", "\\u003c")
    out += [
        f"<script type='application/json' id='votes-meta'>{meta_json}</script>",
        f"<script>{_JS}{_VOTE_JS}</script>",
        "</body></html>",
        "",
    ]
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(out))
    return page
