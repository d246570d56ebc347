"""What the Snakemake rules and scripts call: kept here so the scripts stay a few lines."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from bestofn.backends.registry import backend_class
from bestofn.selection import BASE_COLUMNS, check_selection

log = logging.getLogger("bestofn")


def selection_columns(models: dict) -> tuple[dict[str, str], bool]:
    """All takes columns known before loading weights, and whether that list is complete."""
    columns = dict(BASE_COLUMNS)
    complete = True
    for entry in models.get("scorers", []):
        cls = backend_class("scorer", entry["backend"])
        columns.update(cls.columns)
        complete &= not cls.dynamic_columns
    return columns, complete


def check_selection_for(config: dict) -> None:
    from bestofn.trust import check_held_out

    columns, complete = selection_columns(config["models"])
    sel = config["selection"]
    check_selection(sel["filter"], sel["score"], columns, strict=complete)
    # Held-out scorers are never selected on; their names must be takes columns.
    check_held_out(sel["filter"], sel["score"], sel.get("held_out"), columns if complete else None)


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
        from bestofn.worker.bundle import run_group_in_bundle, slurm_job_id
        from bestofn.worker.client import run_group_via_worker

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
    from bestofn.pipeline import load_backends, run_group
    from bestofn.plan import spec_from_params

    spec = spec_from_params(params)
    backends = load_backends(json.loads(models), device=device)
    log.info("loaded models in %.1f s", backends.load_s)
    timings = run_group(spec, backends, Path(out), device=device, flac_subtype=flac_subtype)
    log.info(
        "group %s: %s", spec.group_id, json.dumps({k: round(v, 3) for k, v in timings.items()})
    )
    return timings
