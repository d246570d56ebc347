"""The commands a run starts by itself: `bestofn run-group` (one group in this process),
`worker` (one slot's server) and `workers` (status or stop of this directory's workers)."""

from __future__ import annotations


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

    from bestofn.worker.client.group_job import list_workers, stop_all
    from bestofn.worker.client.runtime import default_state_dir

    state = Path(args.state_dir) if args.state_dir else default_state_dir()
    if args.action == "status":
        workers = list_workers(state)
        for w in workers:
            print(json.dumps(w, sort_keys=True))
        print(f"{len(workers)} worker socket(s) in {state}")
    else:
        print(f"stopped {stop_all(state)} worker(s) in {state}")
    return 0


def add_parser(sub) -> None:
    from bestofn.schemas import schema

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
