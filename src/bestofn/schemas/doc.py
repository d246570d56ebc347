"""The option tables of config/README.md, written from the config schema's descriptions.

Each table sits between ``<!-- options:begin NAME -->`` and ``<!-- options:end NAME -->`` in
the page, one row per option (name, default, description); the prose around the markers is
hand-written. ``python -m bestofn.schemas.doc config/README.md`` rewrites the tables in place;
``--check`` exits 1 when the page and the schema disagree (a test runs it)."""

from __future__ import annotations

import re
import sys

import yaml

from bestofn.schemas import schema
from bestofn.schemas.generated_page import page_main

# table name -> (the schema node, the prefix of its rows' names, the options under it that
# have a table of their own and so are left out of this one)
TABLES = {
    "config": ((), "", {"runtime", "database", "export"}),
    "runtime": (("properties", "runtime"), "", set()),
    "database": (("properties", "database"), "", set()),
    "export": (("properties", "export"), "", set()),
    "backend": (("$defs", "backend"), "", set()),
    "moss-fast": (("$defs", "moss_fast_runtime"), "", set()),
    "moss-pacing": (("$defs", "moss_pacing"), "", set()),
    "wavlm-speaker": (("$defs", "wavlm_speaker_runtime"), "", set()),
}
MARKERS = re.compile(
    r"(<!-- options:begin (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- options:end (?P=name) -->)",
    re.S,
)


def _default(node: dict, required: bool) -> str:
    if "default" not in node:
        return "required" if required else "–"
    value = node["default"]
    if value == {} and "properties" in node:
        return "–"  # a section: its own rows say its defaults
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6).strip()
    return f"`{text.removesuffix('...').strip()}`"


def _rows(node: dict, prefix: str, skip: set[str]) -> list[tuple]:
    rows = []
    needed = set(node.get("required", ()))
    for key, sub in node.get("properties", {}).items():
        name = prefix + key
        if name in skip:
            continue
        if "description" in sub:
            rows.append((name, _default(sub, key in needed), sub["description"]))
        elif "properties" not in sub:
            raise ValueError(f"config schema: {name} has no description")
        if "properties" in sub:
            rows += _rows(sub, name + ".", skip)  # a group of options: its own rows too
    return rows


def table(name: str) -> str:
    """The markdown table ``name`` (a key of TABLES)."""
    path, prefix, skip = TABLES[name]
    node = schema("config")
    for key in path:
        node = node[key]
    lines = ["| option | default | what it does |", "|---|---|---|"]
    for option, default, text in _rows(node, prefix, skip):
        lines.append(f"| `{option}` | {default} | {' '.join(text.split()).replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def render(page: str) -> str:
    """``page`` with every marked table rewritten from the schema; an unknown name raises."""

    def one(m: re.Match) -> str:
        if m.group("name") not in TABLES:
            raise ValueError(f"unknown options table {m.group('name')!r}")
        return m.group(1) + table(m.group("name")) + m.group(4)

    return MARKERS.sub(one, page)


def main(argv: list[str] | None = None) -> int:
    return page_main(
        "python -m bestofn.schemas.doc",
        __doc__,
        render,
        "the option tables differ from the schema",
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
