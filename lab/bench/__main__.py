"""python -m lab.bench {generate,scorers,pipeline,serve,codec,export,database} [options]."""

import importlib
import sys

# One module per benchmark, each with main(argv); imported only when asked for (they pull in
# torch, NeMo or the export libraries).
COMMANDS = {
    "generate": "lab.bench.generate",
    "scorers": "lab.bench.scorers",
    "pipeline": "lab.bench.pipeline",
    "serve": "lab.bench.serve",
    "codec": "lab.bench.codec",
    "export": "lab.bench.export",
    "database": "lab.bench.database",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    bench = importlib.import_module(COMMANDS[argv[0]]).main
    return bench(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
