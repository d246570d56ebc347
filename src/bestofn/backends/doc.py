"""config/README.md's backend table, written from the registry: one row per registered
backend, its weights and options as the class declares them (``table_weights``,
``table_options``). The table sits between ``<!-- backends:begin -->`` and
``<!-- backends:end -->``; ``python -m bestofn.backends.doc config/README.md`` rewrites it in
place, ``--check`` exits 1 when it is out of date (a test runs it). Imports every backend's
module (not its weights' libraries' models): a documentation tool, not a run's path."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from bestofn.backends.registry import REGISTRY, backend_class

MARKERS = re.compile(r"(<!-- backends:begin -->\n)(.*?)(<!-- backends:end -->)", re.S)


def table() -> str:
    lines = ["| role | name | weights | options |", "|---|---|---|---|"]
    for role, names in REGISTRY.items():
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
    ap = argparse.ArgumentParser(prog="python -m bestofn.backends.doc", description=__doc__)
    ap.add_argument("page", type=Path, help="the page to rewrite, e.g. config/README.md")
    ap.add_argument("--check", action="store_true", help="exit 1 when the page is out of date")
    args = ap.parse_args(argv)
    old = args.page.read_text()
    new = render(old)
    if args.check:
        if new != old:
            print(f"{args.page}: the backend table differs from the registry; run "
                  f"python -m bestofn.backends.doc {args.page}", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    args.page.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
