"""The measurement ledger and the page generated from it: docs/PERFORMANCE.md must be exactly what
`python docs/bench/ledger.py render` prints, every ledger line must carry the required fields and
name an existing script under docs/bench/, and docs/ must hold no dated notebook."""

import importlib.util
import json
import re
import subprocess
import sys

import pytest
from helpers import REPO

SCRIPT = REPO / "docs" / "bench" / "ledger.py"


@pytest.fixture(scope="module")
def ledger():
    spec = importlib.util.spec_from_file_location("bench_ledger", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_what_the_generator_prints():
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "render"], cwd=REPO, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    page = (REPO / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8")
    assert page == run.stdout, "run `python docs/bench/ledger.py render > docs/PERFORMANCE.md`"
    assert len(page.splitlines()) <= 400
    check = subprocess.run(
        [sys.executable, str(SCRIPT), "render", "--check"], cwd=REPO, capture_output=True
    )
    assert check.returncode == 0


def test_check_fails_when_the_page_differs(ledger, tmp_path, monkeypatch):
    page = tmp_path / "PERFORMANCE.md"
    page.write_text(ledger.render(ledger.load(), ledger.load_areas()) + "an edit by hand\n")
    monkeypatch.setattr(ledger, "PAGE", page)
    assert ledger.main(["render", "--check"]) == 1
    page.write_text(ledger.render(ledger.load(), ledger.load_areas()))
    assert ledger.main(["render", "--check"]) == 0


def test_every_line_has_the_required_fields_and_an_existing_script(ledger):
    lines = ledger.load()
    assert len(lines) >= 50
    assert ledger.problems(lines, ledger.load_areas()) == []
    for entry in lines:
        for field in ledger.REQUIRED:
            assert str(entry[field]).strip(), (entry["_line"], field)
        scripts = ledger.scripts_in(entry["command"])
        assert scripts and all((REPO / s).is_file() for s in scripts), entry["_line"]


def test_the_checker_names_a_bad_line(ledger, tmp_path):
    good = json.loads((REPO / "docs" / "bench" / "ledger.jsonl").read_text().splitlines()[0])
    missing = {k: v for k, v in good.items() if k != "hardware"}
    no_script = {**good, "command": "python -m lab.bench pipeline"}
    gone = {**good, "command": "bash docs/bench/no_such_script.sh OUT"}
    bad_area = {**good, "figure": "nowhere.s_per_clip"}
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in (good, missing, no_script, gone, bad_area)))
    found = ledger.problems(ledger.load(path), ledger.load_areas())
    assert any(p.startswith("ledger.jsonl:2:") and "'hardware'" in p for p in found)
    assert any(p.startswith("ledger.jsonl:3:") and "names no script" in p for p in found)
    assert any(p.startswith("ledger.jsonl:4:") and "no_such_script.sh" in p for p in found)
    assert any(p.startswith("ledger.jsonl:5:") and "'nowhere'" in p for p in found)
    assert not any(p.startswith("ledger.jsonl:1:") for p in found)


def test_a_figure_measured_again_shows_its_latest_value_and_the_one_before(ledger):
    lines = [
        line for line in ledger.load() if line["figure"] == "generation.local.paired_s_per_clip"
    ]
    assert len(lines) >= 2
    page = ledger.render(ledger.load(), ledger.load_areas())
    row = next(r for r in page.splitlines() if "two groups per call (`pair_groups`)" in r)
    assert f"**{lines[-1]['value']}**" in row
    assert f"{lines[0]['value']}, {lines[0]['date']}" in row


def test_the_figures_the_product_cites_are_in_the_ledger(ledger):
    figures = {line["figure"]: line for line in ledger.load()}
    for figure in (
        "workflow.s_per_clip_per_gpu",
        "workflow.gpu_memory_used_peak",
        "workflow.gpu_memory_allocated_peak.paired_decode64",
        "workflow.gpu_memory_allocated_peak.unpaired_decode16",
    ):
        assert figure in figures, figure
    # Stand-in labels stay on the rows measured with stand-ins.
    assert "VoiceCLAP stand-in" in figures["workflow.s_per_clip_per_gpu"]["stand_in"]
    assert "STAND-IN" in figures["scorers.voiceclap.s_per_clip"]["stand_in"]


def test_docs_hold_no_dated_folder_and_no_raw_log():
    dated = re.compile(r"20\d\d-\d\d-\d\d")
    raw = {".log", ".csv", ".tgz", ".gz", ".tar", ".json"}
    for path in (REPO / "docs").rglob("*"):
        relative = path.relative_to(REPO)
        assert not dated.search(path.name), f"{relative}: a dated entry (the ledger holds figures)"
        assert path.suffix not in raw, f"{relative}: a raw output (the ledger names its command)"
