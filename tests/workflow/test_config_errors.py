"""`snakemake -n` on a missing, malformed or wrongly shaped config or sheet: what the user reads.

Each ends as the `bestofn` command ends on bad input: ``error: <file>: <what>``, exit status 2,
no Python traceback. The workflow's own code (Snakefile, workflow/rules/common.smk) names the
file wherever it is the one reading: the default config file, the sheets, the config's fields.
A ``--configfile`` is read by Snakemake's command line before any workflow code runs; there
snakemake_logger_plugin_bestofn (imported by Snakemake with its logger plugins) names it."""

import pytest
from helpers import make_tiny_project, snakemake


@pytest.fixture
def project(tmp_path):
    return make_tiny_project(tmp_path / "project")


def failed(project, *args):
    proc = snakemake(project, "-n", *args, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out and 'File "' not in out, out
    return out


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


def test_a_configfile_option_is_named_though_snakemake_reads_it(project, tmp_path):
    """Snakemake reads --configfile before our code: the plugin's wrap of its loader names the
    file (missing, not YAML, not a mapping); one that parses reaches the workflow's check."""
    missing = tmp_path / "missing.yaml"
    assert f"error: {missing}: no such config" in failed(project, "--configfile", str(missing))
    bad = tmp_path / "bad.yaml"
    bad.write_text("takes: 3\nmodels: [\n")
    out = failed(project, "--configfile", str(bad))
    assert f"error: {bad}: not valid YAML at line 3, column 1" in out, out
    bad.write_text("- takes: 3\n")
    assert f"{bad}: the config must be a mapping" in failed(project, "--configfile", str(bad))
    bad.write_text("takes: three\n")
    assert f"error: {bad}: config field (top level):" in failed(project, "--configfile", str(bad))


def test_the_plugin_wraps_the_loader_of_the_snakemake_it_was_read_on(tmp_path):
    """The wrap is in place on the pinned Snakemake, and hands a file that loads to
    Snakemake's own loader unchanged."""
    import snakemake.cli  # noqa: F401 - what `snakemake` imports before its plugins
    from snakemake.common import configfile
    from snakemake.settings import types

    import snakemake_logger_plugin_bestofn as plugin

    assert plugin.INSTALLED, "snakemake is not the version in VERIFIED_ON"
    assert types.load_configfile.__wrapped__ is configfile.load_configfile
    good = tmp_path / "good.json"  # JSON, which Snakemake parses first: its result comes back
    good.write_text('{"takes": 3, "models": {"generator": {"backend": "piper"}}}')
    assert types.load_configfile(good) == configfile.load_configfile(good)
