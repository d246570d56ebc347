from bestofn.select.held_out import scorer_directions


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
        # Held-out scorers and the seed of the random baseline take and listening order.
        held_out=config["selection"]["held_out"],
        seed=config["seed"],
        # Which way is better per score column, as the configured scorers declare it.
        directions=scorer_directions(config["models"]),
        # DuckDB's memory and threads (database: in the config), whatever the run's size.
        memory_limit=config["database"]["memory_limit"],
        threads=config["database"]["threads"],
    script:
        "../scripts/build_database.py"
