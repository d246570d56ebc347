"""The command line of a generator that rewrites a generated part of a page in place (the
option tables from the schema, the backend table from the registry), or checks it is current."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def page_main(
    prog: str, description: str, render: Callable[[str], str], what: str, argv=None
) -> int:
    """``prog PAGE [--check]``: PAGE rewritten by ``render``; with --check, exit 1 (saying
    which ``what`` differs and how to rewrite it) when it is out of date."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("page", type=Path, help="the page to rewrite, e.g. config/README.md")
    ap.add_argument("--check", action="store_true", help="exit 1 when the page is out of date")
    args = ap.parse_args(argv)
    old = args.page.read_text()
    new = render(old)
    if args.check:
        if new != old:
            print(f"{args.page}: {what}; run {prog} {args.page}", file=sys.stderr)
            return 1
        return 0
    args.page.write_text(new)
    return 0
