"""No empty or cut-off take passes unseen: n_frames / truncated / stop_reason columns, empty
takes published as decodable silence, write_group refusing what would not decode."""

from __future__ import annotations

import types

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import torch
import yaml
from helpers import REPO

from bestofn.backends.base import Take
from bestofn.core.groupio import UnpublishableTake, partial_dirs, write_group
from bestofn.core.pipeline import EMPTY_TAKE_S, load_backends, take_ending
from bestofn.core.runner import run_group
from bestofn.ops.verify import verify_group
from bestofn.select.base import BASE_COLUMNS
from bestofn.select.database import check_selection
from bestofn.util.spec import GroupSpec

SCRIPTED = "lab.faults:ScriptedGenerator"


def scripted(**options) -> dict:
    return {
        "generator": {"backend": SCRIPTED, "options": options},
        "scorers": [{"backend": "duration"}],
    }


@pytest.mark.parametrize("channels", [1, 2])
def test_empty_and_truncated_takes_become_columns_and_empty_decodes(tmp_path, channels):
    backends = load_backends(
        scripted(empty_takes=[1], truncated_takes=[2], channels=channels, sample_rate=16000)
    )
    spec = GroupSpec("calm", "p1", "Good morning to you.", n_takes=4, base_seed=3)
    group = tmp_path / "results/groups/calm/p1"
    run_group(spec, backends, group, paths_relative_to=tmp_path)

    rows = pq.read_table(group / "scores.parquet").to_pylist()
    assert [r["stop_reason"] for r in rows] == ["eos", "empty", "budget", "eos"]
    assert [r["truncated"] for r in rows] == [False, False, True, False]
    assert [r["n_frames"] for r in rows] == [6, 0, 6, 6]  # 0.5 s at 12.5 Hz
    empty = rows[1]
    assert empty["duration_s"] == pytest.approx(EMPTY_TAKE_S)
    audio, sr = sf.read(tmp_path / empty["flac_path"], always_2d=True)
    assert sr == 16000 and audio.shape == (int(EMPTY_TAKE_S * 16000), channels)
    assert not audio.any()  # digital silence
    assert verify_group(group) == []

    # the production default filter keeps only takes that ended at their stop token
    import duckdb

    con = duckdb.connect()
    kept = con.execute(
        "SELECT take FROM read_parquet(?) WHERE NOT truncated AND stop_reason = 'eos' ORDER BY 1",
        [str(group / "scores.parquet")],
    ).fetchall()
    assert kept == [(0,), (3,)]


def test_write_group_refuses_a_take_without_frames(tmp_path):
    import pyarrow as pa

    group = tmp_path / "groups/calm/p1"
    audios = [np.zeros(800, np.float32), np.zeros((0, 2), np.float32)]
    rows = pa.table({"take": [0, 1]})
    with pytest.raises(UnpublishableTake, match=r"take 1 has no audio frames"):
        write_group(group, audios, 16000, rows)
    assert not group.exists()
    assert partial_dirs(tmp_path / "groups") == []


def test_take_ending_rules():
    def take(n, **meta):
        return Take(np.zeros(n, np.float32), seed=1, meta=meta)

    plain = {"n_frames": None, "truncated": False, "stop_reason": "eos"}
    assert take_ending(take(10), "g") == plain
    assert take_ending(take(10, n_frames=4, truncated=True), "g")["stop_reason"] == "budget"
    # no samples is 'empty', whatever the generator said
    assert take_ending(take(0, n_frames=0, stop_reason="eos"), "g")["stop_reason"] == "empty"
    with pytest.raises(RuntimeError, match="generator 'g'.*stop_reason 'eos', truncated True"):
        take_ending(take(10, truncated=True, stop_reason="eos"), "g")
    with pytest.raises(RuntimeError, match="stop_reason 'maybe'"):
        take_ending(take(10, stop_reason="maybe"), "g")


def _codes(frames: list[int], n_vq: int = 4) -> list[torch.Tensor]:
    return [torch.zeros(f, n_vq, dtype=torch.long) for f in frames]


def _fake_decode(codes):
    return [np.zeros((c.shape[0] * 3840, 2), np.float32) for c in codes]


def test_moss_fast_generate_fills_the_take_meta():
    from bestofn.backends.moss_fast import MossFastGenerator

    gen = MossFastGenerator.__new__(MossFastGenerator)  # generate()'s own logic only
    gen.options = {"mono": False}
    gen.config = types.SimpleNamespace(frame_rate=12.5)
    gen.generate_codes = lambda spec, seeds: (_codes([3, 0, 8]), [True, True, False], 8)
    gen._codec = lambda: types.SimpleNamespace(decode=_fake_decode)
    takes = gen.generate(GroupSpec("e", "p", "a b", n_takes=3))
    assert [t.meta["stop_reason"] for t in takes] == ["eos", "empty", "budget"]
    assert [t.meta["n_frames"] for t in takes] == [3, 0, 8]
    assert [t.meta["truncated"] for t in takes] == [False, False, True]


def test_moss_hf_generate_fills_the_take_meta():
    from bestofn.backends.moss_hf import MossHFGenerator

    gen = MossHFGenerator.__new__(MossHFGenerator)
    gen.budget = types.SimpleNamespace(frame_rate=12.5)
    gen.generate_codes = lambda spec, seeds: (_codes([3, 0, 8]), [False, False, True], 8)
    gen.decode = _fake_decode
    takes = gen.generate(GroupSpec("e", "p", "a b", n_takes=3))
    assert [t.meta["stop_reason"] for t in takes] == ["eos", "empty", "budget"]
    assert [t.meta["truncated"] for t in takes] == [False, False, True]


def test_piper_takes_have_no_frames_and_end_at_eos(tmp_path):
    backends = load_backends({"generator": {"backend": "piper"}})
    spec = GroupSpec("calm", "p1", "Hello there.", n_takes=2)
    takes = backends.generator.generate(spec)
    assert [t.meta for t in takes] == [
        {"n_frames": None, "truncated": False, "stop_reason": "eos"}
    ] * 2
    run_group(spec, backends, tmp_path / "g", paths_relative_to=tmp_path)
    table = pq.read_table(tmp_path / "g/scores.parquet")
    assert table.column("n_frames").null_count == 2
    assert table.column("stop_reason").to_pylist() == ["eos", "eos"]


def test_take_columns_are_known_to_the_selection_sql():
    for col in ("n_frames", "truncated", "stop_reason"):
        assert col in BASE_COLUMNS
    check_selection("NOT truncated AND stop_reason = 'eos'", "-n_frames", BASE_COLUMNS)
    production = yaml.safe_load((REPO / "config/recipes/emotions.yaml").read_text())
    filter_sql = production["selection"]["filter"]
    assert "stop_reason = 'eos'" in filter_sql and "truncated" in filter_sql
