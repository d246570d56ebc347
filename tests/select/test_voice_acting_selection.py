"""Target-emotion selection with norm(): the take that acts the group's own emotion wins, a take
under the speaker floor or the WER gate never does; norm() is min-max over the whole run and is
checked before any GPU work."""

import duckdb
import pytest
import yaml
from helpers import REPO, scores_parquet

from bestofn.select.base import BASE_COLUMNS, SelectionError
from bestofn.select.database import (
    build_database,
    check_selection,
    resolve_norm,
)

# the recipe's emotion reward on the run-wide scale (norm, as LAION's recipe writes it) and the
# clone recipe's gates: the WER gate and a speaker floor of 0.86 (WavLM's same-speaker
# threshold). The recipes themselves score on per-emotion scales (tests/select/test_rewards.py)
FILTER = "wer <= 0.1 AND finished AND NOT truncated AND stop_reason = 'eos' AND spk_sim >= 0.86"
SCORE = "1.5 * norm(ei_target) + norm(vc_blend) + norm(vc_genuineness)"
CLONE = yaml.safe_load((REPO / "config/recipes/clone.yaml").read_text())["selection"]


def test_the_clone_recipe_keeps_these_gates_for_speech():
    for clause in ("wer <= 0.1", "finished", "NOT truncated", "stop_reason = 'eos'",
                   "spk_sim >= 0.86"):  # fmt: skip
        assert clause in CLONE["filter"], clause


def takes(tmp_path, group_id, rows):
    """A group's parquet: rows of (ei_anger, ei_sadness, ei_target, wer, spk_sim, blend, genu)."""
    n = len(rows)
    cols = list(zip(*rows, strict=True))
    names = ("ei_anger", "ei_sadness", "ei_target", "wer", "spk_sim", "vc_blend",
             "vc_genuineness")  # fmt: skip
    columns = {
        "truncated": [False] * n,
        "finished": [True] * n,
        "stop_reason": ["eos"] * n,
        **dict(zip(names, cols, strict=True)),
    }
    return scores_parquet(tmp_path, group_id, columns)


def selected(tmp_path, files) -> dict[str, int]:
    out = tmp_path / "bestofn.duckdb"
    build_database(files, out, FILTER, SCORE)
    with duckdb.connect(str(out), read_only=True) as con:
        return dict(con.execute("SELECT group_id, take FROM selection").fetchall())


def test_the_target_emotions_head_wins_over_another_emotions(tmp_path):
    # Anger group: ei_target is the Anger head. Take 0 is far higher on Sadness, take 1 on
    # Anger; blend and genuineness equal. Sadness group: the same takes, target = Sadness.
    rows = [(1.0, 3.5, None, 0.0, 0.95, 5.0, 3.0), (3.0, 0.5, None, 0.0, 0.95, 5.0, 3.0)]
    anger = [(a, s, a, *rest) for a, s, _, *rest in rows]
    sad = [(a, s, s, *rest) for a, s, _, *rest in rows]
    files = [takes(tmp_path, "Anger/p1", anger), takes(tmp_path, "Sadness/p1", sad)]
    assert selected(tmp_path, files) == {"Anger/p1": 1, "Sadness/p1": 0}


def test_a_take_under_the_speaker_floor_or_the_wer_gate_is_never_selected(tmp_path):
    # take 0: the best acting but another voice (spk_sim 0.80 < 0.86); take 1: the best
    # acting of the rest but garbled (wer 0.4); take 2: modest, passes both gates
    rows = [
        (3.9, 0.0, 3.9, 0.0, 0.80, 9.0, 6.0),
        (3.8, 0.0, 3.8, 0.4, 0.95, 9.0, 6.0),
        (1.0, 0.0, 1.0, 0.05, 0.90, 2.0, 1.0),
    ]
    files = [takes(tmp_path, "Anger/p1", rows)]
    assert selected(tmp_path, files) == {"Anger/p1": 2}
    # and a group where every take fails a gate selects nothing
    files = [takes(tmp_path, "Anger/p2", rows[:2])]
    assert selected(tmp_path, files) == {}


def test_norm_is_min_max_over_the_whole_run_not_the_group(tmp_path):
    # over the run: ei_target 0..4, blend 0..10, genuineness 1..3. Within a group genuineness
    # never varies (a per-group norm would make it 0 everywhere); over the run it is 0 or 1.
    g = [(4.0, 0, 4.0, 0.0, 0.95, 0.0, 1.0), (1.0, 0, 1.0, 0.0, 0.95, 10.0, 1.0)]
    h = [(0.0, 0, 0.0, 0.0, 0.95, 5.0, 3.0), (2.0, 0, 2.0, 0.0, 0.95, 5.0, 3.0)]
    files = [takes(tmp_path, "Anger/g", g), takes(tmp_path, "Anger/h", h)]
    out = tmp_path / "bestofn.duckdb"
    build_database(files, out, FILTER, SCORE)
    with duckdb.connect(str(out), read_only=True) as con:
        scores = dict(con.execute("SELECT group_id || take, score FROM selection").fetchall())
    assert scores == pytest.approx(
        {"Anger/g0": 1.5 * 1.0 + 0.0 + 0.0, "Anger/h1": 1.5 * 0.5 + 0.5 + 1.0}
    )


def test_nan_normalises_to_null_and_never_wins(tmp_path):
    nan = float("nan")
    rows = [(nan, 0.0, nan, 0.0, 0.95, 5.0, 3.0), (1.0, 0.0, 1.0, 0.0, 0.95, 5.0, 3.0),
            (2.0, 0.0, 2.0, 0.0, 0.95, 4.0, 3.0)]  # fmt: skip
    assert selected(tmp_path, [takes(tmp_path, "Anger/p1", rows)]) == {"Anger/p1": 2}


def test_resolve_norm_writes_the_runs_range_into_the_sql():
    con = duckdb.connect()
    con.execute("CREATE TABLE takes AS SELECT * FROM (VALUES (1.0, 2), (3.0, 4)) t(x, y)")
    filter_sql, score_sql = resolve_norm(con, "takes", "norm(y) > 0.5", 'norm(x) + norm("x")')
    assert "norm" not in filter_sql.lower() and "norm" not in score_sql.lower()
    got = con.execute(f"SELECT {score_sql}, {filter_sql} FROM takes ORDER BY x").fetchall()
    assert got == [(0.0, False), (2.0, True)]
    with pytest.raises(SelectionError, match="'z'"):
        resolve_norm(con, "takes", "true", "norm(z)")


COLUMNS = {**BASE_COLUMNS, "wer": "DOUBLE", "finished": "BOOLEAN", "truncated": "BOOLEAN",
           "stop_reason": "VARCHAR", "spk_sim": "DOUBLE", "ei_target": "DOUBLE",
           "vc_blend": "DOUBLE", "vc_genuineness": "DOUBLE", "transcript": "VARCHAR"}  # fmt: skip


def test_check_selection_takes_norm_of_known_columns():
    check_selection(FILTER, SCORE, COLUMNS)


def test_check_selection_refuses_norm_of_a_missing_column_by_name():
    with pytest.raises(SelectionError, match="norm\\(ei_targte\\).*'ei_targte'"):
        check_selection(FILTER, "norm(ei_targte) + norm(vc_blend)", COLUMNS)


@pytest.mark.parametrize("score", ["norm(wer + 1)", "norm()", "norm(wer, cer)"])
def test_check_selection_refuses_norm_of_an_expression(score):
    with pytest.raises(SelectionError, match="one column name"):
        check_selection(FILTER, score, COLUMNS)


def test_check_selection_refuses_norm_of_text():
    with pytest.raises(SelectionError, match="transcript.*not a number"):
        check_selection(FILTER, "norm(transcript)", COLUMNS)


def test_norm_inside_a_string_is_text():
    check_selection("stop_reason <> 'norm(x)'", "norm(wer)", COLUMNS)
