"""Sheets written by `bestofn prompts import` run end to end through snakemake (the tiny
project's piper generator): every imported prompt under its own emotion only, in its own
language; then a dry run plans exactly the groups whose prompt row changed what they make."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from helpers import snakemake, verify

from bestofn.core.plan import read_sheet

BIN = Path(sys.executable).parent


def scene(i, language, emotions, prompt):
    return {"id": i, "language": language, "sample_info": {"emotions_sampled": emotions},
            "dramabox_prompt": prompt}  # fmt: skip


SCENES = [
    scene(1, "English", "Fear (clearly present)",
          'A man.\n\n(whisper) "Nobody leaves this room until I say so."'),
    scene(2, "French", "Astonishment/Surprise (extremely present)",
          'A woman.\n\n(gasping) "Non, c’est pas possible." (cracks) "C’est un os."'),
    scene(3, "German", "Hope/Optimism (clearly present)",
          'A man.\n\n(warm) "Da bist du ja, ich hab dich."'),
    scene(4, "English", "Fear (clearly present)", 'A man.\n\n(shouting) "Max! Max!"'),  # skipped
]  # fmt: skip


def planned_groups(project: Path) -> list[str]:
    out = snakemake(project, "-n").stdout
    return sorted(
        line.split("results/groups/", 1)[1].strip()
        for line in out.splitlines()
        if line.strip().startswith("output: results/groups/")
    )


@pytest.mark.slow
def test_imported_sheets_run_through_snakemake(project):
    clone = project.parent / "Voice-Acting-Pipeline"
    (clone / "data").mkdir(parents=True)
    (clone / "data/dramabox_sit_situation.json").write_text(json.dumps(SCENES))
    proc = subprocess.run(
        [str(BIN / "bestofn"), "prompts", "import", str(clone), "--out", "imported"],
        cwd=project, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "1 skipped" in proc.stdout
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config.update(emotions="imported/emotions.tsv", prompts="imported/prompts.tsv")
    (project / "config/config.yaml").write_text(yaml.safe_dump(config))

    groups = ["Astonishment_Surprise/db-sit_situation-2", "Fear/db-sit_situation-1",
              "Hope_Enthusiasm_Optimism/db-sit_situation-3"]  # fmt: skip
    assert planned_groups(project) == groups  # each prompt with its own emotion only
    snakemake(project)
    verify(project)  # every take row against its FLAC
    langs = {}
    for g in groups:
        table = pq.read_table(project / "results/groups" / g / "scores.parquet")
        langs[g] = set(table.column("language").to_pylist())
    assert langs == dict(zip(groups, [{"fr"}, {"en"}, {"de"}], strict=True))
    assert planned_groups(project) == []
    # exported as lhotse cuts, each supervision in its take's language
    proc = subprocess.run(
        [str(BIN / "bestofn"), "export", "results", "--config", "config/config.yaml", "--out",
         "export", "--format", "lhotse", "--which", "all"],
        cwd=project, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from lhotse import SupervisionSet

    sups = [s for f in (project / "export").glob("supervisions_*.jsonl.gz")
            for s in SupervisionSet.from_file(f)]  # fmt: skip
    assert {s.id.rsplit("/", 1)[0]: s.language for s in sups} == {
        g: lang for g, (lang,) in langs.items()
    }

    # The generator (piper) takes no instruction: a new instruction or burst changes no take.
    rows = read_sheet(project / "imported/prompts.tsv", "prompts")
    header = list(rows[0])

    def write(rows):
        lines = ["\t".join(header)] + ["\t".join(r[c] for c in header) for r in rows]
        (project / "imported/prompts.tsv").write_text("\n".join(lines) + "\n")

    write([{**r, "instruction": "Whisper it.", "vocal_burst": "a sigh"} for r in rows])
    assert planned_groups(project) == []
    # A prompt's language is part of its group's identity: that group alone is planned.
    write([{**r, "language": "de" if r["language"] == "fr" else r["language"]} for r in rows])
    assert planned_groups(project) == ["Astonishment_Surprise/db-sit_situation-2"]
