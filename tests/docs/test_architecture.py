"""docs/ARCHITECTURE.md's "How to add…" stays true: it covers each extension point, and every
file it names exists."""

import re

from helpers import REPO

DOC = REPO / "docs" / "ARCHITECTURE.md"
KINDS = ("A scorer", "A generator", "An export format", "A selection helper", "A recipe")


def how_to_add() -> str:
    text = DOC.read_text()
    start = text.index("## How to add")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_every_extension_point_is_covered():
    section = how_to_add()
    for kind in KINDS:
        assert f"**{kind}**" in section, kind


def test_every_named_file_exists():
    paths = [
        p for p in re.findall(r"`([^`\s]+)`", how_to_add()) if "/" in p and "." in p.split("/")[-1]
    ]
    assert len(paths) >= 15  # the lists name files, not only prose
    missing = [p for p in paths if not (REPO / p).is_file()]
    assert not missing, f"docs/ARCHITECTURE.md names files that do not exist: {missing}"
