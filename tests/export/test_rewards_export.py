"""Named rewards end to end: the tiny project with a second reward (top 3) run through
snakemake; `bestofn select` (the whole selection, or one reward) from the saved scores;
`bestofn export --reward NAME --top K` and `--format pairs` loaded back by `datasets`; bad
input."""

import io
from pathlib import Path

import duckdb
import pytest
import soundfile as sf
import yaml
from helpers import make_tiny_project, snakemake, tiny_config

from bestofn.cli import main as cli

pytestmark = pytest.mark.slow  # one snakemake run of the tiny project for the module

FILTER, SCORE = "words_per_s > 0.5", "-abs(words_per_s - 2.5)"
REWARDS = {"long": {"score": "z(duration_s, emotion)", "top": 3}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The tiny project (2 emotions x 2 prompts, 5 takes) with the reward ``long`` beside the
    default, after one snakemake run."""
    root = make_tiny_project(tmp_path_factory.mktemp("rewards_export"))
    config = tiny_config(takes=5, selection={"filter": FILTER, "score": SCORE, "rewards": REWARDS})
    (root / "config/config.yaml").write_text(yaml.safe_dump(config))
    snakemake(root)
    return root


def db_rows(run: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(run / "results/bestofn.duckdb"), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def ranked(run: Path, score: str) -> dict[str, list[tuple[int, float]]]:
    """group -> [(take, score)] of its passing takes, best first, recomputed here in Python."""
    takes = db_rows(run, "SELECT group_id, take, emotion, words_per_s, duration_s FROM takes")
    out: dict[str, list] = {}
    if score == "long":
        import numpy as np

        stats = {}
        for e in {t[2] for t in takes}:
            d = np.array([t[4] for t in takes if t[2] == e])
            stats[e] = (d.mean(), d.std())
    for gid, take, emotion, wps, dur in takes:
        if not wps > 0.5:
            continue
        value = (
            -abs(wps - 2.5) if score == "default" else (dur - stats[emotion][0]) / stats[emotion][1]
        )
        out.setdefault(gid, []).append((take, value))
    for v in out.values():
        v.sort(key=lambda tv: (-tv[1], tv[0]))
    return out


def export(run: Path, out: Path, *args) -> int:
    return cli(["export", str(run / "results"), "--config", str(run / "config/config.yaml"),
                "--base", str(run), "--out", str(out), "--split", "train", *args])  # fmt: skip


def load(out: Path):
    import datasets

    ds = datasets.load_dataset(str(out), cache_dir=str(out.parent / "hf-cache"))
    return ds["train"]


def test_the_workflow_keeps_both_rewards_top_k_and_dedup(run):
    default, long = ranked(run, "default"), ranked(run, "long")
    picks = db_rows(run, "SELECT reward, group_id, take, rank FROM reward_picks")
    want = {("default", g, t, 1) for g, v in default.items() for t, _ in v[:1]}
    want |= {("long", g, t, i + 1) for g, v in long.items() for i, (t, _) in enumerate(v[:3])}
    assert set(picks) == want
    assert max(r for _, _, _, r in picks) == 3
    assert db_rows(run, "SELECT group_id, take FROM selection ORDER BY 1") == sorted(
        (g, v[0][0]) for g, v in default.items()
    )
    won = dict(
        ((g, t), r)
        for g, t, r in db_rows(run, "SELECT group_id, take, rewards FROM reward_selection")
    )
    assert len(won) == len({(g, t) for _, g, t, _ in picks})  # each take once
    for (g, t), rewards in won.items():
        assert rewards == [n for n in ("default", "long") if (n, g, t) in {p[:3] for p in picks}]
    curve = db_rows(run, "SELECT reward, emotion, k FROM best_of_k")
    assert {
        (r, e, k) for r in ("default", "long") for e in ("calm", "happy") for k in range(1, 6)
    } == set(curve)


def test_export_a_named_reward_top_k(run, tmp_path):
    assert export(run, tmp_path / "long", "--reward", "long", "--top", "2") == 0
    rows = load(tmp_path / "long").to_list()
    long = ranked(run, "long")
    assert sorted((r["group_id"], r["rank"], r["take"]) for r in rows) == sorted(
        (g, i + 1, t) for g, v in long.items() for i, (t, _) in enumerate(v[:2])
    )
    assert {r["reward"] for r in rows} == {"long"}
    for r in rows:
        assert r["score"] == pytest.approx(dict(long[r["group_id"]])[r["take"]])
        default_pick = ranked(run, "default")[r["group_id"]][0][0]
        assert r["rewards"] == (["default", "long"] if r["take"] == default_pick else ["long"])


def test_bestofn_select_reruns_selection_from_the_saved_scores(run, tmp_path):
    import shutil

    project = Path(shutil.copytree(run, tmp_path / "p", symlinks=True))
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config["selection"]["rewards"]["short"] = {"score": "-duration_s", "top": 2}
    (project / "config/config.yaml").write_text(yaml.safe_dump(config))
    groups_before = {p: p.stat().st_mtime_ns for p in (project / "results/groups").rglob("*")}
    args = ["select", "--config", "config/config.yaml", "--base", str(project)]
    config_path = str(project / "config/config.yaml")
    assert cli([*args[:2], config_path, "--base", str(project), "--reward", "short"]) == 0
    db = project / "results/bestofn.duckdb"
    con = duckdb.connect(str(db), read_only=True)
    short = con.execute("SELECT count(*) FROM reward_picks WHERE reward = 'short'").fetchone()[0]
    names = [r[0] for r in con.execute("SELECT name FROM rewards ORDER BY position").fetchall()]
    con.close()
    assert short == 4 * 2 and names == ["default", "long", "short"]
    # the whole selection, with a new default score, from the saved parquets
    config["selection"]["score"] = "duration_s"
    (project / "config/config.yaml").write_text(yaml.safe_dump(config))
    assert cli(["select", "--config", config_path, "--base", str(project)]) == 0
    longest = ranked(project, "long")  # z within an emotion orders takes as duration does
    got = db_rows(project, "SELECT group_id, take FROM selection ORDER BY 1")
    assert got == sorted((g, v[0][0]) for g, v in longest.items())
    # no group was touched: no GPU, no rerun
    assert groups_before == {
        p: p.stat().st_mtime_ns for p in (project / "results/groups").rglob("*")
    }
    assert cli(["select", "--config", config_path, "--base", str(project), "--reward", "nope"]) == 2


def test_pairs_load_with_datasets(run, tmp_path):
    out = tmp_path / "pairs"
    assert export(run, out, "--format", "pairs", "--pairs-per-group", "2", "--margin", "0.01") == 0
    from datasets import Audio

    rows = load(out).cast_column("chosen_audio", Audio(decode=False))
    rows = rows.cast_column("rejected_audio", Audio(decode=False)).to_list()
    want = []
    for g, v in ranked(run, "default").items():
        for i in range(min(2, len(v) // 2)):
            (hi, a), (lo, b) = v[i], v[len(v) - 1 - i]
            if a - b < 0.01:
                break
            want.append((g, hi, lo))
    assert sorted((r["group_id"], r["chosen_take"], r["rejected_take"]) for r in rows) == sorted(
        want
    )
    assert want
    for r in rows:
        assert r["chosen_score"] - r["rejected_score"] >= 0.01
        assert r["score_margin"] == pytest.approx(r["chosen_score"] - r["rejected_score"])
        assert r["chosen_words_per_s"] > 0.5 and r["rejected_words_per_s"] > 0.5
        assert r["text"] and r["description"] in ("A calm voice.", "A happy voice.")
        assert r["instruction"] is None  # piper takes no Instruction
        a, rate = sf.read(io.BytesIO(r["chosen_audio"]["bytes"]))
        b, _ = sf.read(io.BytesIO(r["rejected_audio"]["bytes"]))
        assert rate == r["chosen_sample_rate"] and len(a) > 0 and len(b) > 0
        assert len(a) != len(b) or (a != b).any()  # two different takes
    assert "preference" in (out / "README.md").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--format", "pairs", "--reward", "nope"], "--reward 'nope': no such reward"),
        (["--format", "pairs", "--pairs-per-group", "0"], "--pairs-per-group '0'"),
        (["--format", "pairs", "--margin", "abc"], "--margin 'abc': not a number"),
        (["--reward", "long", "--top", "x"], "--top 'x'"),
    ],
)
def test_bad_input_is_named_and_writes_nothing(run, tmp_path, capsys, args, message):
    out = tmp_path / "never"
    assert export(run, out, *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not out.exists() and not any(tmp_path.glob(".never*"))
