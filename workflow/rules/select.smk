from bestofn.select.held_out import scorer_directions
from bestofn.select.rewards import context_of


rule database:
    """Every take, per-group summaries, the best take per group (and each named reward's top k),
    throughput, in DuckDB."""
    input:
        group_dirs,
    output:
        DATABASE,
    log:
        f"{RESULTS}/logs/database.log",
    params:
        filter=config["selection"]["filter"],
        score=config["selection"]["score"],
        # Named rewards beside the default (filter/score): bestofn.select.rewards.
        rewards=config["selection"]["rewards"],
        # The emotions sheet's class column and Empathic-Insight heads (class, ei_spec).
        context=context_of(config["emotions"], config["models"]),
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
