"""Listener votes from the listening page (bestofn.report.listen), kept beside the results database.

A listener votes in blind mode on the pair each group shows (the selected take and one random
other take): left better, right better, or the same. The page exports the votes as one JSON file;
``bestofn listen import`` checks it against the database and keeps an exact copy in the votes
store, ``results/votes/``:

``results/votes/results_id``           a random id, made when the page is first written; the page
                                       and its exports carry it, so a file from another results
                                       directory is refused (a copied folder keeps it).
``results/votes/imported/<sha>.json``  every file accepted, named by the digest of its content.

The store is the record. The tables below are computed from it (:func:`apply_votes`) on every
import, and the ``database`` rule calls :func:`apply_votes` after each rebuild, so a rebuild
keeps the votes. After a rebuild a vote still counts while its group shows the same two takes
(same takes, seeds and durations); otherwise it is kept as stale (``counted`` false, with the
reason). Where one listener voted a group more than once (two exports), the latest vote counts.

``listener_votes``       one row per vote, with what only the database knows: which take was
                         selected, whether the vote went to it, and the score margin.
``listener_agreement``   per emotion and overall: the share of decisive votes (not "same") that
                         went to the selected take, with a 95 % interval, and the count of "same".
``listener_position``    per listener: the share of decisive votes for the left take, its 95 %
                         interval, and ``warning`` when the interval excludes 0.5.
``listener_margin``      agreement in bins of the score margin (selected − other take).
``listener_files``       one row per imported file.

Intervals: a bootstrap over groups (votes on one group by several listeners are not independent),
never narrower than the Wilson score interval of the same counts: where every vote went one way
every resample gives the same share, and the bootstrap alone would claim certainty.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb
import numpy as np

from bestofn.select.trust import BOOTSTRAP_RESAMPLES, seeded_rng

FORMAT = "bestofn-votes/1"
STORE = "votes"
ID_FILE = "results_id"
IMPORTED = "imported"
CHOICES = ("left", "right", "same")
CONFIDENCE = (1, 2, 3)  # unsure, fairly sure, sure
MAX_BINS = 4
MIN_PER_BIN = 5
Z95 = 1.959964
# Take columns that identify a take's audio (those a database has are used): a vote counts only
# while the two takes it heard are still these.
IDENTITY_COLUMNS = ("seed", "spec_hash", "models_hash", "duration_s", "n_frames", "sample_rate")
TABLES = (
    "listener_votes", "listener_agreement", "listener_position", "listener_margin",
    "listener_files",
)  # fmt: skip


class VotesError(ValueError):
    pass


# --- the page's seeded per-listener order (the same function is in the page's script) -------


def _mix32(text: str) -> int:
    """FNV-1a over the UTF-8 bytes, then murmur3's finaliser (FNV's low bits are weak)."""
    h = 0x811C9DC5
    for b in text.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def order_seed(page_seed: int, listener: str) -> int:
    """The seed of one listener's left/right order: a function of the page's seed and the name."""
    return _mix32(f"{page_seed}/{listener}")


def left_first(order_seed_: int, group_id: str, listening_order: list[int]) -> list[int]:
    """The pair as this listener's page shows it (left first): the ``listening`` table's order,
    swapped when the listener's seeded coin for the group says so."""
    swap = _mix32(f"{order_seed_}/{group_id}") >> 31
    return list(reversed(listening_order)) if swap else list(listening_order)


# --- identity: results directory and page build ----------------------------------------------


def store_dir(results_dir: str | Path) -> Path:
    return Path(results_dir) / STORE


def results_id(results_dir: str | Path, create: bool = False) -> str | None:
    """The results directory's id (``results/votes/results_id``); ``create`` makes it once."""
    path = store_dir(results_dir) / ID_FILE
    if path.is_file():
        return path.read_text().strip()
    if not create:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "x") as f:  # exclusive: two writers agree on the first one's id
            f.write(secrets.token_hex(8) + "\n")
    except FileExistsError:
        pass
    return path.read_text().strip()


def _identity_sql(con) -> str:
    have = {r[0] for r in con.execute("DESCRIBE takes").fetchall()}
    cols = [c for c in IDENTITY_COLUMNS if c in have]
    parts = ["t.take::VARCHAR"] + [f"coalesce(t.\"{c}\"::VARCHAR, '')" for c in cols]
    return " || ':' || ".join(parts)


def group_pairs(con) -> dict[str, tuple[str, str, list[int], str]]:
    """group id -> (emotion, prompt id, takes in the listening order, fingerprint of the pair).
    The fingerprint hashes the two takes' identity (never which one is selected)."""
    rows = con.execute(
        f"""
        SELECT l.group_id, any_value(l.emotion), any_value(l.prompt_id),
               list(l.take ORDER BY l.listen_order),
               md5(string_agg({_identity_sql(con)}, '|' ORDER BY l.take))
        FROM listening l JOIN takes t USING (group_id, take)
        GROUP BY l.group_id ORDER BY l.group_id
        """
    ).fetchall()
    return {g: (e, p, list(takes), fp) for g, e, p, takes, fp in rows}


def page_build(con, pairs: dict | None = None) -> str:
    """The build hash of the listening page this database writes: the seed and every group's
    pair fingerprint. A rebuild that changes any pair changes it. (Each vote also carries its
    group's fingerprint, so after a rebuild a vote counts while its own pair is unchanged.)"""
    pairs = group_pairs(con) if pairs is None else pairs
    seed = con.execute("SELECT seed FROM trust_settings").fetchone()[0]
    h = hashlib.sha256(f"{seed}\n".encode())
    for group_id, (*_, fp) in pairs.items():
        h.update(f"{group_id}={fp}\n".encode())
    return h.hexdigest()[:16]


# --- reading and checking one exported file ---------------------------------------------------


@dataclass
class Context:
    """What a vote is checked against: the current database and results directory."""

    results_id: str | None
    seed: int
    build: str
    pairs: dict

    @classmethod
    def of(cls, con, results_dir: str | Path) -> Context:
        try:
            con.execute("SELECT seed FROM trust_settings").fetchone()
        except duckdb.CatalogException:
            raise VotesError(
                "the results database has no listening tables (built by an older bestofn?): "
                "rebuild it with `snakemake --forcerun database`"
            ) from None
        pairs = group_pairs(con)
        seed = con.execute("SELECT seed FROM trust_settings").fetchone()[0]
        return cls(results_id(results_dir), int(seed), page_build(con, pairs), pairs)


def _parse_time(value) -> datetime:
    t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if t.tzinfo is None:
        raise ValueError("no time zone")
    return t


def check_vote(
    vote, ctx: Context, strict_build: bool = True, shape_only: bool = False
) -> str | None:
    """Why ``vote`` cannot count against ``ctx`` (None when it can). ``shape_only``: only its
    fields and their types, not whether the database still has its group."""
    if not isinstance(vote, dict):
        return f"not an object ({type(vote).__name__})"
    need = ("group_id", "left_take", "right_take", "choice", "listener", "time", "page_seed",
            "order_seed", "build", "pair")  # fmt: skip
    missing = [k for k in need if k not in vote]
    if missing:
        return f"missing field(s) {', '.join(missing)}"
    group = vote["group_id"]
    if not isinstance(group, str) or (group not in ctx.pairs and not shape_only):
        return f"group {group!r} is not in this database"
    listener = vote["listener"]
    if not isinstance(listener, str) or not listener.strip():
        return "listener must be a non-empty name"
    for k in ("left_take", "right_take", "page_seed", "order_seed"):
        if not isinstance(vote[k], int) or isinstance(vote[k], bool):
            return f"{k} must be an integer, got {vote[k]!r}"
    if vote["choice"] not in CHOICES:
        return f"choice must be one of {', '.join(CHOICES)}, got {vote['choice']!r}"
    conf = vote.get("confidence")
    if conf is not None and conf not in CONFIDENCE:
        return f"confidence must be 1, 2, 3 or null, got {conf!r}"
    try:
        _parse_time(vote["time"])
    except (ValueError, TypeError) as e:
        return f"time {vote['time']!r} is not an ISO 8601 time with a zone ({e})"
    if shape_only:
        return None
    if vote["page_seed"] != ctx.seed:
        return f"made on a page with seed {vote['page_seed']}; this database's seed is {ctx.seed}"
    if strict_build and vote["build"] != ctx.build:
        return (
            f"made on a page of build {vote['build']}; this database's page is build "
            f"{ctx.build} (groups or their listening pairs changed since)"
        )
    _, _, order, fingerprint = ctx.pairs[group]
    heard = [vote["left_take"], vote["right_take"]]
    if sorted(heard) != sorted(order):
        return f"takes {heard} are not the pair the page shows for {group} ({sorted(order)})"
    if vote["pair"] != fingerprint:
        return (
            f"the takes of {group} changed since the vote (pair {vote['pair']}, now "
            f"{fingerprint}: regenerated or rescored)"
        )
    if vote["order_seed"] != order_seed(ctx.seed, listener):
        return f"order_seed {vote['order_seed']} is not the seed of listener {listener!r}"
    if heard != left_first(vote["order_seed"], group, order):
        return f"take {heard[0]} on the left is not the seeded order of this listener"
    return None


def read_votes_file(path: str | Path, ctx: Context) -> tuple[dict, list[dict]]:
    """Parse and check one exported file; raise VotesError naming the file and every bad vote
    (the whole file is refused)."""
    try:
        return _read_votes_file(Path(path), ctx)
    except VotesError as e:
        head, _, rest = str(e).partition("\n")
        more = f"\n{rest}" if rest else ""
        raise VotesError(f"{head}; nothing imported from this file{more}") from None


def read_votes_doc(path: Path, ctx: Context) -> dict:
    """A votes file of this results directory, read and checked as a whole (JSON, format,
    results id, a list of votes; each vote is the caller's to check); VotesError names it."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise VotesError(f"{path}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise VotesError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise VotesError(f"{path}: not a bestofn votes file (format {got!r}, want {FORMAT!r})")
    if ctx.results_id is None:
        raise VotesError(f"{path}: the results directory has no listening page yet (no id)")
    if doc.get("results_id") != ctx.results_id:
        raise VotesError(
            f"{path}: votes of another results directory, exported from its listening page "
            f"(results id {doc.get('results_id')!r}, page at {doc.get('results')!r}); this "
            f"one's id is {ctx.results_id!r}"
        )
    if not isinstance(doc.get("votes"), list):
        raise VotesError(f"{path}: 'votes' must be a list")
    return doc


def _read_votes_file(path: Path, ctx: Context) -> tuple[dict, list[dict]]:
    doc = read_votes_doc(path, ctx)
    votes = doc["votes"]
    problems = []
    for i, vote in enumerate(votes):
        why = check_vote(vote, ctx)
        if why:
            group = vote.get("group_id") if isinstance(vote, dict) else None
            problems.append(f"  vote {i}" + (f" (group {group})" if group else "") + f": {why}")
    if problems:
        shown = problems[:20] + ([f"  ... and {len(problems) - 20} more"] if problems[20:] else [])
        raise VotesError(
            f"{path}: {len(problems)} of {len(votes)} vote(s) refused:\n" + "\n".join(shown)
        )
    return doc, votes


def _canonical(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def import_files(db_path: str | Path, results_dir: str | Path, files: list) -> dict:
    """Check each file, keep the accepted ones in the store, then recompute the tables.
    A refused file adds nothing; the others still import. The files are checked against a
    read-only connection: when none is added, the database is not opened for writing, so its
    bytes stay as they were and the workflow's next run redoes nothing. Returns a summary."""
    results_dir = Path(results_dir)
    imported = store_dir(results_dir) / IMPORTED
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        ctx = Context.of(con, results_dir)
        before = _counted_keys(results_dir, ctx)
        accepted, already, errors = [], [], []
        for f in files:
            try:
                doc, _ = read_votes_file(f, ctx)
            except VotesError as e:
                errors.append(str(e))
                continue
            data = _canonical(doc)
            dest = imported / f"{hashlib.sha256(data).hexdigest()[:32]}.json"
            if dest.exists() or any(dest == d for _, d, _ in accepted):
                already.append(str(f))
                continue
            accepted.append((str(f), dest, data))
        if not accepted:
            counts = _counts(compute_votes(con, results_dir))
            return {"added_files": [], "already_imported": already, "errors": errors,
                    "new_votes": 0, **counts}  # fmt: skip
    finally:
        con.close()
    for _, dest, data in accepted:
        imported.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dest)
    con = duckdb.connect(str(db_path))
    try:
        counts = apply_votes(con, results_dir)
        after = _counted_keys(results_dir, ctx)
    finally:
        con.close()
    return {
        "added_files": [f for f, _, _ in accepted],
        "already_imported": already,
        "errors": errors,
        "new_votes": len(after - before),
        **counts,
    }


# --- the tables ------------------------------------------------------------------------------


def stored_files(results_dir: str | Path) -> list[Path]:
    return sorted((store_dir(results_dir) / IMPORTED).glob("*.json"))


def _latest_votes(results_dir, ctx: Context) -> tuple[list[dict], list[tuple]]:
    """Every stored vote, one per (listener, group, pair): the latest. Each gets the file's
    digest, its index, and why it does not count (None when it does)."""
    best: dict[tuple, dict] = {}
    files = []
    for path in stored_files(results_dir):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if any(check_vote(v, ctx, strict_build=False, shape_only=True) for v in doc["votes"]):
                raise ValueError("a vote lacks a field or has a bad value")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise VotesError(
                f"{path}: a stored votes file no longer reads ({e}); it was written by "
                "`bestofn listen import`: restore it, or move it out of the store"
            ) from None
        files.append((path.stem, doc))
        for i, v in enumerate(doc["votes"]):
            v = dict(v, source_file=path.stem, vote_index=i)
            pair = tuple(sorted((v["left_take"], v["right_take"])))
            key = (v["listener"], v["group_id"], pair)
            t = _parse_time(v["time"])
            if key not in best or (t, path.stem) >= (_parse_time(best[key]["time"]),
                                                     best[key]["source_file"]):  # fmt: skip
                best[key] = v
    for v in best.values():
        # A rebuilt database keeps a vote while its group shows the same two takes.
        v["stale"] = check_vote(v, ctx, strict_build=False)
    return sorted(best.values(), key=lambda v: (v["listener"], v["group_id"])), files


def _counted_keys(results_dir, ctx) -> set:
    votes, _ = _latest_votes(results_dir, ctx)
    return {
        (v["listener"], v["group_id"], v["left_take"], v["choice"], v.get("confidence"))
        for v in votes
        if v["stale"] is None
    }


def wilson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return (float("nan"), float("nan"))
    p, z2 = k / n, Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def share_interval(hits: np.ndarray, clusters: np.ndarray, rng) -> tuple[float, float, float]:
    """(share, lo, hi) of ``hits`` (0/1 per vote): bootstrap over clusters, widened to the
    Wilson interval."""
    n = len(hits)
    if n == 0:
        return (float("nan"), float("nan"), float("nan"))
    k = int(hits.sum())
    lo, hi = wilson(k, n)
    _, inverse = np.unique(clusters, return_inverse=True)
    k_c = np.bincount(inverse, weights=hits)
    n_c = np.bincount(inverse).astype(float)
    if len(n_c) >= 2:
        pick = rng.integers(0, len(n_c), (BOOTSTRAP_RESAMPLES, len(n_c)))
        shares = k_c[pick].sum(axis=1) / n_c[pick].sum(axis=1)
        b_lo, b_hi = np.percentile(shares, [2.5, 97.5])
        lo, hi = min(lo, float(b_lo)), max(hi, float(b_hi))
    return k / n, lo, hi


def compute_votes(con, results_dir: str | Path) -> dict[str, list[tuple]]:
    """The rows of every table in TABLES from the store and the (read-only) database."""
    if not stored_files(results_dir):  # the common case: nothing to read from the database
        return {name: [] for name in TABLES}
    ctx = Context.of(con, results_dir)
    votes, files = _latest_votes(results_dir, ctx)
    voted = sorted({v["group_id"] for v in votes})
    scores = {
        (g, t): s
        for g, t, s in con.execute(
            "SELECT group_id, take, score FROM scored WHERE group_id IN (SELECT unnest(?))",
            [voted],
        ).fetchall()
    }
    selected = dict(
        con.execute("SELECT group_id, selected_take FROM groups WHERE status = 'selected'")
        .fetchall()
    )  # fmt: skip
    vote_rows, decided = [], []
    for v in votes:
        g = v["group_id"]
        emotion, prompt_id = ctx.pairs[g][:2] if g in ctx.pairs else g.partition("/")[::2]
        left, right, choice = v["left_take"], v["right_take"], v["choice"]
        chosen = {"left": left, "right": right}.get(choice)
        sel = selected.get(g) if v["stale"] is None else None
        other = right if sel == left else left
        side = None if sel is None else ("left" if sel == left else "right")
        for_sel = None if sel is None or chosen is None else chosen == sel
        s_sel, s_other = scores.get((g, sel)), scores.get((g, other))
        margin = None if sel is None or s_sel is None or s_other is None else s_sel - s_other
        vote_rows.append((
            v["listener"], g, emotion, prompt_id, left, right, choice, chosen,
            v.get("confidence"), _parse_time(v["time"]), v["page_seed"], v["order_seed"],
            v["build"], v["pair"], v["source_file"], v["vote_index"], sel, side,
            for_sel, margin, v["stale"] is None, v["stale"],
        ))  # fmt: skip
        if v["stale"] is None:
            decided.append((v["listener"], g, emotion, choice, for_sel, margin, sel is not None))
    return {
        "listener_votes": vote_rows,
        "listener_agreement": _agreement_rows(decided, ctx.seed),
        "listener_position": _position_rows(decided, ctx.seed),
        "listener_margin": _margin_rows(decided, ctx.seed),
        "listener_files": [
            (stem, d.get("listener"), len(d["votes"]), d.get("exported_at"), d.get("build"))
            for stem, d in files
        ],
    }


def _agreement_rows(decided, seed) -> list[tuple]:
    rows = []
    with_sel = [d for d in decided if d[6]]
    levels = [("overall", None, with_sel)]
    levels += [("emotion", e, [d for d in with_sel if d[2] == e])
               for e in sorted({d[2] for d in with_sel})]  # fmt: skip
    for level, emotion, part in levels:
        dec = [d for d in part if d[3] != "same"]
        hits = np.array([d[4] for d in dec], dtype=float)
        share, lo, hi = share_interval(
            hits, np.array([d[1] for d in dec]), seeded_rng(seed, "votes", "agreement", emotion)
        )
        rows.append(
            (
                level,
                emotion,
                len(part),
                len(dec),
                len(part) - len(dec),
                int(hits.sum()),
                _nan(share),
                _nan(lo),
                _nan(hi),
                BOOTSTRAP_RESAMPLES,
            )
        )
    return rows


def _position_rows(decided, seed) -> list[tuple]:
    rows = []
    for listener in sorted({d[0] for d in decided}):
        part = [d for d in decided if d[0] == listener]
        dec = [d for d in part if d[3] != "same"]
        hits = np.array([d[3] == "left" for d in dec], dtype=float)
        share, lo, hi = share_interval(
            hits, np.array([d[1] for d in dec]), seeded_rng(seed, "votes", "left", listener)
        )
        warn = bool(dec) and (lo > 0.5 or hi < 0.5)
        rows.append((listener, len(part), len(dec), int(hits.sum()), _nan(share), _nan(lo),
                     _nan(hi), warn))  # fmt: skip
    return rows


def _margin_rows(decided, seed) -> list[tuple]:
    part = [d for d in decided if d[6] and d[5] is not None]
    if not part:
        return []
    margins = np.array([d[5] for d in part], dtype=float)
    n_bins = max(1, min(MAX_BINS, len(part) // MIN_PER_BIN))
    edges = np.unique(np.quantile(margins, np.linspace(0, 1, n_bins + 1)))
    if len(edges) < 2:
        edges = np.array([margins.min(), margins.max()])
    which = np.clip(np.searchsorted(edges, margins, side="right") - 1, 0, len(edges) - 2)
    rows = []
    for b in range(len(edges) - 1):
        members = [d for d, w in zip(part, which, strict=True) if w == b]
        dec = [d for d in members if d[3] != "same"]
        hits = np.array([d[4] for d in dec], dtype=float)
        share, lo, hi = share_interval(
            hits, np.array([d[1] for d in dec]), seeded_rng(seed, "votes", "margin", b)
        )
        rows.append(
            (
                b + 1,
                float(edges[b]),
                float(edges[b + 1]),
                len(members),
                len(dec),
                len(members) - len(dec),
                int(hits.sum()),
                _nan(share),
                _nan(lo),
                _nan(hi),
            )
        )
    return rows


def _nan(x: float) -> float | None:
    return None if x is None or x != x else float(x)


_DDL = {
    "listener_votes": "listener VARCHAR, group_id VARCHAR, emotion VARCHAR, prompt_id VARCHAR, "
    "left_take INTEGER, right_take INTEGER, choice VARCHAR, chosen_take INTEGER, "
    "confidence INTEGER, voted_at TIMESTAMPTZ, page_seed BIGINT, order_seed BIGINT, "
    "build VARCHAR, pair_fingerprint VARCHAR, source_file VARCHAR, vote_index INTEGER, "
    "selected_take INTEGER, selected_side VARCHAR, for_selected BOOLEAN, score_margin DOUBLE, "
    "counted BOOLEAN, stale_reason VARCHAR",
    "listener_agreement": "level VARCHAR, emotion VARCHAR, n_votes BIGINT, n_decisive BIGINT, "
    "n_same BIGINT, n_for_selected BIGINT, agreement DOUBLE, agreement_lo DOUBLE, "
    "agreement_hi DOUBLE, resamples INTEGER",
    "listener_position": "listener VARCHAR, n_votes BIGINT, n_decisive BIGINT, n_left BIGINT, "
    "left_share DOUBLE, left_lo DOUBLE, left_hi DOUBLE, warning BOOLEAN",
    "listener_margin": "bin INTEGER, margin_lo DOUBLE, margin_hi DOUBLE, n_votes BIGINT, "
    "n_decisive BIGINT, n_same BIGINT, n_for_selected BIGINT, agreement DOUBLE, "
    "agreement_lo DOUBLE, agreement_hi DOUBLE",
    "listener_files": "file VARCHAR, listener VARCHAR, n_votes BIGINT, exported_at VARCHAR, "
    "build VARCHAR",
}


def apply_votes(con: duckdb.DuckDBPyConnection, results_dir: str | Path) -> dict:
    """(Re)write the TABLES in an open, writable results database from the votes store. The
    ``database`` rule calls this after every rebuild; a store without files writes empty
    tables. Returns counts."""
    rows = compute_votes(con, results_dir)
    con.execute("BEGIN")
    try:
        for name in TABLES:
            con.execute(f"CREATE OR REPLACE TABLE {name} ({_DDL[name]})")
            if rows[name]:
                marks = ", ".join("?" * (_DDL[name].count(",") + 1))
                con.executemany(f"INSERT INTO {name} VALUES ({marks})", rows[name])
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return _counts(rows)


def _counts(rows: dict) -> dict:
    votes = rows["listener_votes"]
    return {
        "files": len(rows["listener_files"]),
        "votes": len(votes),
        "counted": sum(1 for v in votes if v[20]),
        "stale": sum(1 for v in votes if not v[20]),
    }


def reapply(db_path: str | Path, results_dir: str | Path) -> dict:
    """:func:`apply_votes` on a database file (for the ``database`` rule after a rebuild)."""
    con = duckdb.connect(str(db_path))
    try:
        return apply_votes(con, results_dir)
    finally:
        con.close()
