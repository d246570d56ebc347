"""`bestofn reward fit` on fake votes: listeners who prefer a higher ``vc_blend`` whatever the
hand-written score says. The fit must find that preference, beat the hand-written score on
held-out votes, and write a reward that DuckDB evaluates; too few votes must say so; bad input
must exit 2 and write nothing."""

import json

import duckdb
import numpy as np
import pytest
import yaml
from helpers import tiny_config, write_group

from bestofn.cli import main
from bestofn.ops.bradley_terry import agreement_hits, fit, group_folds
from bestofn.report.votes import FORMAT, Context, left_first, order_seed, results_id
from bestofn.select.database import build_database

HAND_SCORE = "quality"
LISTENERS = ("ann", "bob", "cyd")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """80 groups x 6 takes: the hand-written score (``quality``) is independent of
    ``vc_blend``, which listeners hear; ``noise`` is a column nobody hears."""
    root = tmp_path_factory.mktemp("reward")
    results = root / "results"
    rng = np.random.default_rng(3)
    files = []
    for g in range(80):
        files.append(
            write_group(
                results,
                f"{('calm', 'happy')[g % 2]}/p{g}",
                {
                    "wer": [0.0] * 6,
                    "quality": rng.normal(size=6),
                    "vc_blend": rng.normal(0.5, 0.2, size=6),
                    "noise": rng.normal(size=6),
                },
            )
        )
    build_database(files, results / "bestofn.duckdb", "wer <= 0.1", HAND_SCORE, [], seed=5)
    results_id(results, create=True)  # what writing the listening page does
    return results


def votes_doc(results, listener, choose, groups=None):
    """What the listening page exports for ``listener`` (one vote per group, in this listener's
    seeded left/right order); ``choose(left_values, right_values)`` gives the choice."""
    con = duckdb.connect(str(results / "bestofn.duckdb"), read_only=True)
    try:
        ctx = Context.of(con, results)
        values = {
            (g, t): {"vc_blend": b, "quality": q}
            for g, t, b, q in con.execute("SELECT group_id, take, vc_blend, quality FROM takes")
            .fetchall()
        }  # fmt: skip
    finally:
        con.close()
    seed = order_seed(ctx.seed, listener)
    votes = []
    for g, (_, _, order, pair) in sorted(ctx.pairs.items())[:groups]:
        left, right = left_first(seed, g, order)
        votes.append({
            "group_id": g, "left_take": left, "right_take": right,
            "choice": choose(values[(g, left)], values[(g, right)]), "confidence": None,
            "listener": listener, "time": "2026-12-01T10:00:00Z", "page_seed": ctx.seed,
            "order_seed": seed, "build": ctx.build, "pair": pair,
        })  # fmt: skip
    return {"format": FORMAT, "results_id": ctx.results_id, "results": str(results),
            "build": ctx.build, "page_seed": ctx.seed, "listener": listener,
            "order_seed": seed, "exported_at": "2026-12-01T10:05:00Z", "votes": votes}  # fmt: skip


def blend_lover(rng):
    """Prefers the higher vc_blend (a logistic listener, steep), says 'same' now and then."""

    def choose(left, right):
        if rng.random() < 0.05:
            return "same"
        p_left = 1 / (1 + np.exp(-12 * (left["vc_blend"] - right["vc_blend"])))
        return "left" if rng.random() < p_left else "right"

    return choose


def write_votes(tmp_path, results, groups=None, seed=0):
    rng = np.random.default_rng(seed)
    folder = tmp_path / "votes"
    folder.mkdir(exist_ok=True)
    for who in LISTENERS:
        doc = votes_doc(results, who, blend_lover(rng), groups)
        (folder / f"{who}.json").write_text(json.dumps(doc))
    return folder


def config_file(tmp_path, results, **reward_fit):
    config = tiny_config(
        results=str(results),
        selection={"filter": "wer <= 0.1", "score": HAND_SCORE},
        **({"reward_fit": reward_fit} if reward_fit else {}),
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def fit_cli(tmp_path, results, votes, *more, **reward_fit):
    out = tmp_path / "reward.yaml"
    config = config_file(tmp_path, results, **reward_fit)
    rc = main(["reward", "fit", "--votes", str(votes), "--config", str(config), "--out", str(out),
               *more])  # fmt: skip
    return rc, out


def test_recovers_planted_preference(tmp_path, results, capsys):
    votes = write_votes(tmp_path, results)
    rc, out = fit_cli(tmp_path, results, votes, "--name", "ears")
    printed = capsys.readouterr().out
    assert rc == 0, printed
    # vc_blend carries the dominant, positive weight; the column nobody hears a small one.
    weights = {
        line.split()[0]: float(line.split()[1])
        for line in printed.split("weights (")[1].splitlines()[1:]
        if line.startswith("  ")
    }
    assert max(weights, key=lambda c: abs(weights[c])) == "vc_blend", weights
    assert weights["vc_blend"] > 0 and abs(weights["noise"]) < weights["vc_blend"] / 4
    assert "BETTER: the fitted reward" in printed and "TOO FEW" not in printed
    hand = float(printed.split("hand-written selection.score: ")[1].split()[0])
    fitted = float(printed.split("fitted reward:")[1].split()[0])
    assert fitted > 0.75 and fitted > hand + 0.15, printed

    # The snippet is a named reward whose SQL ranks the takes by vc_blend.
    doc = yaml.safe_load(out.read_text())
    reward = doc["selection"]["rewards"]["ears"]
    assert reward["filter"] == "wer <= 0.1" and reward["top"] == 1
    con = duckdb.connect(str(results / "bestofn.duckdb"), read_only=True)
    try:
        per_group = con.execute(
            f"SELECT corr(r, vc_blend) FROM (SELECT ({reward['score']}) AS r, vc_blend FROM takes)"
        ).fetchone()[0]
    finally:
        con.close()
    assert per_group > 0.9


def test_too_few_votes_are_said_plainly(tmp_path, results, capsys):
    votes = write_votes(tmp_path, results, groups=6)
    rc, out = fit_cli(tmp_path, results, votes)
    printed = capsys.readouterr().out
    assert rc == 0 and out.is_file()
    assert "TOO FEW VOTES to beat the hand-written score" in printed, printed
    assert "BETTER: the fitted" not in printed
    comments = [line[2:] for line in out.read_text().splitlines() if line.startswith("# ")]
    assert "TOO FEW VOTES" in " ".join(comments)  # the snippet says it too


def test_enough_votes_but_no_preference_is_not_called_better(tmp_path, results, capsys):
    rng = np.random.default_rng(9)
    folder = tmp_path / "coin"
    folder.mkdir()
    for who in LISTENERS:
        doc = votes_doc(results, who, lambda a, b: ("left", "right")[rng.integers(2)])
        (folder / f"{who}.json").write_text(json.dumps(doc))
    rc, _ = fit_cli(tmp_path, results, folder, min_votes=10)
    printed = capsys.readouterr().out
    assert rc == 0 and "NOT SHOWN BETTER" in printed, printed


def _refused(tmp_path, results, votes, needle, capsys, **reward_fit):
    rc, out = fit_cli(tmp_path, results, votes, **reward_fit)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ") and needle in err, err
    assert "Traceback" not in err
    assert not out.exists()
    return err


def test_bad_input_exits_2_and_writes_nothing(tmp_path, results, capsys):
    _refused(tmp_path, results, tmp_path / "nope.json", "nope.json: no such votes file", capsys)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    _refused(tmp_path, results, broken, "broken.json: not valid JSON", capsys)
    doc = votes_doc(results, "ann", lambda a, b: "left")
    doc["votes"][2]["choice"] = "maybe"
    bad_vote = tmp_path / "bad_vote.json"
    bad_vote.write_text(json.dumps(doc))
    _refused(tmp_path, results, bad_vote, "bad_vote.json: vote 2: choice must be", capsys)
    doc = votes_doc(results, "ann", lambda a, b: "left")
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc | {"results_id": "someone-else"}))
    _refused(tmp_path, results, other, "other.json: votes of another results directory", capsys)
    good = write_votes(tmp_path, results, groups=10)
    err = _refused(tmp_path, results, good, "reward_fit.columns: unknown column 'loudness'",
                   capsys, columns=["vc_blend", "loudness"])  # fmt: skip
    assert "config.yaml" in err


def test_folds_keep_a_group_whole_and_the_math():
    groups = np.array(["a", "a", "b", "c", "c", "c", "d"], dtype=object)
    fold = group_folds(groups, 2, seed=1)
    for g in set(groups):
        assert len(set(fold[groups == g])) == 1
    assert set(fold) == {0, 1}
    assert list(agreement_hits(np.array([1.0, -1.0, 0.0, np.nan]), np.array([1, 1, 0, 1]))) == [
        1.0, 0.0, 0.5, 0.5,
    ]  # fmt: skip
    # A left lean alone (no column matters) goes to the bias, not the weights.
    rng = np.random.default_rng(0)
    diffs = rng.normal(size=(400, 2))
    left = (rng.random(400) < 0.8).astype(float)
    model = fit(diffs, left, l2=1.0)
    assert model.left_bias > 1.0 and np.all(np.abs(model.weights) < 0.3)


def test_imported_votes_are_the_default_and_the_reward_lands_in_results(tmp_path, results, capsys):
    """`bestofn listen import` keeps the votes in RESULTS/votes/; `reward fit` without --votes
    reads them there and writes RESULTS/rewards/NAME.yaml."""
    import shutil

    own = tmp_path / "results"
    shutil.copytree(results, own)
    votes = write_votes(tmp_path, own, groups=30)
    files = sorted(str(p) for p in votes.glob("*.json"))
    assert main(["listen", "import", *files, "--results", str(own)]) == 0
    capsys.readouterr()
    config = config_file(tmp_path, own)
    assert main(["reward", "fit", "--config", str(config), "--name", "panel"]) == 0
    printed = capsys.readouterr().out
    assert "votes: 90 counted" in printed, printed
    written = yaml.safe_load((own / "rewards" / "panel.yaml").read_text())
    assert list(written["selection"]["rewards"]) == ["panel"]
    assert not list((own / "rewards").glob(".*tmp"))  # written beside, then renamed
    # a name that cannot be a reward's, and a results directory without a database
    assert main(["reward", "fit", "--config", str(config), "--name", "9 lives"]) == 2
    assert "--name '9 lives'" in capsys.readouterr().err
    (own / "bestofn.duckdb").unlink()
    assert main(["reward", "fit", "--config", str(config)]) == 2
    assert "bestofn.duckdb: no results database" in capsys.readouterr().err
