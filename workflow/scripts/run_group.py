import json
import logging

from bestofn.workflow_glue import run_group_job

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
run_group_job(
    snakemake.params.spec,
    # The full models section, runtime knobs included; params.models (identity only) is
    # what decides whether a finished group must rerun.
    json.dumps(snakemake.config["models"]),
    snakemake.output[0],
    device=snakemake.params.device,
    flac_subtype=snakemake.params.flac_subtype,
    # Read from config, not params: speed knobs must never rerun finished groups.
    runtime=snakemake.config.get("runtime"),
    results_dir=snakemake.config["results"],
    # Inside a SLURM job the bundle's feeder plans the job's other groups from it.
    config=snakemake.config,
)
