"""The `bestofn` command: a router. Each package registers its subcommands with an
``add_parser(sub)`` hook (listed in COMMANDS, in the order --help shows them)."""

from __future__ import annotations

import importlib
import sys

from bestofn.util.parser import Parser

COMMANDS = (
    "bestofn.ops.commands",
    "bestofn.ops.weights_command",
    "bestofn.prompts.command",
    "bestofn.ops.run_commands",
    "bestofn.serve.command",
    "bestofn.fakes.command",
    "bestofn.report.command",
    "bestofn.ops.select_command",
    "bestofn.export.command",
    "bestofn.ops.reward_fit",
)


def build_parser() -> Parser:
    """Every subcommand and its options (the test that walks them all reads them here)."""
    from bestofn import __version__

    ap = Parser(prog="bestofn", description="The `bestofn` command.")
    ap.add_argument("--version", action="version", version=f"bestofn {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for module in COMMANDS:
        importlib.import_module(module).add_parser(sub)
    sub.add_parser("parity", help="moss-fast vs reference code parity check (see --help)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. A file the user gave that is missing, malformed or of the wrong shape
    (bestofn.util.user_input.UserInputError, raised by any subcommand) ends as
    ``error: <file>: <what>`` and exit status 2, never a traceback; so does an OSError that
    names its file."""
    from bestofn.util.user_input import EXIT_STATUS, UserInputError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["parity"]:  # its own parser (bestofn.parity.local)
            from bestofn.parity.local import parity_main

            return parity_main(argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except UserInputError as e:
        print(f"error: {e}", file=sys.stderr)
    except OSError as e:
        if e.filename is None:
            raise
        print(f"error: {e.filename}: {e.strerror or e}", file=sys.stderr)
    return EXIT_STATUS


if __name__ == "__main__":
    sys.exit(main())
