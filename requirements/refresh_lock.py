"""Write requirements/lock.txt: every distribution `make install` may install, pinned, for pip's
``-c`` (a constraints file pins what is installed; it adds nothing). `make lock` runs this.

pip-compile resolves pyproject.toml with every extra; then torch and what only torch needs (its
CUDA libraries) are dropped from the lock, so the Makefile's TORCH still chooses the build (a
CPU wheel here, the site's CUDA build on GPU boxes, each with its own CUDA libraries)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXTRAS = "embedded,production,export,dev,slurm"
OUT = Path(__file__).with_name("lock.txt")
KEEP_OUT = {"torch"}
_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==")


def _blocks(text: str) -> list[tuple[str | None, list[str]]]:
    """(name or None, lines): each pinned requirement with its `# via` comment lines."""
    blocks: list[tuple[str | None, list[str]]] = []
    for line in text.splitlines():
        m = _REQ.match(line)
        if m:
            blocks.append((m.group(1).lower(), [line]))
        elif line.startswith("    #") and blocks and blocks[-1][0]:
            blocks[-1][1].append(line)
        else:
            blocks.append((None, [line]))
    return blocks


def _via(lines: list[str]) -> set[str]:
    names = set()
    for line in lines[1:]:
        text = line.strip().lstrip("#").strip()
        if text == "via":  # "# via" heads a list, one name a line after it
            continue
        if text.startswith("via "):
            text = text[4:]
        if text and not text.startswith("-r") and not text.startswith("bestofn"):
            names.add(text.split()[0].lower())
        elif text.startswith("bestofn"):
            names.add("bestofn")  # declared in pyproject.toml: always kept
    return names


def torch_only(text: str) -> str:
    """``text`` without the requirements that only torch (or others dropped) pull in."""
    blocks = _blocks(text)
    dropped = set(KEEP_OUT)
    changed = True
    while changed:
        changed = False
        for name, lines in blocks:
            if name and name not in dropped and _via(lines) and _via(lines) <= dropped:
                dropped.add(name)
                changed = True
    kept = [line for name, lines in blocks if name not in dropped for line in lines]
    return "\n".join(kept) + "\n"


def main() -> int:
    raw = OUT.with_suffix(".raw.txt")
    if OUT.is_file() and not raw.is_file():
        # pip-compile keeps the pins of its output file where they still fit: a refresh moves
        # only what pyproject.toml's change needs (pass --upgrade to pip-compile to move all)
        raw.write_text(OUT.read_text())
    cmd = [sys.executable, "-m", "piptools", "compile", "--quiet", "--strip-extras",
           "--extra", EXTRAS, "--unsafe-package", "torch",
           "--no-emit-index-url", "--no-emit-find-links",
           "--output-file", str(raw), "pyproject.toml"]  # fmt: skip
    env = {**os.environ, "CUSTOM_COMPILE_COMMAND": "make lock"}  # the header names the refresh
    subprocess.run(cmd, check=True, cwd=OUT.parent.parent, env=env)
    OUT.write_text(torch_only(raw.read_text()))
    raw.unlink()
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
