"""The fused-pipeline benchmark end to end with the tiny random backends on CPU."""

import importlib.util
import json
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

# Whether transformers and NeMo are installed, not imported: importing nemo.collections.asr takes
# ~8 s, which every pytest-xdist worker paid while collecting (the test imports both as it runs).
pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("transformers", "nemo")),
    reason="parakeet needs nemo_toolkit, the generator transformers",
)


def test_tiny_pipeline_bench_writes_a_group_and_reports_every_stage(tmp_path, capsys):
    from lab.bench.__main__ import main

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
    from bestofn.fakes import sidon
    from lab.bench.pipeline import apply_variant, parse_variant

    restorer = sidon.build("cpu", "tiny")
    backends = SimpleNamespace(scorers=[], restorer=restorer)
    apply_variant(backends, parse_variant("nchw:sidon_layout=nchw,sidon_snake=eager")[1])
    assert (restorer.kernels.layout, restorer.kernels.mode) == ("nchw", "eager")
    apply_variant(backends, parse_variant("plain:overlap=full")[1])
    assert (restorer.kernels.layout, restorer.kernels.mode) == ("channels_last", "auto")


def test_a_variant_sets_the_scorers_resampler_and_the_next_gets_the_built_one_back():
    from lab.bench.pipeline import apply_variant, parse_variant

    asr, clap = SimpleNamespace(name="asr", resampler="torch"), SimpleNamespace(name="clap")
    backends = SimpleNamespace(scorers=[asr, clap], restorer=SimpleNamespace(name="identity"))
    built = {"asr": "torch"}
    apply_variant(backends, parse_variant("host:resampler=soxr")[1], built)
    assert asr.resampler == "soxr" and not hasattr(clap, "resampler")  # only where it has one
    apply_variant(backends, parse_variant("plain:overlap=full")[1], built)
    assert asr.resampler == "torch"
    with pytest.raises(SystemExit, match="resampler"):
        parse_variant("bad:resampler=sinc")


def test_variants_stream_groups_through_the_workers_runner(tmp_path, monkeypatch):
    """--variant streams groups through bestofn.core.runner.Runner (the worker's scheduler, not a
    copy): every group of every variant is published, in each overlap mode."""
    from bestofn.core import runner
    from lab.bench.__main__ import main

    seen = []
    real_run = runner.Runner.run
    monkeypatch.setattr(
        runner.Runner, "run", lambda self, job: seen.append(self.overlap) or real_run(self, job)
    )
    out = tmp_path / "bench.json"
    argv = "pipeline --size tiny --device cpu --takes 2 --frames 6 --warmup 0 --stream-groups 2"
    # b: the speaker scorer's dials too (--speaker: the production set's wavlm-speaker)
    argv = [*argv.split(), "--speaker", "--variant", "a:overlap=full", "--variant",
            "b:overlap=off,speaker_precision=bfloat16,speaker_batch=1,speaker_max_s=1"]  # fmt: skip
    argv += ["--workdir", str(tmp_path / "work"), "--out", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["variants"]
    assert [r["variant"] for r in rows] == ["a", "b"]
    assert [r["knobs"]["overlap"] for r in rows] == ["full", "off"]
    assert rows[1]["knobs"]["speaker_precision"] == "bfloat16"
    # the speaker scorer ran in every variant's groups, timed as the others
    assert all(r["score_s_per_clip"].get("wavlm-speaker", 0) > 0 for r in rows)
    assert all(r["groups"] == 2 and r["s_per_clip"] > 0 for r in rows)
    # steady state (the workflow's definition): the second group's end minus the first's
    assert all(0 < r["steady_s_per_clip"] * 2 <= r["elapsed_s"] for r in rows)
    assert seen == ["full", "full", "off", "off"]
