"""The readers every subcommand uses for a user's file: each way a file can be wrong raises
UserInputError naming the file and what is wrong (bestofn.cli prints it, exit 2)."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bestofn.cli import main
from bestofn.util.user_input import (
    UserInputError,
    load_json_file,
    load_tsv,
    load_yaml_file,
    read_parquet,
)


def refused(call, path, *needles):
    with pytest.raises(UserInputError) as e:
        call()
    assert e.value.path == str(path) and str(e.value).startswith(f"{path}: ")
    for needle in needles:
        assert needle in e.value.what, e.value.what


def test_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    refused(lambda: load_yaml_file(p, "config"), p, "no such config")
    p.write_text("a: 1\nb: [\n")
    refused(lambda: load_yaml_file(p, "config"), p, "not valid YAML at line 3, column 1")
    p.write_text("- 1\n")
    refused(lambda: load_yaml_file(p, "config"), p, "must be a mapping", "it is a list")
    p.write_text("")
    refused(lambda: load_yaml_file(p, "config"), p, "it is empty")
    p.write_bytes(b"a: \xff\n")
    refused(lambda: load_yaml_file(p, "config"), p, "not UTF-8")
    refused(lambda: load_yaml_file(tmp_path, "config"), tmp_path, "is a directory")
    p.write_text("a: 1\n")
    assert load_yaml_file(p) == {"a": 1}
    p.write_text("- 1\n")
    assert load_yaml_file(p, expect=list) == [1]


def test_json(tmp_path):
    p = tmp_path / "v.json"
    refused(lambda: load_json_file(p, "votes file"), p, "no such votes file")
    p.write_text('{"a": [')
    refused(lambda: load_json_file(p), p, "not valid JSON at line 1")
    p.write_text("[1]")
    refused(lambda: load_json_file(p, "votes file"), p, "must be a mapping")
    p.write_text('{"a": 1}')
    assert load_json_file(p) == {"a": 1}


def test_tsv(tmp_path):
    p = tmp_path / "s.tsv"
    refused(lambda: load_tsv(p, ["id"]), p, "no such sheet")
    p.write_text("id\ttext\nx\ty\tz\n")
    refused(lambda: load_tsv(p, ["id"]), p, "line 2: wrong number of tab-separated fields")
    p.write_text("name\tline\nx\ty\n")
    refused(lambda: load_tsv(p, ["id", "text"]), p, "missing column(s) ['id', 'text']")
    p.write_text("id\ttext\nx\ty\n")
    assert load_tsv(p, ["id"]) == [{"id": "x", "text": "y"}]


def test_parquet(tmp_path):
    p = tmp_path / "t.parquet"
    refused(lambda: read_parquet(p, ["take"]), p, "no such table")
    p.write_bytes(b"PAR1 not really")
    refused(lambda: read_parquet(p, ["take"]), p, "not a readable parquet table")
    pq.write_table(pa.table({"x": [1]}), p)
    refused(lambda: read_parquet(p, ["take"]), p, "missing column(s) ['take']")
    pq.write_table(pa.table({"take": [1], "x": [2]}), p)
    assert read_parquet(p, ["take"]).column_names == ["take"]


def test_cli_prints_it_with_exit_2(tmp_path, capsys, monkeypatch):
    import bestofn.ops.commands as commands

    def raises(args):
        raise UserInputError(tmp_path / "f.yaml", "what is wrong")

    monkeypatch.setattr(commands, "_check", raises)
    assert main(["check"]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'f.yaml'}: what is wrong\n"
