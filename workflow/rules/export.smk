# The selection as training data (config `export:`; bestofn.export). Not part of `all`: run
# `snakemake export`. Snakemake removes the output before the job, so the rule always writes
# the export whole; `bestofn export --overwrite` by hand reuses unchanged shards.


rule export:
    """The selected takes as hf, webdataset, lhotse or nemo training data, with a card."""
    input:
        DATABASE,
    output:
        directory(config["export"]["out"]),
    log:
        f"{RESULTS}/logs/export.log",
    params:
        export=config["export"],
        selection=config["selection"],
        results=RESULTS,
    script:
        "../scripts/export.py"
