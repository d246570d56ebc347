import logging
from pathlib import Path

from bestofn.report import write_report

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
path = write_report(snakemake.input[0], Path(snakemake.output[0]).parent)
logging.info("report: %s", path)
