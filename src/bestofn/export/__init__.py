"""The selection as training data: `bestofn export` and the Snakemake target `export`.

``export_results`` reads the DuckDB tables (``takes``, ``selection``, ``groups``) through SQL,
picks the takes (the selected one per group, every passing one with its rank, or all), splits
them by a seeded hash of the prompt (or group) id, and hands them, in shards, to one writer per
format: ``hf`` (parquet shards with an ``Audio`` column), ``webdataset`` (tar shards),
``lhotse`` (recordings, supervisions, cuts) and ``nemo`` (JSON-lines manifests). The export is
written into a hidden sibling and renamed into place; a re-export links the shards whose rows
and audio did not change from the previous one (``bestofn_export.json`` holds their
fingerprints) and writes only the others."""

from __future__ import annotations

__all__ = ["ExportError", "ExportSettings", "export_results"]


def __getattr__(name: str):
    # on first use: importing a submodule (the CLI's export.command, the worker's export.rows)
    # runs this file, and export.core's pandas and pyarrow cost every `bestofn` command's start
    if name in __all__:
        from bestofn.export import core

        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
