import logging
from pathlib import Path

from bestofn.groupio import SCORES
from bestofn.selection import build_database

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
parquets = [Path(d) / SCORES for d in snakemake.input]
counts = build_database(
    parquets,
    snakemake.output[0],
    snakemake.params.filter,
    snakemake.params.score,
    held_out=snakemake.params.held_out,
    seed=snakemake.params.seed,
    directions=snakemake.params.directions,
)
logging.info("database: %s", counts)
