rule report:
    """Throughput report with per-stage seconds per clip and the best-of-N gain."""
    input:
        DATABASE,
    output:
        report(
            REPORT,
            caption="../report/throughput.rst",
            category="Throughput",
        ),
        stages=report(
            f"{RESULTS}/report/stage_seconds.png",
            caption="../report/stage_seconds.rst",
            category="Throughput",
        ),
        gain=report(
            f"{RESULTS}/report/bestofn_gain.png",
            caption="../report/gain.rst",
            category="Selection",
        ),
        best_of_k=report(
            f"{RESULTS}/report/best_of_k.png",
            caption="../report/best_of_k.rst",
            category="Selection",
        ),
        gain_by_score=report(
            f"{RESULTS}/report/gain_by_score.png",
            caption="../report/gain_by_score.rst",
            category="Selection",
        ),
        # Selection you can trust (bestofn.report.trust): held-out scorers, per-score gains,
        # correlations, the filter funnel; index.html is the listening page (not embedded:
        # its audio links are relative to results/report/).
        held_out=report(
            f"{RESULTS}/report/held_out.html",
            caption="../report/held_out.rst",
            category="Selection",
        ),
        score_gains=report(
            f"{RESULTS}/report/score_gains.html",
            caption="../report/score_gains.rst",
            category="Selection",
        ),
        correlation=report(
            f"{RESULTS}/report/score_correlation.png",
            caption="../report/score_correlation.rst",
            category="Selection",
        ),
        funnel=report(
            f"{RESULTS}/report/filter_funnel.png",
            caption="../report/filter_funnel.rst",
            category="Selection",
        ),
        # Listener votes (bestofn.report.listeners): "no votes yet" until `bestofn listen import`.
        listener_agreement=report(
            f"{RESULTS}/report/listener_agreement.html",
            caption="../report/listener_agreement.rst",
            category="Listeners",
        ),
        listener_plot=report(
            f"{RESULTS}/report/listener_agreement.png",
            caption="../report/listener_agreement_plot.rst",
            category="Listeners",
        ),
        selection=f"{RESULTS}/report/selection.md",
        listen=f"{RESULTS}/report/index.html",
    log:
        f"{RESULTS}/logs/report.log",
    params:
        # DuckDB's memory and threads (database: in the config), as for the database rule.
        memory_limit=config["database"]["memory_limit"],
        threads=config["database"]["threads"],
    script:
        "../scripts/write_report.py"
