"""The fused-pipeline benchmark end to end with the tiny random backends on CPU."""

import json

import pyarrow.parquet as pq
import pytest

pytest.importorskip("transformers")
pytest.importorskip("nemo.collections.asr", reason="parakeet needs nemo_toolkit")


def test_tiny_pipeline_bench_writes_a_group_and_reports_every_stage(tmp_path, capsys):
    from bestofn.lab.bench.__main__ import main

    out = tmp_path / "bench.json"
    argv = ["pipeline", "--size", "tiny", "--device", "cpu", "--takes", "3", "--frames", "10"]
    argv += ["--repeats", "1", "--workdir", str(tmp_path / "work"), "--out", str(out)]
    assert main(argv) == 0

    result = json.loads(out.read_text())
    assert result["meta"]["command"].endswith(" ".join(argv[1:]))
    assert "MOSS-Audio-Tokenizer-v2" in result["meta"]["codec"]
    (size,) = result["sizes"]
    assert size["takes"] == 3 and size["timed_groups"] == 1
    stages = size["s_per_clip"]
    for stage in ("generate", "restore", "score", "write"):
        assert stages[stage] > 0, stage
    assert set(size["score_s_per_clip"]) == {
        "duration",
        "parakeet",
        "voiceclap",
        "empathic-insight",
    }
    assert size["total_s_per_clip"] == pytest.approx(
        sum(stages[s] for s in ("generate", "restore", "score", "write"))
    )
    assert size["clip_seconds"] == pytest.approx(10 / 12.5)  # the frame count was pinned

    group = tmp_path / "work" / "happy" / "bench-3-0"
    assert sorted(p.name for p in (group / "takes").iterdir()) == [
        "000.flac",
        "001.flac",
        "002.flac",
    ]
    table = pq.read_table(group / "scores.parquet")
    assert table.num_rows == 3
    for col in ("transcript", "wer", "vc_genuineness", "words_per_s", "group_write_s"):
        assert col in table.column_names, col
    assert not list((tmp_path / "work" / "happy").glob(".*"))  # no partial directories left
    assert "| **total**" in capsys.readouterr().out


def test_a_variant_without_sidon_knobs_runs_the_default_path():
    """Variants run one after another in one process: one that names no Sidon layout gets the
    production default, not the layout an earlier variant set."""
    from types import SimpleNamespace

    from bestofn.backends import sidon
    from bestofn.lab.bench.pipeline import apply_variant, parse_variant

    calls = []
    restorer = SimpleNamespace(name="sidon", set_speed=lambda *a: calls.append(a))
    backends = SimpleNamespace(scorers=[], restorer=restorer)
    try:
        apply_variant(backends, parse_variant("nchw:sidon_layout=nchw")[1])
        assert sidon._SNAKE["layout"] == "nchw"
        apply_variant(backends, parse_variant("plain:overlap=full")[1])
        assert sidon._SNAKE["layout"] == sidon.DEFAULT_LAYOUT == "channels_last"
        assert len(calls) == 2
    finally:
        sidon.set_layout(sidon.DEFAULT_LAYOUT)
        sidon.set_snake("auto")
