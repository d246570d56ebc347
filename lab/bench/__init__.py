"""Benchmarks: python -m lab.bench <name>."""
