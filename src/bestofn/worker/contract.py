"""The worker contract: one spec decides whether a warm worker may serve a group.

A worker is keyed by everything that shapes what it writes: the models section (with the
runtime knobs it was built with), the device (and, on GPUs, which physical GPU the slot maps
to), the FLAC subtype and the results directory. The group job computes the key of the worker
it needs; a worker whose key differs, or that is not healthy, is replaced. Nothing else
decides reuse."""

from __future__ import annotations

from pathlib import Path

from bestofn.pipeline import stable_hash


def worker_spec(
    models: dict,
    device: str,
    flac_subtype: str,
    results_dir: str | Path,
    visible_device: str | None = None,
) -> dict:
    return {
        "models": models,
        "device": device,
        "visible_device": visible_device,
        "flac_subtype": flac_subtype,
        "results_dir": str(Path(results_dir).resolve()),
    }


def worker_key(spec: dict) -> str:
    return stable_hash(spec)


def spec_difference(health: dict, want: dict) -> str:
    """What differs between a running worker (its /health answer) and the wanted spec."""
    have = health.get("spec") or {}
    diffs = []
    if health.get("models_hash") != stable_hash(want["models"]):
        diffs.append("models")
    for field, value in want.items():
        if field != "models" and have.get(field) != value:
            diffs.append(f"{field} {have.get(field)!r} -> {value!r}")
    return ", ".join(diffs) or "worker key differs"
