"""`bestofn export`: demo results (the embedded default's piper generator on the tiny config of
conftest, run once for the module through snakemake) exported in every format and loaded back
by each format's own library; bad input; broken takes; incremental re-export; the rule."""

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
import soundfile as sf
import yaml
from helpers import REPO, make_tiny_project, tiny_config
from readme_snippets import code_blocks

from bestofn.cli import main as cli
from bestofn.select.database import build_database

pytestmark = pytest.mark.slow  # each test exports the results of one `make demo`-like run

BIN = Path(sys.executable).parent
# seed 1 puts p1 in test and p2 in train (checked below): both splits are non-empty
SPLIT = ["--split", "train=0.5,test=0.5", "--split-seed", "1"]
EXPORT_CONFIG = {
    "format": "nemo",
    "split": {"seed": 1, "fractions": {"train": 0.5, "test": 0.5}},
    "card": {"license": "cc-by-4.0", "pretty_name": "bestofn demo"},
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The tiny project (2 emotions x 2 prompts) with 3 takes a group, run through snakemake."""
    root = make_tiny_project(tmp_path_factory.mktemp("export_demo"))
    config = tiny_config(takes=3, export=EXPORT_CONFIG)
    (root / "config/config.yaml").write_text(yaml.safe_dump(config))
    snakemake(root)
    assert not (root / "export").exists()  # the export rule is not part of `all`
    return root


def snakemake(project: Path, *targets: str) -> None:
    cmd = [
        str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(project), "--profile", str(REPO / "profiles/local"), *targets,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def export(demo: Path, out: Path, *args: str, results: Path | None = None) -> int:
    return cli(
        [
            "export",
            str(results or demo / "results"),
            "--config",
            str(demo / "config/config.yaml"),
            "--out",
            str(out),
            *args,
        ]  # fmt: skip
    )


def db_rows(demo: Path, sql: str) -> list[dict]:
    con = duckdb.connect(str(demo / "results/bestofn.duckdb"), read_only=True)
    try:
        res = con.sql(sql)
        return [dict(zip(res.columns, r, strict=True)) for r in res.fetchall()]
    finally:
        con.close()


def passing(demo: Path) -> list[dict]:
    sel = tiny_config()["selection"]
    return db_rows(
        demo,
        f"SELECT *, ({sel['score']}) AS score FROM takes WHERE ({sel['filter']}) ORDER BY ALL",
    )


def by_take(rows) -> dict:
    return {(r["group_id"], r["take"]): r for r in rows}


def decoded(data: bytes):
    audio, rate = sf.read(io.BytesIO(data), always_2d=True)
    return audio, rate


def test_hf_loads_back_with_datasets(demo, tmp_path, capsys):
    from datasets import Audio, load_dataset

    out = tmp_path / "hf"
    assert export(demo, out, "--format", "hf", *SPLIT) == 0
    assert "wrote 2 shard(s), reused 0" in capsys.readouterr().out
    ds = load_dataset(str(out), cache_dir=str(tmp_path / "hf_cache"))
    selection = by_take(db_rows(demo, "SELECT * FROM selection"))
    assert {s: ds[s].num_rows for s in ds} == {"train": 2, "test": 2}
    assert set(ds["test"]["prompt_id"]) == {"p1"} and set(ds["train"]["prompt_id"]) == {"p2"}
    assert ds["train"].features["audio"] == Audio(sampling_rate=22050)
    seen = 0
    for split in ds:
        for row in ds[split].cast_column("audio", Audio(decode=False)):
            want = selection[(row["group_id"], row["take"])]
            assert row["text"] == want["text"] and row["emotion"] == want["emotion"]
            assert row["score"] == pytest.approx(want["score"])
            assert row["words_per_s"] == pytest.approx(want["words_per_s"])
            assert row["seed"] == want["seed"] and row["models_hash"] == want["models_hash"]
            assert row["rank"] == 1 and row["split"] == split
            # 48 kHz or not, the FLAC is passed through: the same bytes as the group's file
            src = demo / want["flac_path"]
            assert row["audio"]["bytes"] == src.read_bytes()
            audio, rate = decoded(row["audio"]["bytes"])
            assert rate == 22050 and len(audio) == row["num_samples"]
            assert len(audio) == round(want["duration_s"] * rate)
            seen += 1
    assert seen == len(selection) == 4
    card = (out / "README.md").read_text()
    assert "license: cc-by-4.0" in card and "words_per_s > 0.5" in card
    assert "| emotion | test | train | all |" in card and "| calm | 1 | 1 | 2 |" in card
    assert "passed through byte for byte" in card
    assert want["models_hash"] in card and "model_sha256" in card


def test_hf_export_loads_as_itself_whatever_was_loaded_before(demo, tmp_path):
    """Two exports in folders of one name, then a re-export over the second, loaded by
    ``load_dataset(DIR)`` through one cache: each load returns its own export's rows."""
    from datasets import load_dataset

    cache = str(tmp_path / "cache")

    def loaded(out):
        ds = load_dataset(str(out), cache_dir=cache)
        return {s: sorted(zip(ds[s]["group_id"], ds[s]["take"], strict=True)) for s in ds}

    def exported(out):
        con = duckdb.connect()
        try:
            rows = con.sql(f"SELECT split, group_id, take FROM '{out}/data/*.parquet'").fetchall()
        finally:
            con.close()
        return {s: sorted((g, t) for s2, g, t in rows if s2 == s) for s in {r[0] for r in rows}}

    first, second = tmp_path / "a/hf", tmp_path / "b/hf"
    assert export(demo, first, "--format", "hf", "--which", "all", *SPLIT) == 0
    assert export(demo, second, "--format", "hf", *SPLIT) == 0
    seen = []
    for out in (first, second):
        got = loaded(out)
        assert got == exported(out)
        seen.append(sum(map(len, got.values())))
    assert seen == [12, 4]
    # the incremental workflow: the same folder, replaced
    args = ("--format", "hf", "--which", "all", "--where", "emotion = 'calm'", "--overwrite")
    assert export(demo, second, *args, *SPLIT) == 0
    got = loaded(second)
    assert got == exported(second) and sum(map(len, got.values())) == 6
    assert {g.split("/")[0] for rows in got.values() for g, _ in rows} == {"calm"}


def test_readme_export_snippets_run_as_written(demo, tmp_path):
    """The README's export section, every block as written (the shell commands, then the
    Python that loads what they wrote), in a copy of the demo project with a fresh HF cache;
    then the Python of the hf export's own card."""
    shutil.copytree(demo / "config", tmp_path / "config")
    shutil.copytree(demo / "results", tmp_path / "results")
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_HUB_OFFLINE": "1",  # a local folder: nothing is fetched
    }
    env.pop("HF_DATASETS_CACHE", None)

    def run(block, cwd, where):
        cmd = ["bash", "-euo", "pipefail", "-c", block.code]
        if block.lang == "python":
            cmd = [sys.executable, "-c", block.code]
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{where} line {block.line}:\n{block.code}\n{proc.stderr}"

    blocks = code_blocks(REPO / "README.md", "Export")
    assert [b.lang for b in blocks] == ["sh", "python"] * 4
    for block in blocks:
        run(block, tmp_path, "README.md")
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == [
        "hf", "lhotse", "nemo", "wds"
    ]  # fmt: skip
    (card,) = code_blocks(tmp_path / "export/hf/README.md", "Load it")
    assert card.lang == "python" and 'load_dataset("hf")' in card.code
    run(card, tmp_path / "export", "the hf card")


def test_webdataset_passing_takes_in_shards(demo, tmp_path):
    import webdataset as wds

    out = tmp_path / "wds"
    assert export(demo, out, "--format", "webdataset", "--which", "passing",
                  "--shard-size", "2", *SPLIT) == 0  # fmt: skip
    want = by_take(passing(demo))
    got = {}
    for split in ("train", "test"):
        shards = sorted(str(p) for p in (out / "shards").glob(f"{split}-*.tar"))
        assert len(shards) == 3  # 6 passing takes of one prompt, 2 a shard
        for s in wds.WebDataset(shards, shardshuffle=False).decode():
            meta = s["json"]
            assert s["__key__"] == f"{meta['group_id']}/{meta['take']:03d}"
            assert meta["split"] == split
            got[(meta["group_id"], meta["take"])] = (meta, s["flac"])
    assert got.keys() == want.keys()
    for k, (meta, flac) in got.items():
        assert meta["text"] == want[k]["text"]
        assert meta["score"] == pytest.approx(want[k]["score"])
        audio, rate = decoded(flac)
        assert rate == meta["sample_rate"] == 22050 and len(audio) == meta["num_samples"]
    ranks = {}
    for (gid, take), (meta, _) in got.items():
        ranks.setdefault(gid, []).append((-meta["score"], take, meta["rank"]))
    for rows in ranks.values():  # rank 1..n in score order
        assert [r[2] for r in sorted(rows)] == list(range(1, len(rows) + 1))


def test_lhotse_all_takes_resampled_to_stereo(demo, tmp_path):
    from lhotse import CutSet, RecordingSet, SupervisionSet

    out = tmp_path / "lhotse"
    assert export(demo, out, "--format", "lhotse", "--which", "all", "--resample", "16000",
                  "--channels", "2", *SPLIT) == 0  # fmt: skip
    takes = by_take(db_rows(demo, "SELECT * FROM takes"))
    n = 0
    for split in ("train", "test"):
        cuts = CutSet.from_file(out / f"cuts_{split}.jsonl.gz").with_recording_path_prefix(out)
        assert len(RecordingSet.from_file(out / f"recordings_{split}.jsonl.gz")) == len(cuts)
        assert len(SupervisionSet.from_file(out / f"supervisions_{split}.jsonl.gz")) == len(cuts)
        for cut in cuts:
            want = takes[(cut.custom["group_id"], cut.custom["take"])]
            audio = cut.load_audio()
            assert audio.shape[0] == 2 and cut.sampling_rate == 16000
            assert audio.shape[1] == pytest.approx(want["duration_s"] * 16000, abs=2)
            sup = cut.supervisions[0]
            assert sup.text == want["text"] and sup.emotion == want["emotion"]
            assert cut.custom["words_per_s"] == pytest.approx(want["words_per_s"])
            assert cut.custom["split"] == split
            n += 1
    assert n == len(takes) == 12
    assert "resampled with soxr" in (out / "README.md").read_text()


def test_nemo_manifests_relative_and_absolute(demo, tmp_path):
    selection = by_take(db_rows(demo, "SELECT * FROM selection"))
    for paths in ("relative", "absolute"):
        out = tmp_path / paths
        assert export(demo, out, "--format", "nemo", "--paths", paths, *SPLIT) == 0
        lines = [
            json.loads(line)
            for split in ("train", "test")
            for line in (out / f"{split}_manifest.json").read_text().splitlines()
        ]
        assert len(lines) == 4
        for line in lines:
            want = selection[(line["group_id"], line["take"])]
            path = Path(line["audio_filepath"])
            assert path.is_absolute() == (paths == "absolute")
            # NeMo resolves a relative audio path against the manifest's directory
            audio, rate = sf.read(path if path.is_absolute() else out / path)
            assert rate == 22050 and line["duration"] == pytest.approx(len(audio) / rate)
            assert line["text"] == want["text"] and line["emotion"] == want["emotion"]
            assert line["score"] == pytest.approx(want["score"])


def test_split_is_stable_and_keeps_a_prompt_together(demo, tmp_path):
    splits = []
    for run in range(2):
        out = tmp_path / f"run{run}"
        export(demo, out, "--format", "nemo", "--which", "all", "--split",
               "train=0.4,validation=0.3,test=0.3", "--split-by", "prompt")  # fmt: skip
        rows = [json.loads(x) for p in out.glob("*_manifest.json") for x in p.open()]
        splits.append({(r["group_id"], r["take"]): r["split"] for r in rows})
        per_prompt = {}
        for (gid, _), split in splits[-1].items():
            per_prompt.setdefault(gid.split("/")[1], set()).add(split)
        assert all(len(s) == 1 for s in per_prompt.values())
    assert splits[0] == splits[1] and len(splits[0]) == 12


def test_bad_input_is_refused_and_writes_nothing(demo, tmp_path, capsys):
    before = sorted(p.name for p in tmp_path.iterdir())
    cases = [
        (["--format", "tfrecord"], "unknown export format 'tfrecord'"),
        (["--where", "no_such_column > 1"], "--where 'no_such_column > 1' does not fit"),
        (["--where", "wer < 1; DROP TABLE takes"], "must be one SQL expression"),
    ]
    for args, message in cases:
        assert export(demo, tmp_path / "x", *args) == 2
        assert message in capsys.readouterr().err
    inside = demo / "results/groups/calm/export"
    assert export(demo, inside) == 2 and "inside" in capsys.readouterr().err
    assert not inside.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before == []
    # an existing export needs --overwrite; a directory that is not an export is never replaced
    assert export(demo, tmp_path / "e") == 0
    capsys.readouterr()
    assert export(demo, tmp_path / "e") == 2
    assert "pass --overwrite" in capsys.readouterr().err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine/notes.txt").write_text("keep me")
    assert export(demo, tmp_path / "mine", "--overwrite") == 2
    assert "not a bestofn export" in capsys.readouterr().err
    assert (tmp_path / "mine/notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "mine"]  # no partial sibling


def test_split_shares_must_sum_to_one(demo, tmp_path, capsys):
    """Shares are never renormalised: a sum other than 1 is refused, naming the shares, from
    the command line and from the config, before anything is written."""
    cases = [("train=0.7,test=0.7", "split shares train=0.7,test=0.7 sum to 1.4, not 1"),
             ("train=0.5", "split shares train=0.5 sum to 0.5, not 1")]  # fmt: skip
    for split, message in cases:
        assert export(demo, tmp_path / "x", "--split", split) == 2
        assert message in capsys.readouterr().err
    config = yaml.safe_load((demo / "config/config.yaml").read_text())
    config["export"]["split"]["fractions"] = {"train": 0.8, "test": 0.1}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    argv = ["export", str(demo / "results"), "--config", str(tmp_path / "config.yaml")]
    assert cli([*argv, "--out", str(tmp_path / "x")]) == 2
    assert "split shares train=0.8,test=0.1 sum to 0.9" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
    # decimals that miss 1 by float rounding only are 1
    assert export(demo, tmp_path / "ok", "--split", "train=0.7,validation=0.2,test=0.1") == 0


def test_broken_flac_stops_unless_skip_broken(demo, tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(demo / "results", results)
    # in the order the export checks them (groups by finish time, as it writes them): the
    # first broken take is the one it stops at, whichever group the demo run finished first
    sel = db_rows(
        demo,
        "SELECT group_id, take FROM selection JOIN (SELECT group_id, max(finished_at) AS done "
        "FROM takes GROUP BY 1) USING (group_id) ORDER BY done NULLS FIRST, group_id",
    )
    missing = results / f"groups/{sel[0]['group_id']}/takes/{sel[0]['take']:03d}.flac"
    broken = results / f"groups/{sel[1]['group_id']}/takes/{sel[1]['take']:03d}.flac"
    missing.unlink()
    broken.write_bytes(b"RIFF" + broken.read_bytes()[4:])
    out = tmp_path / "out"
    assert export(demo, out, "--format", "hf", results=results) == 2
    err = capsys.readouterr().err
    assert f"group {sel[0]['group_id']} take {sel[0]['take']}" in err and "missing" in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["results"]
    assert export(demo, out, "--format", "hf", "--skip-broken", results=results) == 0
    printed = capsys.readouterr().out
    assert f"skipped: group {sel[0]['group_id']}" in printed
    assert f"skipped: group {sel[1]['group_id']}" in printed and "not a FLAC" in printed
    assert "export: 2 take(s)" in printed
    assert json.loads((out / "bestofn_export.json").read_text())["rows"] == 2
    assert sel[1]["group_id"] in (out / "README.md").read_text()


def test_reexport_after_more_groups_rewrites_only_affected_shards(demo, tmp_path, capsys):
    """A database of 3 groups, then of all 4 (the last-finished one added): a re-export links
    the shards whose rows did not change and writes only the others."""
    results = tmp_path / "results"
    shutil.copytree(demo / "results/groups", results / "groups")
    order = [r["group_id"] for r in db_rows(
        demo, "SELECT group_id FROM takes GROUP BY 1 ORDER BY max(finished_at)")]  # fmt: skip
    sel = tiny_config()["selection"]

    def build(groups):
        build_database([results / "groups" / g / "scores.parquet" for g in groups],
                       results / "bestofn.duckdb", sel["filter"], sel["score"])  # fmt: skip

    build(order[:3])
    out = tmp_path / "out"
    args = ["--format", "webdataset", "--which", "passing", "--shard-size", "2", *SPLIT]
    assert export(demo, out, *args, results=results) == 0
    first = {p.name: p.stat().st_ino for p in (out / "shards").iterdir()}
    capsys.readouterr()
    build(order)
    assert export(demo, out, *args, "--overwrite", results=results) == 0
    line = capsys.readouterr().out
    after = {p.name: p.stat().st_ino for p in (out / "shards").iterdir()}
    kept = [n for n in first if after.get(n) == first[n]]  # hard links: the same inode
    written = len(after) - len(kept)
    assert kept and written >= 1 and f"wrote {written} shard(s), reused {len(kept)}" in line
    assert len(after) == 6  # 12 passing takes, 6 a split, 2 a shard


def test_snakemake_export_rule(demo):
    snakemake(demo, "export")
    out = demo / "export"
    marker = json.loads((out / "bestofn_export.json").read_text())
    assert marker["settings"]["format"] == "nemo" and marker["rows"] == 4
    lines = [json.loads(x) for p in out.glob("*_manifest.json") for x in p.open()]
    assert len(lines) == 4 and all((out / x["audio_filepath"]).is_file() for x in lines)
    assert "license: cc-by-4.0" in (out / "README.md").read_text()
    assert np.isfinite([x["score"] for x in lines]).all()
