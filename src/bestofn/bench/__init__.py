"""The command ``python -m bestofn.bench <name>``; the benchmarks are in ``bestofn.lab.bench``."""
