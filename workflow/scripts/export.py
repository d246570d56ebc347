import logging

from bestofn.export import ExportSettings, export_results

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
settings = ExportSettings.from_config(
    snakemake.params.export, out=snakemake.output[0], overwrite=True
)
export_results(snakemake.params.results, settings, snakemake.params.selection, log=logging.info)
