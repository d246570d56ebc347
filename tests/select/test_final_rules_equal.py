"""The streaming database rule (issue 23) writes the tables the tree before it wrote, row for row.

The expected tables in tests/expected/final_rules/ were written by the code of commit f0a0c71
(the last tree that materialised every take) over two sets of groups:

- ``demo``: the 12 scores.parquet of `make demo` (the embedded default), in tests/data/;
- ``synthetic``: 40 groups x 16 takes from ``python -m lab.bench database``'s generator
  (every production scorer's columns, Empathic-Insight at 4 heads) with edge cases added here:
  a file of an older schema, NULL scores, a group where nothing passes, a tie, a column with no
  value at all.

To write them again (only if the tables are meant to change), from the repository root:

    git archive f0a0c71 src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src:tests python tests/select/test_final_rules_equal.py --write

Every table is compared in its stored order; floats to 1e-9 relative (the correlation is now
summed in numpy, not by DuckDB's ``corr``), everything else exactly; the takes and selection
tables, which copy the parquets' values, by a digest of their rows."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import DATA
from helpers import EXPECTED as _EXPECTED

from bestofn.select import database

EXPECTED = _EXPECTED / "final_rules"
DEMO = DATA / "demo_groups"
DIGESTED = ("takes", "selection")
TABLES = (
    "takes", "selection", "groups", "unselected", "throughput", "random_takes", "group_gains",
    "score_gains", "held_out", "score_correlation", "filter_funnel", "listening", "trust_settings",
)  # fmt: skip
# The old tree's direction table (KNOWN_BETTER, without the composite): the scorers now declare
# these (Scorer.better), and Empathic-Insight's quality heads besides, which the old tree did not.
OLD_DIRECTIONS = {
    "wer": "lower", "cer": "lower", "dnsmos_sig": "higher", "dnsmos_bak": "higher",
    "dnsmos_ovrl": "higher", "dnsmos_p808": "higher", "speaker_sim": "higher",
    "vc_genuineness": "higher", "vc_prompt_sim": "higher",
}  # fmt: skip
CASES = {
    "demo": dict(
        filter_sql="wer <= 0.1 AND words_per_s BETWEEN 1.0 AND 4.5",
        score_sql="dnsmos_ovrl + 2 * speaker_sim - cer",
        held_out=["dnsmos_p808"],
        seed=1234,
    ),
    "synthetic": dict(
        filter_sql="cer <= 0.1 AND NOT truncated AND stop_reason = 'eos'",
        score_sql="vc_genuineness / 6 + vc_prompt_sim - cer",
        held_out=["wer", {"column": "ei_score_overall_quality", "better": "higher"}],
        seed=3,
    ),
}


def _bench_module():
    """The synthetic groups of `python -m lab.bench database` (this tree's lab)."""
    from lab.bench import database

    return database


def synthetic_groups(results: Path) -> list[Path]:
    bench = _bench_module()
    declared = bench._declared_columns
    # the columns the scorers declared when the expected tables were written: the ASR's
    # `finished` came later (and drawing it would shift every later column's values)
    bench._declared_columns = lambda: {k: v for k, v in declared().items() if k != "finished"}
    try:
        paths = bench.write_groups(results, groups=40, takes=16, seed=7, n_heads=4, reuse=False)
    finally:
        bench._declared_columns = declared

    def edit(i: int, fn) -> None:
        pq.write_table(fn(pq.read_table(paths[i])), paths[i])

    def put(t: pa.Table, col: str, values) -> pa.Table:
        return t.set_column(
            t.column_names.index(col), col, pa.array(values, t.schema.field(col).type)
        )

    # an older file: no host, worker, GPU or overlap columns
    edit(3, lambda t: t.drop_columns(["host", "worker_pid", "overlap", "group_score_gpu_s"]))
    edit(5, lambda t: put(put(t, "wer", [None] * 4 + t["wer"].to_pylist()[4:]), "vc_blend",
                          [None] * t.num_rows))  # fmt: skip
    edit(7, lambda t: put(t, "cer", [0.5] * t.num_rows))  # no take passes
    for i in range(len(paths)):  # a tie on the score between takes 2 and 3 of group 9
        edit(i, lambda t: t.append_column("ei_unused", pa.array([None] * t.num_rows, pa.float64())))

    def tie(t: pa.Table) -> pa.Table:
        for col in ("vc_genuineness", "vc_prompt_sim", "cer", "truncated", "stop_reason"):
            v = t[col].to_pylist()
            v[3] = v[2]
            t = put(t, col, v)
        return t

    edit(9, tie)
    return paths


def demo_groups(results: Path) -> list[Path]:
    shutil.copytree(DEMO, results / "groups")
    return sorted((results / "groups").glob("*/*/scores.parquet"))


def _plain(v):
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else v
    if v is None or isinstance(v, (int, str, bool)):
        return v
    return str(v)  # timestamps, JSON


def dump(db: Path) -> dict:
    """Every table as {columns, types, rows} (digest for the big ones), in stored order."""
    con = duckdb.connect(str(db), read_only=True)
    out = {}
    for name in TABLES:
        rel = con.sql(f"SELECT * FROM {name}")
        rows = [[_plain(v) for v in r] for r in rel.fetchall()]
        entry = {"columns": rel.columns, "types": [str(t) for t in rel.types], "n": len(rows)}
        if name in DIGESTED:
            entry["digest"] = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
        else:
            entry["rows"] = rows
        out[name] = entry
    con.close()
    return out


def build(case: str, tmp: Path, **kwargs) -> Path:
    from bestofn.select.database import build_database

    results = tmp / "results"
    paths = demo_groups(results) if case == "demo" else synthetic_groups(results)
    db = results / "bestofn.duckdb"
    build_database([str(p) for p in paths], db, **CASES[case], **kwargs)
    return db


def assert_same(got: dict, want: dict) -> None:
    for name, w in want.items():
        g = got[name]
        assert g["columns"] == w["columns"], name
        assert g["types"] == w["types"], name
        assert g["n"] == w["n"], name
        if "digest" in w:
            assert g["digest"] == w["digest"], f"{name}: rows differ"
            continue
        for i, (gr, wr) in enumerate(zip(g["rows"], w["rows"], strict=True)):
            for col, a, b in zip(w["columns"], gr, wr, strict=True):
                if isinstance(b, float) and isinstance(a, float):
                    assert a == pytest.approx(b, rel=1e-9, abs=1e-12), f"{name} row {i} {col}"
                else:
                    assert a == b, f"{name} row {i} {col}: {a!r} != {b!r}"


@pytest.mark.parametrize("case", ["demo", "synthetic"])
@pytest.mark.parametrize("chunk_takes", [None, 40])
def test_tables_equal_the_old_implementation(case, chunk_takes, tmp_path, monkeypatch):
    """One chunk, and chunks of a few groups (the synthetic set: 16 chunks or more)."""

    if chunk_takes:
        monkeypatch.setattr(database, "CHUNK_TAKES", chunk_takes)
        monkeypatch.setattr(database, "FIRST_CHUNK_FILES", 2)
        # the schema in batches of 3 files: the older file's batch merges into the union
        monkeypatch.setattr(database, "MAX_CHUNK_FILES", 3)
    db = build(case, tmp_path, directions=OLD_DIRECTIONS)
    assert_same(dump(db), json.loads((EXPECTED / f"{case}.json").read_text()))


def test_duckdb_settings_do_not_change_the_tables(tmp_path):
    """The config's database.memory_limit and threads (here small and one) change no table."""
    db = build("synthetic", tmp_path, directions=OLD_DIRECTIONS, memory_limit="200MB", threads=1)
    assert_same(dump(db), json.loads((EXPECTED / "synthetic.json").read_text()))


def test_a_group_split_over_chunks_is_read_in_one_pass(tmp_path, monkeypatch):
    """Takes of one group in two files of different chunks (not the results layout, but the
    library accepts any files): the same tables as one pass."""

    results = tmp_path / "results"
    paths = synthetic_groups(results)[:6]
    t = pq.read_table(paths[5])
    half = t.num_rows // 2
    pq.write_table(t.slice(0, half), paths[5])
    extra = results / "extra.parquet"
    pq.write_table(t.slice(half), extra)
    files = [str(p) for p in paths]
    files = files[:1] + [str(extra)] + files[1:]  # group 5's halves: files 2 and 7
    kw = dict(CASES["synthetic"], directions=OLD_DIRECTIONS)
    one = database.build_database(files, tmp_path / "one.duckdb", **kw)
    monkeypatch.setattr(database, "CHUNK_TAKES", 16)
    monkeypatch.setattr(database, "FIRST_CHUNK_FILES", 1)
    two = database.build_database(files, tmp_path / "two.duckdb", **kw)
    assert one == two == {"takes": 96, "groups": 6, "selected": two["selected"]}
    assert_same(dump(tmp_path / "two.duckdb"), dump(tmp_path / "one.duckdb"))


def test_shipped_scorers_declare_the_old_directions():
    """The old tree's directions hold, unchanged, in what the scorers now declare; whatever a
    scorer declares besides (a new scorer needs no line here) is a direction of a column it
    writes, or a pattern of its dynamic columns."""
    import fnmatch

    from bestofn.backends.registry import backend_class, registered
    from bestofn.select.held_out import scorer_directions

    scorers = registered()["scorer"]
    declared = scorer_directions({"scorers": [{"backend": b} for b in scorers]})
    assert {c: declared.get(c) for c in OLD_DIRECTIONS} == OLD_DIRECTIONS
    for name in scorers:
        cls = backend_class("scorer", name)
        for column, better in cls.better.items():
            assert better in ("higher", "lower"), (name, column)
            ok = column in cls.columns or (cls.dynamic_columns and fnmatch.fnmatch(column, "*_*"))
            assert ok, f"{name} declares a direction for {column}, which it does not write"


if __name__ == "__main__" and sys.argv[1:2] == ["--write"]:
    # Run with the OLD tree on PYTHONPATH (see the docstring); the bench generator of this
    # tree writes the synthetic groups.
    import inspect
    import tempfile

    from bestofn.select.database import build_database

    assert "directions" not in inspect.signature(build_database).parameters, "not the old tree"
    EXPECTED.mkdir(parents=True, exist_ok=True)
    for case in sys.argv[2:] or CASES:
        with tempfile.TemporaryDirectory() as tmp:
            db = build(case, Path(tmp))
            (EXPECTED / f"{case}.json").write_text(json.dumps(dump(db), indent=None) + "\n")
            print(case, {k: v["n"] for k, v in dump(db).items()})
