"""python -m bestofn.bench {generate,scorers,pipeline,serve,codec,export,database} [options]."""

import importlib
import sys

# One module per benchmark, each with main(argv); imported only when asked for (they pull in
# torch, NeMo or the export libraries).
COMMANDS = {
    "generate": "bestofn.lab.bench.generate",
    "scorers": "bestofn.lab.bench.scorers",
    "pipeline": "bestofn.lab.bench.pipeline",
    "serve": "bestofn.lab.bench.serve",
    "codec": "bestofn.lab.bench.codec",
    "export": "bestofn.lab.bench.export",
    "database": "bestofn.lab.bench.database",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    bench = importlib.import_module(COMMANDS[argv[0]]).main
    return bench(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
