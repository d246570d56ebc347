rule database:
    """Every take, per-group summaries, the best take per group and throughput, in DuckDB."""
    input:
        group_dirs,
    output:
        DATABASE,
    log:
        f"{RESULTS}/logs/database.log",
    params:
        filter=config["selection"]["filter"],
        score=config["selection"]["score"],
    script:
        "../scripts/build_database.py"
