"""python -m bestofn.bench {generate,scorers,pipeline,serve,codec,database} [options]."""

import sys


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("generate", "scorers", "pipeline", "serve", "codec", "database"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "generate":
        from bestofn.bench.generate import main as bench
    elif argv[0] == "pipeline":
        from bestofn.bench.pipeline import main as bench
    elif argv[0] == "serve":
        from bestofn.bench.serve import main as bench
    elif argv[0] == "database":
        from bestofn.bench.database import main as bench
    elif argv[0] == "codec":
        from bestofn.bench.codec import main as bench
    else:
        from bestofn.bench.scorers import main as bench
    return bench(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
