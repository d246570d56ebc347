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
    log:
        f"{RESULTS}/logs/report.log",
    script:
        "../scripts/write_report.py"
