"""The takes an export holds, read from the database through SQL, and their split.

Selection is recomputed from ``takes`` with the config's filter and score (so that
``--which passing`` can give every passing take its rank) and must agree with the
``selection`` table: a config changed since the database was built is refused, not exported
under the wrong card."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from bestofn.export.settings import ExportError, ExportSettings
from bestofn.select.rewards import DEFAULT, rank_window, scored_sql

# Per-group timings and worker bookkeeping of the takes table: throughput, not training data.
# Every other takes column (scores, text, seed, provenance) is exported as it is typed.
THROUGHPUT_COLUMNS = {
    "flac_path", "host", "group_generate_s", "group_restore_s", "group_score_s", "group_load_s",
    "worker_idle_s", "score_seconds", "worker_slot", "worker_pid", "slurm_job_id", "started_at",
    "group_write_s", "group_wall_s", "group_generate_gpu_s", "group_restore_gpu_s",
    "group_score_gpu_s", "score_gpu_seconds", "overlap",
}  # fmt: skip


def _one_expression(sql: str, what: str) -> None:
    if not sql.strip() or ";" in sql:
        raise ExportError(f"{what} must be one SQL expression, got {sql!r}")


def ranked_sql(filter_sql: str, score_sql: str) -> str:
    """Every take with its score, whether it passes and its rank among the group's passing
    takes (1 = the selected one; NULL when it does not pass), as the selection orders them."""
    return f"""
        WITH scored AS ({scored_sql(filter_sql, score_sql)})
        SELECT *, CASE WHEN passes THEN {rank_window("group_id, passes")} END::INTEGER AS rank
        FROM scored"""


def _tables(con) -> set[str]:
    return {
        r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
    }


def reward_sql(con, selection: dict, name: str) -> tuple[str, str, int]:
    """The reward ``name``'s filter and score with their scales written out, and its top: as
    the database recorded them when the config's SQL is the one it was built with, else (a
    database from before named rewards; the default reward only) resolved over its takes."""
    from bestofn.select.base import SelectionError
    from bestofn.select.database import resolve_norm
    from bestofn.select.rewards import reward_named, rewards_of

    try:
        reward = reward_named(rewards_of(selection), name)
    except SelectionError as e:
        raise ExportError(str(e)) from None
    _one_expression(reward.filter, f"reward {name}: filter")
    _one_expression(reward.score, f"reward {name}: score")
    if "rewards" in _tables(con):
        row = con.execute(
            "SELECT filter, score, resolved_filter, resolved_score, top FROM rewards "
            "WHERE name = ?",
            [name],
        ).fetchone()
        if row and (row[0], row[1]) == (reward.filter, reward.score):
            return row[2], row[3], reward.top
        if name != DEFAULT:
            built = f"filter {row[0]!r}, score {row[1]!r}" if row else "no such reward"
            raise ExportError(
                f"reward {name!r}: the database was built with {built}; the config has filter "
                f"{reward.filter!r}, score {reward.score!r}: run `bestofn select` with this "
                "config first"
            )
    elif name != DEFAULT:
        raise ExportError(
            f"reward {name!r}: the database has no named rewards: run `bestofn select` first"
        )
    try:  # scales: over every take of the run, as the database's selection was built
        filter_sql, score_sql = resolve_norm(con, "takes", reward.filter, reward.score)
    except SelectionError as e:
        raise ExportError(str(e)) from None
    return filter_sql, score_sql, reward.top


def open_database(results: Path) -> duckdb.DuckDBPyConnection:
    db = results / "bestofn.duckdb"
    if not db.is_file():
        raise ExportError(f"{db} does not exist: run the workflow (snakemake) first")
    con = duckdb.connect(str(db), read_only=True)
    tables = {
        r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
    }
    missing = {"takes", "selection", "groups"} - tables
    if missing:
        con.close()
        raise ExportError(f"{db} lacks the table(s) {sorted(missing)}: rebuild it (snakemake)")
    return con


def select_rows(
    con: duckdb.DuckDBPyConnection, settings: ExportSettings, selection: dict
) -> pa.Table:
    """The exported takes' rows (no audio), ordered by group finish time, group and take: a
    group that finishes later lands after every row already exported. ``settings.reward``
    (None: the default reward) ranks them; with a reward named, each row also carries
    ``reward`` and ``rewards`` (every reward the take won in the database's selection)."""
    _one_expression(selection["filter"], "selection.filter")
    _one_expression(selection["score"], "selection.score")
    name = settings.reward or DEFAULT
    filter_sql, score_sql, top = reward_sql(con, selection, name)
    try:
        con.execute(f"CREATE TEMP VIEW export_ranked AS {ranked_sql(filter_sql, score_sql)}")
        con.execute("SELECT * FROM export_ranked LIMIT 0").fetchall()
    except duckdb.Error as e:
        raise ExportError(f"the config's selection SQL does not fit the takes table: {e}") from None
    if settings.where is not None:
        _one_expression(settings.where, "--where")
        try:
            con.execute(f"SELECT * FROM export_ranked WHERE ({settings.where}) LIMIT 0").fetchall()
        except duckdb.Error as e:
            known = [r[0] for r in con.execute("DESCRIBE export_ranked").fetchall()]
            raise ExportError(
                f"--where {settings.where!r} does not fit the takes columns: {e}\n"
                f"known columns: {', '.join(known)}"
            ) from None
    picked = "SELECT group_id, take FROM selection"
    if name != DEFAULT:  # the reward's own picks, as the database keeps them
        picked = f"SELECT group_id, take FROM reward_picks WHERE rank = 1 AND reward = '{name}'"
    differ = con.execute(
        f"""SELECT count(*) FROM (
               (SELECT group_id, take FROM export_ranked WHERE rank = 1 EXCEPT {picked})
               UNION ALL
               ({picked} EXCEPT SELECT group_id, take FROM export_ranked WHERE rank = 1))"""
    ).fetchone()[0]
    if differ:
        raise ExportError(
            f"the config's selection (filter {filter_sql!r}, score {score_sql!r}) picks other "
            f"takes than the database's selection table in {differ} case(s): rebuild the "
            "database with this config (snakemake) or export with the config it was built with"
        )
    best = f"rank <= {int(settings.top)}" if settings.top else "rank = 1"
    which = {"selected": best, "passing": "passes", "all": "true"}[settings.which]
    where = f" AND ({settings.where})" if settings.where else ""
    cols = [r[0] for r in con.execute("DESCRIBE export_ranked").fetchall()]
    keep = ", ".join(f'"{c}"' for c in cols if c not in THROUGHPUT_COLUMNS or c == "flac_path")
    won, joined = "", ""
    if settings.reward:
        won = f", '{name}' AS reward, coalesce(w.rewards, []::VARCHAR[]) AS rewards"
        joined = " LEFT JOIN reward_selection w USING (group_id, take)"
        keep = ", ".join(
            f'r."{c}"' for c in cols if c not in THROUGHPUT_COLUMNS or c == "flac_path"
        )
    return con.sql(
        f"""SELECT {keep}{won},
                   max(finished_at) OVER (PARTITION BY group_id) AS _group_finished
            FROM export_ranked r{joined} WHERE {which}{where}
            ORDER BY _group_finished NULLS FIRST, group_id, take"""
    ).to_arrow_table()


def split_of(keys: list[str], fractions: dict, seed: int) -> list[str]:
    """Each key's split: the first 8 bytes of sha256(seed, key) as a number in [0, 1) against
    the cumulative shares. Stable across runs, machines and row orders."""
    names = list(fractions)
    edges = np.cumsum([fractions[n] for n in names], dtype=float)
    edges /= edges[-1]
    out, memo = [], {}
    for key in keys:
        if key not in memo:
            digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
            u = int.from_bytes(digest[:8], "big") / 2.0**64
            memo[key] = names[min(int(np.searchsorted(edges, u, side="right")), len(names) - 1)]
        out.append(memo[key])
    return out
