"""`bestofn listen import`: listener votes from the listening page into the database."""

from __future__ import annotations


def _listen_import(args) -> int:
    from bestofn.report.listeners import import_main

    return import_main(args.files, args.results, args.database)


def add_parser(sub) -> None:
    p = sub.add_parser("listen", help="listener votes from the listening page (index.html)")
    listen = p.add_subparsers(dest="listen_cmd", required=True)
    p = listen.add_parser(
        "import",
        help="check exported votes files against the database and add them (twice adds nothing)",
        description="Each file is checked whole against the results: its results directory, "
        "the page's seed and build, every vote's group and takes. A bad file is refused with "
        "the file and vote named and adds nothing; the others still import. Accepted files are "
        "kept in RESULTS/votes/ and the listener_* tables are recomputed (the database rule "
        "re-applies them after a rebuild). Exit 2 when every file was refused (then nothing on "
        "disk changes), 1 when some were.",
    )
    p.add_argument("files", nargs="+", metavar="VOTES.json")
    p.add_argument("--results", default="results", help="results directory (default: results)")
    p.add_argument("--database", help="default: RESULTS/bestofn.duckdb")
    p.set_defaults(func=_listen_import)
