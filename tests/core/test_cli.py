"""`bestofn run-group` runs one group in its own process (no worker), `bestofn check` validates."""

import json

import pyarrow.parquet as pq
import yaml
from helpers import tiny_config

from bestofn.cli import main


def test_run_group_in_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = {"emotion": "calm", "prompt_id": "p1", "text": "Good morning.", "n_takes": 2}
    out = tmp_path / "results/groups/calm/p1"
    models = json.dumps(tiny_config()["models"])
    assert (
        main(["run-group", "--params", json.dumps(spec), "--models", models, "--out", str(out)])
        == 0
    )
    rows = pq.read_table(out / "scores.parquet").to_pylist()
    assert [r["take"] for r in rows] == [0, 1]
    assert {r["worker_slot"] for r in rows} == {-1}  # loaded here, not on a worker
    assert rows[0]["group_load_s"] > 0


def test_check_reports_errors_with_exit_code(project, capsys):
    assert (
        main(["check", "--config", str(project / "config/config.yaml"), "--base", str(project)])
        == 0
    )
    assert "4 groups x 2 takes" in capsys.readouterr().out
    (project / "config/prompts.tsv").write_text("prompt_id\ttext\np1\t \n")
    assert (
        main(["check", "--config", str(project / "config/config.yaml"), "--base", str(project)])
        == 2
    )
    assert "field 'text'" in capsys.readouterr().err


def test_check_refuses_an_unknown_backend_option(project, capsys):
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config["models"]["generator"]["options"] = {"noise_scal": 0.5}
    (project / "config/config.yaml").write_text(yaml.safe_dump(config))
    args = ["check", "--config", str(project / "config/config.yaml"), "--base", str(project)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "generator backend 'piper' has no option 'noise_scal'" in err
    assert "did you mean 'noise_scale'?" in err
