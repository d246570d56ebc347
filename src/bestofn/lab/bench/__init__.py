"""Benchmarks: python -m bestofn.bench <name>."""
