import logging
from pathlib import Path

from bestofn.report.throughput import write_report

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
database = dict(memory_limit=snakemake.params.memory_limit, threads=snakemake.params.threads)
path = write_report(snakemake.input[0], Path(snakemake.output[0]).parent, database)
logging.info("report: %s", path)
