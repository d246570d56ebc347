"""config/README.md's backend table, written from the registry: one row per declared
backend, its weights and options as the class declares them (``table_weights``,
``table_options``). The table sits between ``<!-- backends:begin -->`` and
``<!-- backends:end -->``; ``python -m bestofn.backends.doc config/README.md`` rewrites it in
place, ``--check`` exits 1 when it is out of date (a test runs it). Imports every backend's
module (not its weights' libraries' models): a documentation tool, not a run's path."""

from __future__ import annotations

import re
import sys

from bestofn.backends.registry import backend_class, registered
from bestofn.schemas.generated_page import page_main

MARKERS = re.compile(r"(<!-- backends:begin -->\n)(.*?)(<!-- backends:end -->)", re.S)


def table() -> str:
    lines = ["| role | name | weights | options |", "|---|---|---|---|"]
    for role, names in registered().items():
        for name in names:
            cls = backend_class(role, name)
            cells = (cls.table_weights, cls.table_options)
            weights, options = (" ".join(c.split()).replace("|", "/") for c in cells)
            lines.append(f"| {role} | `{name}` | {weights} | {options} |")
    return "\n".join(lines) + "\n"


def render(page: str) -> str:
    """``page`` with its backend table rewritten; a page without the markers raises."""
    if not MARKERS.search(page):
        raise ValueError("no <!-- backends:begin --> ... <!-- backends:end --> in the page")
    return MARKERS.sub(lambda m: m.group(1) + table() + m.group(3), page)


def main(argv: list[str] | None = None) -> int:
    return page_main(
        "python -m bestofn.backends.doc",
        __doc__,
        render,
        "the backend table differs from the registry",
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
