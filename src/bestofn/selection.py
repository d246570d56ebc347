"""DuckDB tables over every group's scores.parquet: takes, groups, selection, throughput.

The filter and score are SQL expressions from the config. They are checked against the takes
columns the configured scorers declare before any generation starts (``check_selection``)."""

from __future__ import annotations

from pathlib import Path

import duckdb

# Columns every scores.parquet has, whatever the scorers (see docs in config/README.md).
BASE_COLUMNS = {
    "group_id": "VARCHAR",
    "emotion": "VARCHAR",
    "prompt_id": "VARCHAR",
    "take": "INTEGER",
    "seed": "BIGINT",
    "text": "VARCHAR",
    "flac_path": "VARCHAR",
    "duration_s": "DOUBLE",
    "sample_rate": "INTEGER",
    "channels": "INTEGER",
    "n_frames": "INTEGER",  # codec frames generated (NULL for generators without frames)
    "truncated": "BOOLEAN",  # cut by the frame budget
    "stop_reason": "VARCHAR",  # 'eos' | 'budget' | 'empty'
    "reference_audio": "VARCHAR",
    "generator": "VARCHAR",
    "models": "VARCHAR",
    "models_hash": "VARCHAR",
    "spec_hash": "VARCHAR",
    "bestofn_version": "VARCHAR",
    "host": "VARCHAR",
    "group_generate_s": "DOUBLE",
    "group_restore_s": "DOUBLE",
    "group_score_s": "DOUBLE",
    "group_load_s": "DOUBLE",
    "worker_idle_s": "DOUBLE",
    "score_seconds": "VARCHAR",
    "device": "VARCHAR",
    "worker_slot": "INTEGER",
    "worker_pid": "BIGINT",
    "slurm_job_id": "VARCHAR",  # the SLURM job whose worker wrote the group ('' outside SLURM)
    "started_at": "TIMESTAMPTZ",
    "group_write_s": "DOUBLE",
    "group_wall_s": "DOUBLE",
    "finished_at": "TIMESTAMPTZ",
    # GPU time per stage (CUDA-event spans on the stage's stream; NULL off CUDA) and how the
    # worker overlapped groups ('off', 'host', 'full'); older parquets lack them (NULL)
    "group_generate_gpu_s": "DOUBLE",
    "group_restore_gpu_s": "DOUBLE",
    "group_score_gpu_s": "DOUBLE",
    "score_gpu_seconds": "VARCHAR",
    "overlap": "VARCHAR",
}


class SelectionError(ValueError):
    pass


def _scored_sql(filter_sql: str, score_sql: str, source: str = "takes") -> str:
    return (
        f"SELECT *, ({score_sql})::DOUBLE AS score, "
        f"coalesce(({filter_sql})::BOOLEAN, false) AS passes FROM {source}"
    )


def check_selection(
    filter_sql: str, score_sql: str, columns: dict[str, str], strict: bool = True
) -> None:
    """Bind the selection SQL against an empty takes table with ``columns``.

    ``strict=False`` (some scorer only knows its columns after loading weights) still catches
    syntax errors but lets unknown column names through."""
    con = duckdb.connect()
    cols = ", ".join(f'"{c}" {t}' for c, t in columns.items())
    con.execute(f"CREATE TABLE takes ({cols})")
    for name, sql in (("filter", filter_sql), ("score", score_sql)):
        if not sql.strip() or ";" in sql:
            raise SelectionError(f"selection.{name} must be one SQL expression, got {sql!r}")
    try:
        con.execute(_scored_sql(filter_sql, score_sql) + " LIMIT 0").fetchall()
    except duckdb.BinderException as e:
        if strict:
            raise SelectionError(
                f"selection SQL does not fit the takes columns: {e}\n"
                f"filter: {filter_sql}\nscore: {score_sql}\nknown columns: {sorted(columns)}"
            ) from None
    except duckdb.Error as e:
        raise SelectionError(
            f"selection SQL is invalid: {e}\nfilter: {filter_sql}\nscore: {score_sql}"
        ) from None


def build_database(
    parquets: list[str | Path],
    db_path: str | Path,
    filter_sql: str,
    score_sql: str,
    held_out: list | None = None,
    seed: int = 0,
) -> dict:
    """(Re)build the DuckDB file from group parquets. Returns a few counts for the log.

    ``held_out`` (selection.held_out) and ``seed`` feed the trust tables (bestofn.trust):
    held-out comparisons, per-score gains, correlations, the filter funnel, listening order."""
    db_path = Path(db_path)
    tmp = db_path.with_suffix(".tmp.duckdb")
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    files = [str(p) for p in parquets]
    con.execute(
        "CREATE TABLE takes AS SELECT * FROM read_parquet(?, union_by_name = true)", [files]
    )
    have = {r[0] for r in con.execute("DESCRIBE takes").fetchall()}
    for col in (  # older parquets may lack them
        "host", "worker_pid", "slurm_job_id", "group_generate_gpu_s", "group_restore_gpu_s",
        "group_score_gpu_s", "score_gpu_seconds", "overlap",
    ):  # fmt: skip
        if col not in have:
            con.execute(f"ALTER TABLE takes ADD COLUMN {col} {BASE_COLUMNS[col]}")
    try:
        con.execute(f"CREATE VIEW scored AS {_scored_sql(filter_sql, score_sql)}")
        con.execute("SELECT count(*) FROM scored").fetchall()
    except duckdb.Error as e:
        raise SelectionError(f"selection SQL failed on the takes table: {e}") from None
    con.execute(
        """
        CREATE TABLE selection AS
        SELECT * EXCLUDE (passes) FROM scored WHERE passes
        QUALIFY row_number() OVER (PARTITION BY group_id ORDER BY score DESC NULLS LAST, take) = 1
        ORDER BY group_id
        """
    )
    con.execute(
        """
        CREATE TABLE groups AS
        SELECT s.group_id, any_value(s.emotion) AS emotion, any_value(s.prompt_id) AS prompt_id,
               count(*) AS n_takes, count(*) FILTER (WHERE s.passes) AS n_pass,
               max(s.score) FILTER (WHERE s.passes) AS best_score,
               median(s.score) AS median_score,
               max(s.score) FILTER (WHERE s.passes) - median(s.score) AS best_minus_median,
               any_value(sel.take) AS selected_take, any_value(sel.flac_path) AS selected_flac,
               CASE WHEN count(*) FILTER (WHERE s.passes) = 0 THEN 'no_take_passed'
                    ELSE 'selected' END AS status
        FROM scored s LEFT JOIN selection sel USING (group_id)
        GROUP BY s.group_id ORDER BY s.group_id
        """
    )
    con.execute("CREATE VIEW unselected AS SELECT * FROM groups WHERE status <> 'selected'")
    con.execute(
        """
        CREATE TABLE throughput AS
        WITH per_group AS (
            SELECT group_id, count(*) AS clips, sum(duration_s) AS audio_s,
                   any_value(group_wall_s) AS wall_s, any_value(group_load_s) AS load_s,
                   any_value(group_generate_s) AS generate_s,
                   any_value(group_restore_s) AS restore_s,
                   any_value(group_score_s) AS score_s, any_value(group_write_s) AS write_s,
                   any_value(worker_idle_s) AS idle_s, any_value(device) AS device,
                   min(started_at) AS started_at, max(finished_at) AS finished_at,
                   any_value(host) || ':' || any_value(worker_pid) AS worker,
                   coalesce(any_value(slurm_job_id), '') AS slurm_job_id,
                   any_value(group_generate_gpu_s) AS generate_gpu_s,
                   any_value(group_restore_gpu_s) AS restore_gpu_s,
                   any_value(group_score_gpu_s) AS score_gpu_s,
                   any_value(overlap) AS overlap
            FROM takes GROUP BY group_id
        ), levels AS (
            SELECT 'group' AS level, group_id, device, clips, audio_s, wall_s, load_s, generate_s,
                   restore_s, score_s, write_s, idle_s, started_at, finished_at, worker,
                   slurm_job_id, 1 AS groups, (load_s > 0)::INTEGER AS loads, generate_gpu_s,
                   restore_gpu_s, score_gpu_s, overlap, 1 AS n_workers FROM per_group
            UNION ALL
            -- One row per worker process: on SLURM, one per job (its bundle of groups).
            SELECT 'worker', NULL, string_agg(DISTINCT device, ','), sum(clips), sum(audio_s),
                   sum(wall_s), sum(load_s), sum(generate_s), sum(restore_s), sum(score_s),
                   sum(write_s), sum(idle_s), min(started_at), max(finished_at), worker,
                   any_value(slurm_job_id), count(*), count(*) FILTER (WHERE load_s > 0),
                   sum(generate_gpu_s), sum(restore_gpu_s), sum(score_gpu_s),
                   string_agg(DISTINCT overlap, ','), 1
            FROM per_group GROUP BY worker
            UNION ALL
            SELECT 'overall', NULL, string_agg(DISTINCT device, ','), sum(clips), sum(audio_s),
                   sum(wall_s), sum(load_s), sum(generate_s), sum(restore_s), sum(score_s),
                   sum(write_s), sum(idle_s), min(started_at), max(finished_at), NULL, NULL,
                   count(*), count(*) FILTER (WHERE load_s > 0), sum(generate_gpu_s),
                   sum(restore_gpu_s), sum(score_gpu_s), string_agg(DISTINCT overlap, ','),
                   count(DISTINCT worker)
            FROM per_group
        )
        SELECT level, group_id, device, clips, audio_s,
               wall_s, load_s, generate_s, restore_s, score_s, write_s, idle_s,
               generate_s / clips AS generate_s_per_clip, restore_s / clips AS restore_s_per_clip,
               score_s / clips AS score_s_per_clip, write_s / clips AS write_s_per_clip,
               wall_s / clips AS wall_s_per_clip, audio_s / wall_s AS audio_s_per_wall_s,
               epoch(finished_at - started_at) AS elapsed_s, started_at, finished_at,
               worker, slurm_job_id, groups, loads,
               -- worker time spent waiting between groups, of (working + waiting)
               idle_s / nullif(wall_s + idle_s, 0) AS idle_fraction,
               -- GPU time per stage (CUDA events; NULL off CUDA), and the GPUs' busy share of
               -- the elapsed time (first group start to last group end of the row; overall:
               -- of the elapsed time x the workers, one GPU each)
               generate_gpu_s, restore_gpu_s, score_gpu_s,
               generate_gpu_s + restore_gpu_s + score_gpu_s AS gpu_busy_s,
               (generate_gpu_s + restore_gpu_s + score_gpu_s) / clips AS gpu_busy_s_per_clip,
               (generate_gpu_s + restore_gpu_s + score_gpu_s)
                   / nullif(epoch(finished_at - started_at) * n_workers, 0) AS gpu_busy_fraction,
               overlap
        FROM levels ORDER BY level DESC, worker, group_id
        """
    )
    from bestofn.trust import build_trust_tables

    try:
        build_trust_tables(con, filter_sql, held_out, seed)
    except SelectionError:
        con.close()
        raise
    counts = dict(
        takes=con.execute("SELECT count(*) FROM takes").fetchone()[0],
        groups=con.execute("SELECT count(*) FROM groups").fetchone()[0],
        selected=con.execute("SELECT count(*) FROM selection").fetchone()[0],
    )
    con.close()
    tmp.replace(db_path)
    Path(str(tmp) + ".wal").unlink(missing_ok=True)
    return counts
