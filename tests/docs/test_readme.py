"""Every code block of the README runs here, as written, so a snippet cannot rot.

A shell or Python block runs in a copy of conftest's tiny project after a full
`snakemake --profile profiles/local` run (the demo's results, smaller), with the workflow
(Snakefile, workflow/, profiles/) and the venv linked in. A block that needs what a CPU test
cannot have (a GPU box, SLURM, real weights, a server, the network) carries the comment
``<!-- not run: why -->`` on the line before its fence; its commands are then parsed instead:
``bestofn`` lines by the CLI's own parser, ``snakemake`` lines by Snakemake's with the
profile present, ``make`` lines by ``make -n``, Python by ``compile``. A ``text`` block is a
picture (a tree), not code. The export section's blocks run in tests/export/test_export.py."""

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from readme_snippets import code_blocks

from bestofn.cli import main as bestofn_main

README = REPO / "README.md"
BIN = Path(sys.executable).parent
NOT_RUN = re.compile(r"^<!-- not run: (.+) -->$")


def blocks():
    """(block, why it is not run, or None) for every block outside the export section."""
    lines = README.read_text().splitlines()
    export = {b.line for b in code_blocks(README, "Export")}
    out = []
    for b in code_blocks(README):
        if b.line in export:
            continue
        m = NOT_RUN.match(lines[b.line - 2]) if b.line >= 2 else None
        out.append((b, m.group(1) if m else None))
    return out


BLOCKS = blocks()
RUN = [b for b, why in BLOCKS if why is None and b.lang != "text"]
PARSED = [b for b, why in BLOCKS if why is not None]


def commands(code: str) -> list[list[str]]:
    """The command lines of a shell block: continuations joined, comments dropped, each line
    split at ``&&``."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            cmd: list[str] = []
            for w in [*words, "&&"]:
                if w == "&&":
                    out.append(cmd)
                    cmd = []
                else:
                    cmd.append(w)
    return out


def test_every_block_is_run_or_says_why_not():
    langs = {b.lang for b, _ in BLOCKS}
    assert langs <= {"sh", "python", "text"}, langs
    assert len(RUN) >= 2 and PARSED, (RUN, PARSED)
    text = README.read_text()
    assert text.count("<!-- not run:") == len(PARSED)  # every marker sits right above a block
    assert len(text.splitlines()) <= 300


@pytest.fixture(scope="module")
def workdir(tiny_run, tmp_path_factory):
    """The tiny run's directory, copied, with the workflow and the venv linked in."""
    import shutil

    root = Path(shutil.copytree(tiny_run, tmp_path_factory.mktemp("readme") / "w", symlinks=True))
    for name in ("Snakefile", "workflow", "profiles"):
        (root / name).symlink_to(REPO / name)
    (root / ".venv").symlink_to(BIN.parent)
    return root


@pytest.mark.parametrize("block", RUN, ids=lambda b: f"line{b.line}")
def test_block_runs_as_written(block, workdir):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    cmd = ["bash", "-euo", "pipefail", "-c", block.code]
    if block.lang == "python":
        cmd = [sys.executable, "-c", block.code]
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"line {block.line}:\n{block.code}\n{proc.stderr[-3000:]}"


class Parsed(Exception):
    pass


def parse_bestofn(argv: list[str], monkeypatch) -> argparse.Namespace:
    """``argv`` through the ``bestofn`` command's parser, stopping before it runs anything."""
    real = argparse.ArgumentParser.parse_args

    def stop(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", stop)
        with pytest.raises(Parsed) as got:
            bestofn_main(argv)
    return got.value.args[0]


def parse_snakemake(argv: list[str]) -> None:
    from snakemake.cli import get_argument_parser

    get_argument_parser().parse_args(argv)  # an unknown option exits
    if "--profile" in argv:
        profile = argv[argv.index("--profile") + 1]
        assert (REPO / profile / "config.yaml").is_file(), profile


@pytest.mark.parametrize("block", PARSED, ids=lambda b: f"line{b.line}")
def test_block_not_run_parses(block, monkeypatch):
    if block.lang == "python":
        compile(block.code, f"README.md line {block.line}", "exec")
        return
    cmds = commands(block.code)
    assert cmds, block
    for argv in cmds:
        tool, args = argv[0], argv[1:]
        if tool == "bestofn":
            assert parse_bestofn(args, monkeypatch).cmd == args[0]
        elif tool == "snakemake":
            parse_snakemake(args)
        elif tool == "make":
            proc = subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr
        elif tool == "curl":
            assert args and any(a.startswith("http://127.0.0.1") for a in args), argv
        else:
            raise AssertionError(f"README.md line {block.line}: no parser for {tool!r}")
