import logging
from pathlib import Path

from bestofn.core.groupio import SCORES
from bestofn.report.votes import reapply
from bestofn.select.database import build_database
from bestofn.workflow_glue import release_workers

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
# Every group is done: the workers exit while the database and the report are built.
logging.info("workers asked to exit: %d", release_workers(snakemake.config))
parquets = [Path(d) / SCORES for d in snakemake.input]
counts = build_database(
    parquets,
    snakemake.output[0],
    snakemake.params.filter,
    snakemake.params.score,
    held_out=snakemake.params.held_out,
    seed=snakemake.params.seed,
    directions=snakemake.params.directions,
    memory_limit=snakemake.params.memory_limit,
    threads=snakemake.params.threads,
    named_rewards=snakemake.params.rewards,
    context=snakemake.params.context,
)
logging.info("database: %s", counts)
# Listener votes live in RESULTS/votes/ (bestofn.report.votes); the rebuilt database gets them back.
logging.info("votes: %s", reapply(snakemake.output[0], Path(snakemake.output[0]).parent))
