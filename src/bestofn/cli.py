"""The `bestofn` command."""

from __future__ import annotations

import argparse
import os
import sys


def _verify(args) -> int:
    from bestofn.ops.verify import quarantine_group, verify_groups
    from bestofn.util.user_input import UserInputError

    if not os.path.isdir(args.results):
        raise UserInputError(args.results, "no such results directory")
    per_group, warnings = verify_groups(args.results)
    problems = [p for group_problems in per_group.values() for p in group_problems]
    for w in warnings:
        print(f"warning: {w}")
    for p in problems:
        print(f"error: {p}")
    print(f"verify: {len(per_group)} groups checked, {len(problems)} problem(s)")
    if args.quarantine:
        broken = {g: ps for g, ps in per_group.items() if ps}
        for group_dir, group_problems in broken.items():
            dest = quarantine_group(args.results, group_dir, group_problems)
            print(f"quarantined: {group_dir} -> {dest} (reasons in {dest}/REASON.txt)")
        if broken:
            print(
                f"verify: moved {len(broken)} broken group(s) out of {args.results}/groups; "
                "the next snakemake run regenerates exactly those"
            )
    return 1 if problems or not per_group else 0


def _load_plan(args, *more_errors):
    """The plan of ``args.config`` (groups, checked config), or None after printing the error:
    every command that reads a config fails the same way, exit status 2. A missing or malformed
    config file raises UserInputError (main prints it)."""
    from bestofn.core.plan import PlanError, build_plan, load_config

    config = load_config(args.config)
    try:
        return build_plan(config, args.base)
    except (PlanError, *more_errors) as e:
        # the config's own fields are named by the file; a sheet's or weight's problem names
        # its own file already
        where = f"{args.config}: " if str(e).startswith("config ") else ""
        print(f"error: {where}{e}", file=sys.stderr)
        return None


def _results(args, plan) -> str:
    return getattr(args, "results", None) or os.path.join(args.base, plan.config["results"])


def _check(args) -> int:
    from bestofn.select.selection import SelectionError
    from bestofn.weights.lock import lock_state
    from bestofn.workflow_glue import check_selection_for

    plan = _load_plan(args)
    try:
        if plan is not None:
            check_selection_for(plan.config, args.base)
    except SelectionError as e:
        print(f"error: {e}", file=sys.stderr)
        plan = None
    if plan is None:
        return 2
    for warning in plan.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"weights: {lock_state(plan.config, args.base)}")  # verified by build_plan when one
    print(f"ok: {len(plan.groups)} groups x {plan.config['takes']} takes")
    return 0


def _plan(args) -> int:
    from bestofn.ops.cost import format_report, remaining

    if (plan := _load_plan(args)) is None:
        return 2
    print(format_report(remaining(plan, _results(args, plan)), per_emotion_limit=args.limit))
    return 0


def _doctor(args) -> int:
    from bestofn.ops.doctor import report

    if (plan := _load_plan(args)) is None:
        return 2
    return report(plan, args.base, pilot=not args.no_pilot)


def _status(args) -> int:
    from bestofn.ops.status import watch

    if (plan := _load_plan(args)) is None:
        return 2
    return watch(plan, _results(args, plan), every_s=args.watch)


def _run_group(args) -> int:
    from bestofn.workflow_glue import run_group_job

    run_group_job(args.params, args.models, args.out, device=args.device, runtime={"worker": False})
    return 0


def _worker(args) -> int:
    import json
    import logging
    import time

    from bestofn.worker import startup
    from bestofn.worker.options import WorkerOptions

    timeline = {"process_start_unix": startup.process_start_unix(), "main_unix": time.time()}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    options = WorkerOptions.from_json(args.options)
    startup.use_cache_dir(options.cache_dir)  # before anything compiles
    from bestofn.worker.server import Worker, serve

    timeline["imports_unix"] = time.time()
    with open(args.models_file) as f:
        models = json.load(f)
    warm_up_spec = None
    if args.warm_up_spec:
        with open(args.warm_up_spec) as f:
            warm_up_spec = json.load(f)
    worker = Worker(
        models, args.results, args.device, options, slot=args.slot,
        flac_subtype=args.flac_subtype, worker_key=args.worker_key,
        warm_up_spec=warm_up_spec, timeline=timeline,
    )  # fmt: skip
    serve(args.socket, worker)
    return 0


def _workers(args) -> int:
    import json
    from pathlib import Path

    from bestofn.worker.client.group_job import default_state_dir, list_workers, stop_all

    state = Path(args.state_dir) if args.state_dir else default_state_dir()
    if args.action == "status":
        workers = list_workers(state)
        for w in workers:
            print(json.dumps(w, sort_keys=True))
        print(f"{len(workers)} worker socket(s) in {state}")
    else:
        print(f"stopped {stop_all(state)} worker(s) in {state}")
    return 0


def _serve(args) -> int:
    from bestofn.serve.http import main as serve_main

    return serve_main(args)


def _fake_weights(args) -> int:
    from bestofn.fakes.weights import main as fake_weights_main

    return fake_weights_main(args)


def _ab(args) -> int:
    from bestofn.ops.ab import ab_main

    return ab_main(args)


def _listen_import(args) -> int:
    from bestofn.report.listeners import import_main

    return import_main(args.files, args.results, args.database)


def _export(args) -> int:
    from bestofn.export.command import main as export_main

    return export_main(args)


def _parity(args_rest: list[str]) -> int:
    from bestofn.parity.local import parity_main

    return parity_main(args_rest)


def _has_default(value) -> bool:
    # identity, not equality: a default of 0 is a value to show, False and None are not
    return not (value is None or value is False or value == argparse.SUPPRESS)


class _DefaultsShown(argparse.HelpFormatter):
    """Every option's help ends with its default, when it has one that the help does not state
    already (a default of None or False is no value: the help says what happens then)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (
            _has_default(default)
            and (action.option_strings or action.nargs in ("?", "*"))
            and "default" not in text.lower()
            and not isinstance(action, argparse._VersionAction | argparse._HelpAction)
        ):
            text = f"{text.strip()} (default: %(default)s)".lstrip()
        return text


class Parser(argparse.ArgumentParser):
    """``bestofn``'s parser: its subparsers (and theirs) are of this class too
    (``add_subparsers`` builds them with the parent's class), so each shows its defaults."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _DefaultsShown)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        # argparse prints no help line for an option without help text: one that has a default
        # gets the default as its help
        if kwargs.get("help") is None and _has_default(kwargs.get("default")):
            kwargs["help"] = "(default: %(default)s)"
        return super().add_argument(*args, **kwargs)


def build_parser() -> Parser:
    """Every subcommand and its options (the test that walks them all reads them here)."""
    from bestofn import __version__
    from bestofn.schemas import schema

    ap = Parser(prog="bestofn", description=__doc__)
    ap.add_argument("--version", action="version", version=f"bestofn {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("verify", help="check every parquet row against its FLAC and back")
    p.add_argument("results", nargs="?", default="results")
    p.add_argument(
        "--quarantine",
        action="store_true",
        help="move each broken group to RESULTS/quarantine/<emotion>/<prompt_id>[-N]/ with a "
        "REASON.txt, so the next run regenerates exactly those groups (not while a run writes)",
    )
    p.set_defaults(func=_verify)

    p = sub.add_parser("check", help="validate config, sheets and selection SQL (no models load)")
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument("--base", default=".", help="directory that sheet paths are relative to")
    p.set_defaults(func=_check)

    from bestofn.weights.command import add_parser as add_weights_parser

    add_weights_parser(sub)
    from bestofn.prompts.command import add_parser as add_prompts_parser

    add_prompts_parser(sub)

    p = sub.add_parser(
        "plan", help="groups remaining per emotion and the GPU-hours left at the measured rate"
    )
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument("--base", default=".", help="directory that sheet paths are relative to")
    p.add_argument("--results", help="results directory (default: the config's, under --base)")
    p.add_argument("--limit", type=int, default=50, help="emotions listed one by one")
    p.set_defaults(func=_plan)

    p = sub.add_parser(
        "doctor",
        help="before a long run: CUDA build vs driver, GPU memory, disk, weights lock, then "
        "one real group per slot, timed (for bestofn plan)",
    )
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument("--base", default=".", help="the workflow directory (sheets, results)")
    p.add_argument("--no-pilot", action="store_true", help="the checks only, no group")
    p.set_defaults(func=_doctor)

    p = sub.add_parser(
        "status", help="a run's progress: groups done and left, takes/s, ETA, failures"
    )
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument("--base", default=".", help="the workflow directory (sheets, results)")
    p.add_argument("--results", help="results directory (default: the config's, under --base)")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="again every SECONDS")
    p.set_defaults(func=_status)

    p = sub.add_parser("run-group", help="run one group in this process (what a group job does)")
    p.add_argument("--params", required=True, help="group spec JSON")
    p.add_argument("--models", required=True, help="models section JSON")
    p.add_argument("--out", required=True, help="group directory to publish")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=_run_group)

    p = sub.add_parser("worker", help="serve one slot (started by group jobs, not by hand)")
    p.add_argument("--socket", required=True)
    p.add_argument("--slot", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--models-file", required=True)
    p.add_argument("--worker-key", help="the key of the worker spec (client.worker_spec)")
    p.add_argument("--results", required=True, help="requests may only write below this")
    p.add_argument(
        "--flac-subtype", default=schema("config")["properties"]["flac_subtype"]["default"]
    )
    p.add_argument("--options", default="{}",
                   help="the worker's runtime options as JSON (bestofn.worker.options; absent "
                   "fields: the config schema's defaults)")  # fmt: skip
    p.add_argument("--warm-up-spec", help="a group spec (JSON file) to warm up on before ready")
    p.set_defaults(func=_worker)

    p = sub.add_parser("workers", help="status or stop of this workflow directory's workers")
    p.add_argument("action", choices=["status", "stop"])
    p.add_argument("--state-dir", help="default: derived from the current directory")
    p.set_defaults(func=_workers)

    p = sub.add_parser(
        "serve",
        help="OpenAI-compatible speech endpoint (POST /v1/audio/speech) on the warm worker",
        description="POST /v1/audio/speech (OpenAI's request shape), GET /v1/models, "
        "/v1/audio/voices and /health. Loads no model until the first request, which starts "
        "the workflow's warm worker; it exits after the idle timeout. Loopback only unless an "
        "API key is set.",
    )
    p.add_argument("--host", default="127.0.0.1", help="any non-loopback address needs a key")
    p.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument("--base", default=".", help="directory that config paths are relative to")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (or BESTOFN_API_KEY)")
    p.add_argument("--slot", type=int, default=0, help="the worker slot (GPU) to serve from")
    p.add_argument(
        "--idle-timeout", type=float, help="seconds before an idle worker exits "
        "(default: the config's runtime.idle_timeout_s)",
    )  # fmt: skip
    p.add_argument("--max-batch", type=int, help="largest speech batch of a worker it starts "
                   "(default: the config's runtime.speech_max_batch)")  # fmt: skip
    p.add_argument("--batch-window-ms", type=float, help="batching window of a worker it "
                   "starts (default: the config's runtime.speech_batch_window_ms)")  # fmt: skip
    p.add_argument("--max-concurrency", type=int, default=256,
                   help="speech requests in flight; more get 429 with Retry-After")  # fmt: skip
    p.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--ssl-keyfile", help="the certificate's private key (PEM)")
    p.add_argument("--keep-alive", type=float, default=5.0,
                   help="seconds an idle connection stays open between requests")  # fmt: skip
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds for a request's line and headers to arrive")  # fmt: skip
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds for a request's body to arrive")  # fmt: skip
    p.add_argument("--write-timeout", type=float, default=60.0,
                   help="seconds a client may leave the answer unread (then cut)")  # fmt: skip
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="on SIGTERM: seconds for requests in flight to end (new: 503)")  # fmt: skip
    p.set_defaults(func=_serve)

    p = sub.add_parser(
        "fake-weights",
        help="write random-weight checkpoints of every production backend + DIR/config.yaml",
        description="Random-weight checkpoints for every production backend, in the published "
        "on-disk layouts, and DIR/config.yaml: a complete production config pointing at them. "
        "tiny: a CPU test run; real: the published sizes, for GPUs (about 40 GB, 58 with the "
        "Delay model).",
    )
    p.add_argument("dir", help="output directory (created)")
    p.add_argument("--size", choices=["tiny", "real"], default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--p-stop",
        type=float,
        help="MOSS stop probability per frame (default: 0.05 tiny, 0.01 real); a benchmark that "
        "wants every take to run to its frame budget, as `bench pipeline` does, passes 1e-9",
    )
    p.add_argument(
        "--moss-code",
        action="append",
        help="copy of OpenMOSS/MOSS-TTS moss_tts_local_v1.5/ or moss_tts_delay/ (give both: "
        "repeat the option): its remote code is copied into that MOSS checkpoint so moss-hf "
        "loads it too (moss-fast needs none)",
    )
    p.add_argument(
        "--no-delay",
        action="store_true",
        help="skip MOSS-TTS-Delay-v1.5/ (the 8B Delay model: about 17 GB at real size)",
    )
    p.add_argument(
        "--parakeet",
        choices=["plain", "calibrated"],
        default="plain",
        help="which Parakeet DIR/config.yaml points at: the plain random one, or the "
        "CALIBRATION beside it whose joint emits speech's token rate (for speed figures)",
    )
    p.add_argument(
        "--jobs",
        default="auto",
        help="backends written at once, each in its own process; the bytes are the same as "
        "one at a time (default auto: 1 for tiny, else up to one per backend on half the cores)",
    )
    p.set_defaults(func=_fake_weights)

    p = sub.add_parser(
        "ab",
        help="same groups and seeds under configs A and B: speed, memory, quality deltas, "
        "PASS/FAIL against a thresholds file",
        description="Runs the first --groups groups of A's plan (B must plan them the same) "
        "under A, then under B, each side in a spawned process of its own, and prints a "
        "PASS/FAIL table: generate/restore/score/wall s per clip, peak memory, and the mean "
        "quality delta (B - A) over matched takes for every column of the thresholds file. "
        "Exit 0 PASS, 1 FAIL, 2 bad input, 3 a side failed as it ran.",
    )
    p.add_argument("--a", required=True, help="config of side A (the baseline)")
    p.add_argument("--b", required=True, help="config of side B (the dial)")
    p.add_argument(
        "--thresholds", required=True, help="YAML file: column: {max_increase|max_decrease: x}"
    )
    p.add_argument("--groups", type=int, default=1, help="first N groups of the plan (default 1)")
    p.add_argument("--takes", type=int, help="takes per group for both sides (default: A's config)")
    p.add_argument("--out", help="write the table as parquet here")
    p.add_argument("--base", default=".", help="directory that config paths are relative to")
    p.add_argument("--device", help="run both sides here (default: the configs' device)")
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed runs of the first group per side before timing (compile, CUDA graphs)",
    )
    p.set_defaults(func=_ab)

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

    from bestofn.ops.select_command import add_parser as add_select_parser

    add_select_parser(sub)
    p = sub.add_parser(
        "export",
        help="the selection as training data: hf, webdataset, lhotse or nemo",
        description="Writes the selected (or passing, or all) takes of RESULTS as a Hugging "
        "Face dataset, WebDataset shards, or Lhotse or NeMo manifests, with a dataset card. "
        "Every option defaults to the config's export: section. Exit 2 on bad input (nothing "
        "written).",
    )
    from bestofn.export.command import add_arguments as export_arguments

    export_arguments(p)
    p.set_defaults(func=_export)

    from bestofn.ops.reward_fit import add_parser as add_reward_parser

    add_reward_parser(sub)

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
        if argv[:1] == ["parity"]:
            return _parity(argv[1:])
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
