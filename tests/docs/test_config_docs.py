"""config/README.md's option tables are the config schema's descriptions: one row per option,
written by ``python -m bestofn.schemas.doc config/README.md``; the page and the schema never
disagree, and no line of the page is a wall of text."""

import pytest
from helpers import REPO

from bestofn.schemas import schema
from bestofn.schemas.doc import TABLES, main, render, table

PAGE = REPO / "config/README.md"


def test_the_page_is_what_the_schema_writes():
    text = PAGE.read_text()
    assert render(text) == text, "run: python -m bestofn.schemas.doc config/README.md"
    for name in TABLES:
        assert f"<!-- options:begin {name} -->\n{table(name)}<!-- options:end {name} -->" in text


def test_every_option_is_a_row():
    """Every leaf option of the schema has a description and appears in one table."""
    rows = "".join(table(name) for name in TABLES)

    def leaves(node, prefix=""):
        for key, sub in node.get("properties", {}).items():
            if "properties" in sub:
                yield from leaves(sub, f"{prefix}{key}.")
            else:
                yield prefix + key

    config = schema("config")
    for full in leaves(config):
        top = full.split(".")[0]
        name = full if top not in ("runtime", "database", "export") else full.split(".", 1)[1]
        assert f"| `{name}` |" in rows, full
    for key in config["$defs"]["moss_fast_runtime"]["properties"]:
        assert f"| `{key}` |" in table("moss-fast"), key


def test_a_changed_description_makes_the_check_fail(tmp_path, capsys):
    stale = tmp_path / "README.md"
    stale.write_text(PAGE.read_text().replace("| `takes` | required | ", "| `takes` | 3 | ", 1))
    assert main([str(stale), "--check"]) == 1
    assert "python -m bestofn.schemas.doc" in capsys.readouterr().err
    assert main([str(stale)]) == 0 and stale.read_text() == PAGE.read_text()


def test_an_unknown_table_is_refused():
    with pytest.raises(ValueError, match="nope"):
        render("<!-- options:begin nope -->\n<!-- options:end nope -->")


def test_no_line_over_300_characters():
    long = [n for n, line in enumerate(PAGE.read_text().splitlines(), 1) if len(line) > 300]
    assert not long, f"config/README.md lines over 300 characters: {long}"
