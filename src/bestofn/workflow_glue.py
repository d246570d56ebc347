"""What the Snakemake rules and scripts call: kept here so the scripts stay a few lines."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from pathlib import Path
from typing import NoReturn

from bestofn.backends.registry import backend_class
from bestofn.select.base import BASE_COLUMNS
from bestofn.select.database import check_rewards
from bestofn.util.user_input import EXIT_STATUS

log = logging.getLogger("bestofn")


def selection_columns(models: dict) -> tuple[dict[str, str], bool]:
    """All takes columns known before loading weights, and whether that list is complete."""
    columns = dict(BASE_COLUMNS)
    complete = True
    for entry in models.get("scorers", []):
        cls = backend_class("scorer", entry["backend"])
        columns.update(cls.columns)
        found = cls.planned_columns(entry.get("options") or {})
        columns.update(found or {})
        complete &= found is not None
    return columns, complete


def refuse(problem: str) -> NoReturn:
    """End a ``snakemake`` command on bad input as ``bestofn`` ends: ``error: <file>: <what>``
    on stderr and exit status 2, no traceback, before any job. A SystemExit, because Snakemake
    catches Exception (and prints it with a frame of the Snakefile, exit 1), not SystemExit."""
    print(f"error: {problem}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_STATUS)


def config_file_problem(path: str | Path, given: list | None = None) -> str | None:
    """What is wrong with a config file, as ``<file>: <what>`` (the line of a YAML error), or
    None. For the workflow's default file (the Snakefile's ``configfile:``), whose Snakemake
    reading names no file when it does not parse; and for a ``--configfile`` file, which
    Snakemake reads in its command line (``snakemake_logger_plugin_bestofn`` asks here).
    ``given``: for the default file, the ``--configfile`` paths (a list; with one, the default
    file may be absent); None for a ``--configfile`` file itself."""
    from bestofn.util.user_input import UserInputError, load_yaml_file

    if given and not Path(path).exists():
        return None
    try:
        load_yaml_file(path, "config")
    except UserInputError as e:
        if e.what == "no such config" and given is not None:
            return f"{e} (run in the workflow directory, or give --configfile)"
        return str(e)
    return None


def check_selection_for(config: dict, base: str | Path = ".") -> None:
    from bestofn.select.held_out import check_held_out, scorer_directions
    from bestofn.select.rewards import context_of

    columns, complete = selection_columns(config["models"])
    sel = config["selection"]
    context = context_of(Path(base) / config["emotions"], config["models"])
    # default and named rewards; held-out scorers are never selected on by any of them, and
    # their names must be takes columns
    for reward in check_rewards(sel, columns, strict=complete, context=context):
        check_held_out(
            reward.filter, reward.score, sel.get("held_out"), columns if complete else None,
            directions=scorer_directions(config["models"]),
        )  # fmt: skip


def run_group_job(
    params: str,
    models: str,
    out: str | Path,
    device: str = "cpu",
    flac_subtype: str = "PCM_16",
    runtime: dict | None = None,
    results_dir: str = "results",
    config: dict | None = None,
) -> dict:
    """Run one group: through the slot's warm worker (default), or in this process when
    ``runtime.worker`` is false (models then load for every group). Inside a SLURM job (given
    the workflow ``config``) the group comes from the job's bundle feeder (worker.bundle)."""
    if (runtime or {}).get("worker", True):
        from bestofn.worker.client.group_job import run_group_via_worker
        from bestofn.worker.client.slurm_feeder import run_group_in_bundle, slurm_job_id

        if slurm_job_id() and config is not None:
            answer = run_group_in_bundle(
                params, models, str(out), device, runtime, results_dir, flac_subtype, config
            )
        else:
            answer = run_group_via_worker(
                params, models, str(out), device, runtime, results_dir, flac_subtype
            )
        log.info("group %s on slot %s: %s", answer["group_id"], answer["slot"], json.dumps(answer))
        return answer["timings"]
    from bestofn.core.pipeline import load_backends
    from bestofn.core.plan import spec_from_params
    from bestofn.core.runner import run_group

    spec = spec_from_params(params)
    backends = load_backends(json.loads(models), device=device)
    log.info("loaded models in %.1f s", backends.load_s)
    timings = run_group(
        spec, backends, Path(out), device=device, flac_subtype=flac_subtype,
        write_threads=(runtime or {}).get("write_threads"),
    )  # fmt: skip
    log.info(
        "group %s: %s", spec.group_id, json.dumps({k: round(v, 3) for k, v in timings.items()})
    )
    return timings


def release_workers(config: dict) -> int:
    """Ask this workflow directory's warm workers to exit, without waiting: the database rule
    calls it, once every group of the run is done, so that the workers' exit (their device and
    interpreter teardown) overlaps the final rules instead of following them. The workflow's
    onsuccess still waits for them (``stop_all``). Inside a SLURM job: that job's own workers,
    none. Returns the number asked."""
    from bestofn.worker.client.group_job import stop_all
    from bestofn.worker.client.runtime import Runtime, default_state_dir

    rt = Runtime.from_config(config.get("runtime"))
    return stop_all(rt.state_dir or default_state_dir(), wait=False)


def group_log_path(results_dir: str | Path, emotion: str, prompt_id: str) -> Path:
    """Where a group job logs (the rule has no Snakemake ``log:``; see run_group_rule)."""
    return Path(results_dir) / "logs" / "groups" / emotion / f"{prompt_id}.log"


@contextlib.contextmanager
def thread_log(path: Path):
    """Send this thread's ``bestofn`` log records to ``path`` (truncated first).

    Group jobs run in threads of the Snakemake process (profiles set force-use-threads), so a
    job's log handler only takes the records its own thread emits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    thread = threading.get_ident()
    handler.addFilter(lambda record: record.thread == thread)
    if log.level == logging.NOTSET or log.level > logging.INFO:
        log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)
        handler.close()


def run_group_rule(
    params, out: str, emotion: str, prompt_id: str, config: dict, spec: str | None = None
) -> dict:
    """The ``group`` rule's ``run:`` block. A ``run:`` block, not a ``script:``, and no ``log:``
    or input function: Snakemake's per-job work for those dominated planning at 100k groups
    (ledger figure planning.dry_run_100k). The group's log goes to
    logs/groups/{emotion}/{prompt_id}.log.
    ``spec``: the group as the worker runs it (the reference voice's path included; the
    params hold only its digest); None: ``params.spec``."""
    path = group_log_path(config["results"], emotion, prompt_id)
    with thread_log(path):
        try:
            return run_group_job(
                spec if spec is not None else params.spec,
                # The full models section, runtime knobs included; params.models (identity
                # only) is what decides whether a finished group must rerun.
                json.dumps(config["models"]),
                out,
                device=params.device,
                flac_subtype=params.flac_subtype,
                # Read from config, not params: speed knobs must never rerun finished groups.
                runtime=config.get("runtime"),
                results_dir=config["results"],
                # Inside a SLURM job the bundle's feeder plans the job's other groups from it.
                config=config,
            )
        except Exception as e:
            log.exception("group %s/%s failed", emotion, prompt_id)
            raise RuntimeError(f"group {emotion}/{prompt_id} failed ({e}); log: {path}") from e
