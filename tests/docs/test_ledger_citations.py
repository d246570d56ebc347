"""A comment that cites a measured figure names it by its ledger id (``ledger figure ID``): every
such id in src/ is a ``figure`` of docs/bench/ledger.jsonl, so a citation cannot outlive the
figure it names."""

import json
import re

from helpers import REPO

CITATION = re.compile(r"ledger figures? ((?:[a-z0-9_]+(?:\.[a-z0-9_]+)+(?:,? and |, | )?)+)")
FIGURE_ID = re.compile(r"[a-z0-9_]+(?:\.[a-z0-9_]+)+")


def cited() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted((REPO / "src").rglob("*")):
        if path.suffix not in (".py", ".yaml") or not path.is_file():
            continue
        # a citation may break across comment or docstring lines
        text = " ".join(line.strip().lstrip("#").strip() for line in path.read_text().split("\n"))
        for m in CITATION.finditer(text):
            for fid in FIGURE_ID.findall(m.group(1)):
                out.setdefault(fid.rstrip("."), set()).add(str(path.relative_to(REPO)))
    return out


def test_every_cited_figure_is_in_the_ledger():
    ledger = REPO / "docs" / "bench" / "ledger.jsonl"
    figures = {json.loads(line).get("figure") for line in ledger.read_text().splitlines() if line}
    found = cited()
    assert len(found) >= 10  # the citations are found at all
    missing = {fid: sorted(where) for fid, where in found.items() if fid not in figures}
    assert not missing, f"cited figure ids not in the ledger: {missing}"
