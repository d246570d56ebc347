"""`snakemake -n` on a missing, malformed or wrongly shaped config or sheet: what the user reads.

The workflow's own code (Snakefile, workflow/rules/common.smk) names the file and what is wrong
with it, without a Python traceback, wherever it is the one reading: the default config file,
the sheets, the config's fields. A ``--configfile`` is read by Snakemake's command line before
any workflow code runs, so its messages are Snakemake's own; the tests below hold them to
naming the problem, and say where they do not name the file."""

import pytest
from helpers import make_tiny_project, snakemake


@pytest.fixture
def project(tmp_path):
    return make_tiny_project(tmp_path / "project")


def failed(project, *args):
    proc = snakemake(project, "-n", *args, check=False)
    assert proc.returncode != 0
    return proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "text, says",
    [
        (None, "config/config.yaml: no such config"),
        ("takes: 3\nmodels: [\n", "config/config.yaml: not valid YAML at line 3, column 1"),
        ("- takes: 3\n", "config/config.yaml: the config must be a mapping"),
        ("takes: 3\n", "config/config.yaml: config field (top level): 'emotions' is a required"),
    ],
)
def test_the_default_config_file_is_named(project, text, says):
    config = project / "config/config.yaml"
    config.unlink()
    if text is not None:
        config.write_text(text)
    out = failed(project)
    assert says in out, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize(
    "text, says",
    [
        (None, "prompts.tsv: no such prompts sheet"),
        ("prompt_id\ttext\np1\tHello.\textra\n", "prompts.tsv line 2: wrong number of"),
        ("id\tline\np1\tHello.\n", "prompts.tsv: missing column(s) ['prompt_id', 'text']"),
    ],
)
def test_a_bad_sheet_is_named(project, text, says):
    sheet = project / "config/prompts.tsv"
    sheet.unlink()
    if text is not None:
        sheet.write_text(text)
    out = failed(project)
    assert says in out, out
    assert "Traceback" not in out, out


def test_configfile_option_messages_are_snakemakes(project, tmp_path):
    """What Snakemake itself prints for --configfile (it reads the file before our code)."""
    missing = tmp_path / "missing.yaml"
    out = failed(project, "--configfile", str(missing))
    assert str(missing) in out and "FileNotFoundError" in out  # Snakemake's traceback
    bad = tmp_path / "bad.yaml"
    bad.write_text("takes: 3\nmodels: [\n")
    assert "Config file is not valid JSON or YAML" in failed(project, "--configfile", str(bad))
    bad.write_text("- takes: 3\n")
    assert "keys at top level" in failed(project, "--configfile", str(bad))
    # a config that parses: the workflow's own check, the file named
    bad.write_text("takes: three\n")
    out = failed(project, "--configfile", str(bad))
    assert f"{bad}: config field (top level):" in out and "Traceback" not in out, out
