"""The measurement ledger: one measured figure per line of docs/bench/ledger.jsonl, and the page
docs/PERFORMANCE.md generated from it, so that the page cannot drift from the records.

    python docs/bench/ledger.py render > docs/PERFORMANCE.md   # write the page
    python docs/bench/ledger.py render --check                 # exit 1 if the page differs
    python docs/bench/ledger.py check                          # exit 1 if a line is malformed

The ledger is append-only. A figure measured again gets a new line with the same `figure` id:
the page shows the latest line and lists the earlier values beside it. A line whose figure was
replaced by a differently named one carries `superseded_by` (that id) and leaves the tables.
The prose (one introduction and one paragraph of history per area) is docs/bench/areas.yaml.
Standard library and PyYAML only, so it runs in any environment the project installs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LEDGER = HERE / "ledger.jsonl"
AREAS = HERE / "areas.yaml"
PAGE = REPO / "docs" / "PERFORMANCE.md"

REQUIRED = ("figure", "value", "unit", "command", "tree", "hardware", "date", "side_by_side")
OPTIONAL = ("label", "note", "area", "superseded_by", "stand_in")
SCRIPT = re.compile(r"docs/bench/[\w./-]+\.(?:sh|py)")
FIGURE_ID = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")


def load(path: Path = LEDGER) -> list[dict]:
    """Every line of the ledger, in order; a line that is not a JSON object fails naming it."""
    lines = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            entry = json.loads(text)
        except json.JSONDecodeError as error:
            raise SystemExit(f"{path}:{number}: not JSON: {error}") from None
        if not isinstance(entry, dict):
            raise SystemExit(f"{path}:{number}: not a JSON object")
        entry["_line"] = number
        lines.append(entry)
    return lines


def load_areas(path: Path = AREAS) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def area_of(entry: dict) -> str:
    return entry.get("area") or entry["figure"].split(".")[0]


def scripts_in(command: str) -> list[str]:
    return SCRIPT.findall(command)


def problems(lines: list[dict], areas: dict, repo: Path = REPO) -> list[str]:
    """What is wrong with the ledger, one message per problem, each naming its line."""
    found = []
    area_ids = {a["id"] for a in areas["areas"]}
    figures = {e.get("figure") for e in lines}
    for e in lines:
        where = f"ledger.jsonl:{e['_line']}"
        for field in REQUIRED:
            value = e.get(field)
            if value is None or (isinstance(value, str) and not value.strip()):
                found.append(f"{where}: field {field!r} is missing or empty")
        unknown = set(e) - set(REQUIRED) - set(OPTIONAL) - {"_line"}
        if unknown:
            found.append(f"{where}: unknown field(s) {sorted(unknown)}")
        figure = e.get("figure")
        if not isinstance(figure, str) or not FIGURE_ID.match(figure):
            found.append(f"{where}: figure id {figure!r} is not dotted lower_case words")
            continue
        if area_of(e) not in area_ids:
            found.append(f"{where}: area {area_of(e)!r} is not in areas.yaml")
        command = e.get("command")
        if isinstance(command, str):
            named = scripts_in(command)
            if not named:
                found.append(f"{where}: command names no script under docs/bench/")
            for script in named:
                if not (repo / script).is_file():
                    found.append(f"{where}: command's script {script} does not exist")
        target = e.get("superseded_by")
        if target is not None and target not in figures:
            found.append(f"{where}: superseded_by {target!r} names no figure of the ledger")
    return found


def cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def current(lines: list[dict]) -> tuple[list[dict], dict[str, list[dict]]]:
    """The latest line of each figure not superseded (in order of first appearance), and the
    earlier lines of each figure."""
    latest: dict[str, dict] = {}
    history: dict[str, list[dict]] = {}
    for e in lines:
        if e["figure"] in latest:
            history.setdefault(e["figure"], []).append(latest[e["figure"]])
        latest[e["figure"]] = e
    shown = [e for e in latest.values() if not e.get("superseded_by")]
    return shown, history


def row(e: dict, earlier: list[dict]) -> str:
    what = e.get("label", e["figure"])
    if e.get("stand_in"):
        what += f" — *{e['stand_in']}*"
    if e.get("note"):
        what += f". {e['note']}"
    value = f"**{e['value']}**"
    if earlier:
        value += (
            " (before: " + "; ".join(f"{x['value']}, {x['date']}" for x in reversed(earlier)) + ")"
        )
    cells = [what, value, e["unit"], e["hardware"], e["date"], f"`{e['tree']}`"]
    cells += [e["side_by_side"], f"`{e['command']}`"]
    return "| " + " | ".join(cell(c) for c in cells) + " |"


def render(lines: list[dict], areas: dict) -> str:
    shown, history = current(lines)
    out = [areas["title"], "", areas["intro"].strip(), ""]
    for area in areas["areas"]:
        rows = [e for e in shown if area_of(e) == area["id"]]
        out += [f"## {area['title']}", ""]
        if area.get("intro"):
            out += [area["intro"].strip(), ""]
        if rows:
            out.append(
                "| figure | value | unit | hardware | date | tree | side by side | command |"
            )
            out.append("|---|---:|---|---|---|---|---|---|")
            out += [row(e, history.get(e["figure"], [])) for e in rows]
            out.append("")
        out += [f"**History.** {area['history'].strip()}", ""]
    superseded = sum(1 for e in lines if e.get("superseded_by"))
    earlier = sum(len(v) for v in history.values())
    out.append(
        f"*Generated by `python docs/bench/ledger.py render` from {len(lines)} ledger lines "
        f"({earlier} earlier measurements of a shown figure, {superseded} superseded). "
        "Do not edit by hand.*"
    )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="print docs/PERFORMANCE.md from the ledger")
    r.add_argument("--check", action="store_true", help="exit 1 if docs/PERFORMANCE.md differs")
    sub.add_parser("check", help="exit 1 if a ledger line is malformed")
    args = parser.parse_args(argv)
    lines, areas = load(), load_areas()
    found = problems(lines, areas)
    if found:
        print("\n".join(found), file=sys.stderr)
        return 1
    if args.command == "check":
        print(f"ledger: {len(lines)} lines, no problem")
        return 0
    page = render(lines, areas)
    if args.check:
        if PAGE.read_text(encoding="utf-8") != page:
            print(
                "docs/PERFORMANCE.md differs from the ledger: run "
                "`python docs/bench/ledger.py render > docs/PERFORMANCE.md`",
                file=sys.stderr,
            )
            return 1
        return 0
    sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
