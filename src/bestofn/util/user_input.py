"""Files that a user hands the ``bestofn`` command (configs, sheets, locks, votes, thresholds),
read so that every way they can be wrong ends the same way: ``UserInputError(path, what)``,
which ``bestofn.cli.main`` prints as ``error: <file>: <what>`` with exit status 2.

A subcommand that reads such a file goes through these readers (or raises ``UserInputError``
itself for a check of its own) and gets the message and the exit status for free; the test
that walks every subcommand (tests/util/test_cli_errors.py) holds each one to it."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

EXIT_STATUS = 2  # bad input, as argparse's own usage errors


class UserInputError(ValueError):
    """A file the user gave that is missing, does not parse, or has the wrong shape."""

    def __init__(self, path: str | Path, what: str):
        self.path, self.what = str(path), what
        super().__init__(f"{path}: {what}")


def read_text(path: str | Path, kind: str = "file") -> str:
    """The UTF-8 text of ``path``; a missing, unreadable or undecodable file raises
    UserInputError naming it (``kind`` says what the file was for: "config", "votes file")."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserInputError(path, f"no such {kind}") from None
    except IsADirectoryError:
        raise UserInputError(path, f"is a directory, not a {kind}") from None
    except UnicodeDecodeError as e:
        raise UserInputError(path, f"not UTF-8 text (byte {e.start}): save it as UTF-8") from None
    except OSError as e:
        raise UserInputError(path, f"cannot read the {kind}: {e.strerror or e}") from None


def _shape_name(value) -> str:
    if value is None:
        return "empty"
    return {dict: "a mapping", list: "a list", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _expect(path, value, expect: type | None, kind: str):
    if expect is not None and not isinstance(value, expect):
        want = {dict: "a mapping (key: value lines)", list: "a list"}.get(expect, expect.__name__)
        raise UserInputError(path, f"the {kind} must be {want}, but it is {_shape_name(value)}")
    return value


def load_yaml_file(path: str | Path, kind: str = "YAML file", expect: type | None = dict):
    """The parsed YAML of ``path``; missing, malformed (the line and column named) or not of
    type ``expect`` (None: any) raises UserInputError."""
    import yaml

    text = read_text(path, kind)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserInputError(path, f"not valid YAML{where}: {problem}") from None
    return _expect(path, value, expect, kind)


def load_json_file(path: str | Path, kind: str = "JSON file", expect: type | None = dict):
    """The parsed JSON of ``path``, as :func:`load_yaml_file`."""
    text = read_text(path, kind)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserInputError(
            path, f"not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}"
        ) from None
    return _expect(path, value, expect, kind)


def load_tsv(path: str | Path, required: list[str] = (), kind: str = "sheet") -> list[dict]:
    """The rows of a tab-separated file with a header line, as dicts; a missing file, a missing
    required column or a row with the wrong number of fields raises UserInputError."""
    text = read_text(path, kind)
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t")
    header = reader.fieldnames or []
    missing = [c for c in required if c not in header]
    if missing:
        raise UserInputError(path, f"missing column(s) {missing}; found columns {header}")
    rows = []
    for i, row in enumerate(reader):
        if None in row or any(v is None for v in row.values()):
            raise UserInputError(path, f"line {i + 2}: wrong number of tab-separated fields")
        rows.append(row)
    return rows


def read_parquet(path: str | Path, columns: list[str] | None = None, kind: str = "table"):
    """A pyarrow table of ``path``; missing, not parquet, or lacking ``columns`` raises
    UserInputError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise UserInputError(path, f"no such {kind}")
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as e:
        raise UserInputError(path, f"not a readable parquet {kind} ({e})") from None
    missing = [c for c in columns or [] if c not in schema.names]
    if missing:
        raise UserInputError(path, f"missing column(s) {missing}; found columns {schema.names}")
    return pq.read_table(path, columns=columns)
