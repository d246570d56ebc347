"""DuckDB tables over every group's scores.parquet: takes, groups, selection, throughput.

The filter and score are SQL expressions from the config. They are checked against the takes
columns the configured scorers declare before any generation starts (``check_selection``)."""

from __future__ import annotations

import re
from contextlib import closing
from pathlib import Path

import duckdb

from bestofn.select import rewards, scales, trust
from bestofn.select.arrow_io import insert_arrow
from bestofn.select.base import BASE_COLUMNS, SelectionError
from bestofn.select.held_out import is_numeric

__all__ = [
    "build_database", "check_rewards", "check_selection",
    "normed_columns",
    "open_read_only", "resolve_norm",
]  # fmt: skip

# DuckDB's own memory (config: database.memory_limit, passed in by the rule) bounds the rule
# whatever the run's size: past it, sorts, joins and aggregates spill to a temporary directory
# beside the database (under results/). The rest of the process holds one chunk of takes
# (CHUNK_TAKES) and per-group rows.
CHUNK_TAKES = 32_768  # takes per chunk of whole groups (files)
# The whole build is one transaction: DuckDB then writes the appended takes' row groups
# straight to the file as they fill, not through the WAL (an append per chunk outside a
# transaction went through the WAL: several times slower). The chunk's own tables live in an
# in-memory database of their own (_work_database), outside that transaction: inside it, every
# chunk's deleted and updated rows were kept until the commit (peak RSS growing with the run).
FIRST_CHUNK_FILES = 64
# Files per chunk at most: each open parquet reader holds its footer and buffers (outside
# DuckDB's memory_limit), so the peak grows with the files a chunk opens: 512 keeps the database
# rule within its default limit (ledger figure final_rules.peak_rss_4m), where several
# thousand ran DuckDB out of it.
MAX_CHUNK_FILES = 512
# Shares of database.memory_limit while the chunks are read: the work database's (one chunk) and
# the build's connection's, which then only appends (takes and per-group rows). Its buffer pool
# kept every written block of takes and the per-group rows in memory up to the whole limit
# (growing with the run); capped, DuckDB evicts the written
# blocks and spills the per-group rows, so the peak follows the chunk, not the run. The whole
# limit is back for the final tables (sorts, trust tables), after the work database is closed.
WORK_MEMORY_SHARE = 0.5
APPEND_MEMORY_SHARE = 0.25
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "bytes": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


def memory_share(limit: str, share: float) -> str:
    """``share`` of a DuckDB memory limit such as ``1GB`` (DuckDB's units: GB = 10^9 bytes,
    GiB = 2^30), in bytes; a limit of another form (``80%``) is returned as it is."""
    m = _SIZE.match(limit)
    if not m or m[2].lower() not in _UNITS:
        return limit
    return f"{int(float(m[1]) * _UNITS[m[2].lower()] * share)} bytes"


# Group-level columns older parquets may lack (added as NULL)
_LATE_COLUMNS = (
    "host", "worker_pid", "slurm_job_id", "group_generate_gpu_s", "group_restore_gpu_s",
    "group_score_gpu_s", "score_gpu_seconds", "overlap",
)  # fmt: skip


def _scored_sql(filter_sql: str, score_sql: str, source: str = "takes") -> str:
    return rewards.scored_sql(filter_sql, score_sql, source)


# Scales (norm, z, ei_spec: bestofn.select.scales) are written out with the run's statistics
# before the SQL runs: over the group parquets (_resolve_files), or over a table (resolve_norm).
def normed_columns(filter_sql: str, score_sql: str) -> list[str]:
    """The measures the selection scales (norm, z), in first-seen order."""
    return scales.scaled_columns(("filter", filter_sql), ("score", score_sql))


def resolve_norm(
    con, source: str, filter_sql: str, score_sql: str, context: rewards.Context | None = None
) -> tuple[str, str]:
    """The filter and score with their scales written out over every take in ``source`` (a
    table on ``con``, e.g. the results database's ``takes``); a scaled column the takes lack is
    refused by name."""
    reward = rewards.Reward(rewards.DEFAULT, filter_sql, score_sql)
    (out,) = rewards.resolve_over(con, source, [reward], context or rewards.Context())
    return out.filter, out.score


def _resolve_files(files: list[str], all_rewards, context, memory_limit):
    """The rewards resolved over the group parquets, MAX_CHUNK_FILES files at a time (their
    footers and the scaled columns only are read)."""
    columns = rewards.scaled_measures(all_rewards)
    uses_spec = any(scales.uses_spec(f"{r.filter} {r.score}") for r in all_rewards)
    if not columns and not uses_spec:  # nothing to write out: no file is read
        return all_rewards
    spec = None
    ranges: scales.Ranges = {}
    source = "read_parquet(?, union_by_name = true)"
    with closing(duckdb.connect()) as con:
        con.execute("SET memory_limit = ?", [memory_limit])
        if uses_spec:  # ei_spec's heads: the columns of the first files (every group has them)
            described = con.execute(f"DESCRIBE SELECT * FROM {source}", [files[:MAX_CHUNK_FILES]])
            spec = context.spec([r[0] for r in described.fetchall()])
        for start in range(0, len(files), MAX_CHUNK_FILES) if columns else ():
            batch = files[start : start + MAX_CHUNK_FILES]
            scales.merge(ranges, scales.collect(con, source, columns, spec, [batch]))
    return rewards.resolved(all_rewards, ranges, spec)


def check_selection(
    filter_sql: str,
    score_sql: str,
    columns: dict[str, str],
    strict: bool = True,
    context: rewards.Context | None = None,
    name: str = "selection",
) -> None:
    """Bind the selection SQL (one reward's filter and score) against an empty takes table with
    ``columns`` (and ``class`` where the emotions sheet gives one: ``context``).

    ``strict=False`` (some scorer only knows its columns after loading weights) still catches
    syntax errors but lets unknown column names through."""
    context = context or rewards.Context()
    columns = dict(columns)
    if context.classes is not None:
        columns.setdefault("class", "VARCHAR")
    con = duckdb.connect()
    cols = ", ".join(f'"{c}" {t}' for c, t in columns.items())
    con.execute(f"CREATE TABLE takes ({cols})")
    for what, sql in (("filter", filter_sql), ("score", score_sql)):
        if not sql.strip() or ";" in sql:
            raise SelectionError(f"{name}.{what} must be one SQL expression, got {sql!r}")
    known = {c.lower(): t for c, t in columns.items()}
    if context.classes is None and scales.uses_class(f"{filter_sql} {score_sql}"):
        # not left to the database rule, after the GPU work: unknown columns pass unchecked
        # while some scorer's columns are unknown (strict=False)
        raise SelectionError(
            f"{name} reads the column class, and the emotions sheet has no class column "
            "(speech | nonverbal): add it to the sheet, or leave class out of the SQL"
        )
    if scales.uses_spec(filter_sql + score_sql) and len(context.heads) < 2:
        # caught here, not when the database is built after the GPU work
        raise SelectionError(
            f"{name}: ei_spec compares a group's own Empathic-Insight head with the other "
            f"emotions' heads, and the emotions sheet maps its emotions to "
            f"{len(context.heads)} head(s): it needs two or more (or score by ei_target)"
        )
    spec = context.spec(columns)
    if spec is None and not strict and (scales.uses_spec(filter_sql + score_sql)):
        spec = "(NULL::DOUBLE)"  # the heads are known once the scorer loads its weights
    written = scales.scale_calls(("filter", filter_sql), ("score", score_sql))
    for col in normed_columns(filter_sql, score_sql):
        if col.lower() == scales.SPEC:
            continue
        if strict and col.lower() not in known:
            raise SelectionError(
                f"{name}: {written[col.lower()]} names {col!r}, which no configured scorer "
                f"writes; known columns: {sorted(columns)}"
            )
        if col.lower() in known and not is_numeric(known[col.lower()]):
            raise SelectionError(
                f"{name}: {written[col.lower()]}: {col!r} is {known[col.lower()]}, not a number"
            )
    # scales bound with unit statistics to check the SQL: the run's own are known once it is
    # scored
    unit = scales.unit_ranges(normed_columns(filter_sql, score_sql))
    filter_sql = scales.expand(filter_sql, unit, spec, f"{name}.filter")
    score_sql = scales.expand(score_sql, unit, spec, f"{name}.score")
    try:
        con.execute(_scored_sql(filter_sql, score_sql) + " LIMIT 0").fetchall()
    except duckdb.BinderException as e:
        if strict:
            raise SelectionError(
                f"{name} SQL does not fit the takes columns: {e}\n"
                f"filter: {filter_sql}\nscore: {score_sql}\nknown columns: {sorted(columns)}"
            ) from None
    except duckdb.Error as e:
        raise SelectionError(
            f"{name} SQL is invalid: {e}\nfilter: {filter_sql}\nscore: {score_sql}"
        ) from None


def check_rewards(
    selection: dict, columns: dict[str, str], strict: bool = True, context=None
) -> list[rewards.Reward]:
    """check_selection for every reward of the config (``default`` and selection.rewards)."""
    all_rewards = rewards.rewards_of(selection)
    for r in all_rewards:
        where = "selection" if r.name == rewards.DEFAULT else f"selection.rewards.{r.name}"
        check_selection(r.filter, r.score, columns, strict, context, where)
    return all_rewards


def _next_chunk(files: list[str], start: int, rows: int) -> list[str]:
    """The files of the chunk after ``start`` files of ``rows`` takes: about CHUNK_TAKES takes
    (whole files: whole groups), sized by the takes per file so far."""
    if not start:
        return files[:FIRST_CHUNK_FILES]
    size = min(MAX_CHUNK_FILES, max(1, int(CHUNK_TAKES * start / max(rows, 1))))
    return files[start : start + size]


def _read_chunks(work, files: list[str], union: list[tuple], chunked: bool):
    """Yield each chunk's files once its takes are in ``chunk_scored`` on ``work``; while the
    caller works on one chunk, the next is read on a second connection of the work database
    into ``chunk_next`` (the reads are half the rule's time and run on one thread: the other
    core reads meanwhile)."""
    from concurrent.futures import ThreadPoolExecutor

    reader = work.cursor()
    start, rows = 0, 0
    chunk = _next_chunk(files, 0, 0) if chunked else files
    with ThreadPoolExecutor(1, thread_name_prefix="bestofn-read") as pool:
        pending = pool.submit(_read_chunk, reader, chunk, union)
        while pending is not None:
            rows += pending.result()
            start += len(chunk)
            work.execute("DROP TABLE IF EXISTS chunk_scored")
            work.execute("ALTER TABLE chunk_next RENAME TO chunk_scored")
            following = _next_chunk(files, start, rows)
            pending = pool.submit(_read_chunk, reader, following, union) if following else None
            yield chunk
            chunk = following
    reader.close()


_PER_GROUP_SQL = """
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
    FROM chunk_scored GROUP BY group_id
"""

_GROUPS_SQL = """
    SELECT s.group_id, any_value(s.emotion) AS emotion, any_value(s.prompt_id) AS prompt_id,
           count(*) AS n_takes, count(*) FILTER (WHERE s.passes) AS n_pass,
           max(s.score) FILTER (WHERE s.passes) AS best_score,
           median(s.score) AS median_score,
           max(s.score) FILTER (WHERE s.passes) - median(s.score) AS best_minus_median,
           any_value(sel.take) AS selected_take, any_value(sel.flac_path) AS selected_flac,
           CASE WHEN count(*) FILTER (WHERE s.passes) = 0 THEN 'no_take_passed'
                ELSE 'selected' END AS status
    FROM chunk_scored s LEFT JOIN chunk_selection sel USING (group_id)
    GROUP BY s.group_id
"""

_THROUGHPUT_SQL = """
    CREATE TABLE throughput AS
    WITH levels AS (
        SELECT 'group' AS level, group_id, device, clips, audio_s, wall_s, load_s, generate_s,
               restore_s, score_s, write_s, idle_s, started_at, finished_at, worker,
               slurm_job_id, 1 AS groups, (load_s > 0)::INTEGER AS loads, generate_gpu_s,
               restore_gpu_s, score_gpu_s, overlap, 1 AS n_workers FROM part_per_group
        UNION ALL
        -- One row per worker process: on SLURM, one per job (its bundle of groups).
        SELECT 'worker', NULL, string_agg(DISTINCT device, ','), sum(clips), sum(audio_s),
               sum(wall_s), sum(load_s), sum(generate_s), sum(restore_s), sum(score_s),
               sum(write_s), sum(idle_s), min(started_at), max(finished_at), worker,
               any_value(slurm_job_id), count(*), count(*) FILTER (WHERE load_s > 0),
               sum(generate_gpu_s), sum(restore_gpu_s), sum(score_gpu_s),
               string_agg(DISTINCT overlap, ','), 1
        FROM part_per_group GROUP BY worker
        UNION ALL
        SELECT 'overall', NULL, string_agg(DISTINCT device, ','), sum(clips), sum(audio_s),
               sum(wall_s), sum(load_s), sum(generate_s), sum(restore_s), sum(score_s),
               sum(write_s), sum(idle_s), min(started_at), max(finished_at), NULL, NULL,
               count(*), count(*) FILTER (WHERE load_s > 0), sum(generate_gpu_s),
               sum(restore_gpu_s), sum(score_gpu_s), string_agg(DISTINCT overlap, ','),
               count(DISTINCT worker)
        FROM part_per_group
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


def database_defaults() -> dict:
    """The ``database:`` settings' defaults, as the config schema declares them."""
    from bestofn.schemas import schema

    props = schema("config")["properties"]["database"]["properties"]
    return {key: sub["default"] for key, sub in props.items()}


def open_read_only(db_path: str | Path, database: dict | None = None):
    """A read-only connection to the results database with the config's ``database:``
    settings (None: the schema's defaults). DuckDB keeps the blocks it reads cached up to its
    memory limit, 80 % of the RAM by default: the report over 4M takes peaked at 1.95 GB
    without a limit, 0.70 GB with 500MB. Every connection of one process to the file must
    pass the same settings (DuckDB refuses a second configuration)."""
    given = {key: value for key, value in (database or {}).items() if value is not None}
    settings = {**database_defaults(), **given}  # None: the default, as for build_database
    config = {"memory_limit": settings["memory_limit"]}
    if settings.get("threads"):
        config["threads"] = int(settings["threads"])
    return duckdb.connect(str(db_path), read_only=True, config=config)


class _SplitGroup(Exception):
    """A group's takes came in files of two chunks (not the results layout)."""


def build_database(
    parquets: list[str | Path],
    db_path: str | Path,
    filter_sql: str,
    score_sql: str,
    held_out: list | None = None,
    seed: int = 0,
    directions: dict[str, str] | None = None,
    memory_limit: str | None = None,
    threads: int | None = None,
    named_rewards: dict | None = None,
    context: rewards.Context | None = None,
) -> dict:
    """(Re)build the DuckDB file from group parquets. Returns a few counts for the log.

    ``memory_limit`` and ``threads`` are DuckDB's (config ``database:``; None: the schema's
    default memory and DuckDB's threads). ``held_out`` (selection.held_out), ``seed`` and
    ``directions`` (which way is better per column, as the scorers declare it:
    bestofn.select.held_out.scorer_directions) feed the trust tables (bestofn.select.trust):
    held-out comparisons, per-score gains, correlations, the filter funnel, listening order.

    The parquets are read by DuckDB in chunks of whole files (a group is one file), each
    chunk once: its takes are appended to ``takes`` and reduced to per-group rows and sums,
    so memory follows the chunk (and DuckDB's ``memory_limit``), time the takes. A group
    whose takes span files of two chunks makes one pass over all files instead.

    ``filter_sql``/``score_sql`` are the reward ``default`` (the ``selection`` table);
    ``named_rewards`` (selection.rewards) adds more, kept in the per-reward tables
    (bestofn.select.rewards) with ``default``. ``context`` (the emotions sheet's part:
    rewards.context_of) gives the takes a ``class`` column where the sheet has one, and the
    heads of ``ei_spec``."""
    db_path = Path(db_path)
    files = [str(p) for p in parquets]
    if memory_limit is None:  # a library call: the config schema's default (database:)
        memory_limit = database_defaults()["memory_limit"]
    context = context or rewards.Context()
    configured = rewards.rewards_of(
        {"filter": filter_sql, "score": score_sql, "rewards": named_rewards}
    )
    resolved = _resolve_files(files, configured, context, memory_limit)
    picks = (configured, resolved, context)
    try:
        return _build(files, db_path, held_out, seed, directions, memory_limit, threads, picks,
                      chunked=True)  # fmt: skip
    except _SplitGroup:
        return _build(files, db_path, held_out, seed, directions, memory_limit, threads, picks,
                      chunked=False)  # fmt: skip


def _build(files, db_path: Path, held_out, seed, directions, memory_limit, threads, picks,
           chunked: bool) -> dict:  # fmt: skip
    configured, resolved, context = picks
    filter_sql, score_sql = resolved[0].filter, resolved[0].score
    tmp = db_path.with_suffix(".tmp.duckdb")
    tmp.unlink(missing_ok=True)
    spill = db_path.parent / ".duckdb-tmp"
    con = duckdb.connect(str(tmp))
    try:
        con.execute("SET memory_limit = ?", [memory_limit])
        if threads:
            con.execute("SET threads = ?", [int(threads)])
        con.execute(f"SET temp_directory = '{spill}'")
        con.execute("BEGIN")
        _fill(con, files, filter_sql, score_sql, held_out, seed, directions, spill,
              memory_limit, chunked, context)  # fmt: skip
        rewards.write_reward_tables(con, configured, resolved)
        con.execute("COMMIT")
        counts = dict(
            takes=con.execute("SELECT count(*) FROM takes").fetchone()[0],
            groups=con.execute("SELECT count(*) FROM groups").fetchone()[0],
            selected=con.execute("SELECT count(*) FROM selection").fetchone()[0],
        )
    except BaseException:
        con.close()
        tmp.unlink(missing_ok=True)
        Path(str(tmp) + ".wal").unlink(missing_ok=True)
        raise
    con.close()
    tmp.replace(db_path)
    Path(str(tmp) + ".wal").unlink(missing_ok=True)
    return counts


def _union_schema(con, files: list[str], spill: Path) -> None:
    """``takes`` (empty) with the columns and types the whole run has, in first-seen order:
    union_by_name over every file's footer, MAX_CHUNK_FILES files at a time (over all files
    at once, DuckDB held every footer: 2.7 GB for 16k files). A batch whose schema differs
    from the union so far is merged through two empty parquet files of the two schemas."""
    ubn = "SELECT * FROM read_parquet(?, union_by_name = true) LIMIT 0"
    con.execute(f"CREATE TABLE takes AS {ubn}", [files[:MAX_CHUNK_FILES]])
    union = con.execute("DESCRIBE takes").fetchall()
    spill.mkdir(parents=True, exist_ok=True)
    for start in range(MAX_CHUNK_FILES, len(files), MAX_CHUNK_FILES):
        batch = files[start : start + MAX_CHUNK_FILES]
        if con.execute(f"DESCRIBE {ubn}", [batch]).fetchall() == union:
            continue
        so_far, other = str(spill / "union-a.parquet"), str(spill / "union-b.parquet")
        con.execute(f"COPY (FROM takes) TO '{so_far}' (FORMAT parquet)")
        con.execute(f"COPY ({ubn}) TO '{other}' (FORMAT parquet)", [batch])
        con.execute("DROP TABLE takes")
        con.execute(f"CREATE TABLE takes AS {ubn}", [[so_far, other]])
        union = con.execute("DESCRIBE takes").fetchall()
        Path(so_far).unlink()
        Path(other).unlink()


def _work_database(con, filter_sql, score_sql, memory_limit, spill: Path):
    """An in-memory DuckDB database of its own (another instance, so outside the build's
    transaction, its statements committed one by one) for the chunk's tables: the chunk's takes
    (``chunk_scored``, the columns of ``takes`` and ``score``, ``passes``: ``chunk_template``'s)
    and its best takes.
    One thread (the reads are fastest on one, _read_chunk), WORK_MEMORY_SHARE of the build's
    memory limit; it holds one chunk (~100 MB at CHUNK_TAKES takes of 90 columns)."""
    work = duckdb.connect(":memory:")
    work.execute("SET memory_limit = ?", [memory_share(memory_limit, WORK_MEMORY_SHARE)])
    work.execute("SET threads = 1")
    work.execute(f"SET temp_directory = '{spill / 'chunk'}'")
    cols = con.execute("SELECT column_name, column_type FROM (DESCRIBE takes)").fetchall()
    columns = ", ".join(f"{trust.quote_ident(c)} {t}" for c, t in cols)
    work.execute(f"CREATE TABLE takes ({columns})")
    work.execute(f"CREATE TABLE chunk_template AS {_scored_sql(filter_sql, score_sql)} LIMIT 0")
    work.execute("CREATE TABLE chunk_scored AS FROM chunk_template")  # replaced by each chunk
    work.execute(
        "CREATE TABLE chunk_selection AS "
        "SELECT rowid AS rid, group_id, take, flac_path FROM chunk_template LIMIT 0"
    )
    return work


def _create_like(con, work, name: str, sql: str) -> None:
    """A temporary table ``name`` on ``con`` with the columns and types of ``sql`` on ``work``."""
    cols = work.execute(f"DESCRIBE {sql}").fetchall()
    columns = ", ".join(f"{trust.quote_ident(c)} {t}" for c, t, *_ in cols)
    con.execute(f"CREATE TEMP TABLE {name} ({columns})")


def _fill(con, files, filter_sql, score_sql, held_out, seed, directions, spill, memory_limit,
          chunked, context) -> None:  # fmt: skip
    _union_schema(con, files, spill)
    union = [tuple(r[:2]) for r in con.execute("DESCRIBE takes").fetchall()]
    have = {name for name, _ in union}
    for col in _LATE_COLUMNS:  # older parquets may lack them
        if col not in have:
            con.execute(f"ALTER TABLE takes ADD COLUMN {col} {BASE_COLUMNS[col]}")
    # The emotion's class (speech | nonverbal) from the emotions sheet, for the filters: only
    # where the sheet has the column (a run without one keeps its tables as they were).
    if context.classes is not None and "class" not in have:
        con.execute('ALTER TABLE takes ADD COLUMN "class" VARCHAR')
    class_sql = context.class_sql() if context.classes is not None else None
    try:
        con.execute(f"CREATE VIEW scored AS {_scored_sql(filter_sql, score_sql)}")
        con.execute("SELECT count(*) FROM scored").fetchall()
    except duckdb.Error as e:
        raise SelectionError(f"selection SQL failed on the takes table: {e}") from None
    entries = trust.resolve_held_out(con, held_out, directions)
    work = _work_database(con, filter_sql, score_sql, memory_limit, spill)
    try:
        con.execute(
            "CREATE TEMP TABLE part_selection AS SELECT * EXCLUDE (passes) FROM scored LIMIT 0"
        )
        _create_like(con, work, "part_groups", _GROUPS_SQL)
        _create_like(con, work, "part_per_group", _PER_GROUP_SQL)
        tables = trust.TrustTables(con, filter_sql, entries, seed, directions, work=work)
        # The build's connection only appends during the chunks: ordered appends of Arrow run
        # fastest on one thread (0.2 s a chunk against 0.33 s on two).
        threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
        con.execute("SET threads = 1")
        con.execute("SET memory_limit = ?", [memory_share(memory_limit, APPEND_MEMORY_SHARE)])
        # closing: an error stops the next chunk's read before the work database is closed
        with closing(_read_chunks(work, files, union, chunked)) as chunks:
            for _ in chunks:
                _add_chunk(con, work, filter_sql, score_sql, tables, class_sql)
        con.execute("SET threads = ?", [int(threads)])
        con.execute("SET memory_limit = ?", [memory_limit])
    finally:
        work.close()
    split = con.execute(
        "SELECT group_id FROM part_groups GROUP BY group_id HAVING count(*) > 1 LIMIT 1"
    ).fetchone()
    if split:
        raise _SplitGroup(split[0])

    con.execute("CREATE TABLE selection AS FROM part_selection ORDER BY group_id")
    con.execute("CREATE TABLE groups AS FROM part_groups ORDER BY group_id")
    con.execute("CREATE VIEW unselected AS SELECT * FROM groups WHERE status <> 'selected'")
    con.execute(_THROUGHPUT_SQL)
    tables.finish()
    for name in ("selection", "groups", "per_group"):
        con.execute(f"DROP TABLE part_{name}")


def _read_chunk(reader, chunk: list[str], union: list[tuple]) -> int:
    """The chunk's takes into a new ``chunk_next`` (``chunk_template``'s columns) on
    ``reader`` (a connection of the work database), columns by name (missing ones NULL); the
    number of takes. Where the chunk's first file has the whole run's schema (the usual case),
    DuckDB reads the files with that schema (no footer pass over every file: ~40 % faster);
    where a file differs (an older schema) that read fails, and the chunk is read again with
    ``union_by_name`` (the work database commits statement by statement: the build's
    transaction is not aborted).

    The work database runs on one DuckDB thread: with the insertion order kept (the tables'
    order is the files' order), two threads read 64-take files at half the speed of one
    (DuckDB 2.0.1 on 2 cores: 10.3 s against 5.8 s for 2,048 files)."""
    reader.execute("CREATE OR REPLACE TABLE chunk_next AS FROM chunk_template")
    first = reader.execute("DESCRIBE SELECT * FROM read_parquet(?)", [chunk[0]]).fetchall()
    read = "INSERT INTO chunk_next BY NAME SELECT * FROM read_parquet(?{})"
    if [tuple(r[:2]) for r in first] == union:
        try:
            return reader.execute(read.format(""), [chunk]).fetchone()[0]
        except duckdb.Error:  # a file of another schema
            reader.execute("DELETE FROM chunk_next")
    return reader.execute(read.format(", union_by_name = true"), [chunk]).fetchone()[0]


def _add_chunk(con, work, filter_sql, score_sql, tables, class_sql=None) -> None:
    """Reduce the chunk in ``chunk_scored`` on ``work`` (_read_chunks): append its takes and
    its per-group rows to the build's tables on ``con``."""
    if class_sql is not None:
        work.execute(f'UPDATE chunk_scored SET "class" = {class_sql}')
    try:
        work.execute(
            f"UPDATE chunk_scored SET score = ({score_sql})::DOUBLE, "
            f"passes = coalesce(({filter_sql})::BOOLEAN, false)"
        )
    except duckdb.Error as e:
        raise SelectionError(f"selection SQL failed on the takes table: {e}") from None
    takes = work.sql("SELECT * EXCLUDE (score, passes) FROM chunk_scored")
    insert_arrow(con, "takes", takes.to_arrow_reader(CHUNK_TAKES))
    # The best passing take per group (a narrow window; the whole row joins back by rowid).
    work.execute("DELETE FROM chunk_selection")
    work.execute(
        f"""
        INSERT INTO chunk_selection
        SELECT rowid, group_id, take, flac_path FROM chunk_scored WHERE passes
        QUALIFY {rewards.rank_window()} = 1
        """
    )
    selected = work.sql(
        "SELECT * EXCLUDE (passes) FROM chunk_scored "
        "WHERE rowid IN (SELECT rid FROM chunk_selection)"
    )
    insert_arrow(con, "part_selection", selected.to_arrow_table())
    work.execute(f"CREATE OR REPLACE TABLE chunk_groups AS {_GROUPS_SQL}")
    insert_arrow(con, "part_groups", work.sql("FROM chunk_groups").to_arrow_table())
    insert_arrow(con, "part_per_group", work.sql(_PER_GROUP_SQL).to_arrow_table())
    tables.add_chunk()
