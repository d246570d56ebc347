"""The fenced code blocks of a Markdown page (the README, an export's dataset card), optionally
only those of one section, so that a test runs them as the page shows them: a snippet that no
longer runs fails the suite instead of a reader."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


@dataclass(frozen=True)
class Block:
    lang: str  # the fence's info word ("sh", "python"; "" when none)
    code: str
    line: int  # 1-based line of the opening fence, for the failure message


def code_blocks(path: str | Path, section: str | None = None) -> list[Block]:
    """The fenced blocks of ``path`` in order. ``section``: only those under the first heading
    whose text starts with it (``"Export"``), up to the next heading of the same or a higher
    level. Lines inside a fence are never headings (a shell comment starts with '#')."""
    blocks: list[Block] = []
    fence, lang, start, body = None, "", 0, []
    level = None  # the section's heading level while inside it
    found = section is None
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if fence:
            if line.startswith(fence) and not line[len(fence) :].strip():
                if level is not None or section is None:
                    blocks.append(Block(lang, "\n".join(body) + "\n", start))
                fence = None
            else:
                body.append(line)
            continue
        m = FENCE.match(line)
        if m:
            fence, lang, start, body = m.group(1), m.group(2), n, []
            continue
        h = HEADING.match(line)
        if h and section is not None:
            depth = len(h.group(1))
            if level is not None and depth <= level:
                break
            if level is None and not found and h.group(2).startswith(section):
                level, found = depth, True
    if fence:
        raise ValueError(f"{path}: the fence opened on line {start} is never closed")
    if not found:
        raise ValueError(f"{path}: no heading starts with {section!r}")
    return blocks
