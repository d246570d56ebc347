import logging
from pathlib import Path

from bestofn.export import ExportSettings, export_results
from bestofn.export.command import emotion_texts

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
settings = ExportSettings.from_config(
    snakemake.params.export, out=snakemake.output[0], overwrite=True
)
# pairs: each emotion's Instruction and direction text, from the emotions sheet
texts = emotion_texts(snakemake.config, Path(".")) if settings.format == "pairs" else None
export_results(
    snakemake.params.results, settings, snakemake.params.selection, log=logging.info, texts=texts
)
