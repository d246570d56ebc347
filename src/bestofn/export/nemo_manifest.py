"""NeMo: one JSON-lines manifest per split, ``{split}_manifest.json``, a line per take with
``audio_filepath``, ``duration`` and ``text`` (what NeMo's ASR and TTS datasets read) and every
other column of the row as an extra field. Relative audio paths are relative to the manifest's
directory, which is how NeMo resolves them (``manifest.get_full_path``)."""

from __future__ import annotations

import os

import pyarrow as pa

from bestofn.export.formats import Writer, dumps, json_rows, with_exported_files


class NemoWriter(Writer):
    name = "nemo"
    unit = "take"

    def finish(self, tmp, meta: pa.Table, units, settings) -> pa.Table:
        meta = with_exported_files(tmp, meta, units, settings)
        self.splits = []
        files: dict[str, list[str]] = {}
        for row in json_rows(meta):
            line = {
                "audio_filepath": row.pop("audio_filepath"),
                "duration": row["duration_s"],
                "text": row.pop("text"),
                **row,
            }
            files.setdefault(row["split"], []).append(dumps(line))
        for split, lines in files.items():
            path = tmp / f"{split}_manifest.json"
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.splits.append(split)
        self.relative = settings.paths == "relative"
        return meta

    def load_lines(self, out: str, splits: list[str]) -> str:
        prefix = f'"{out}/" + ' if self.relative else ""
        return (
            "import json, soundfile\n"
            f'rows = [json.loads(line) for line in open("{out}/{splits[0]}_manifest.json")]\n'
            f'audio, rate = soundfile.read({prefix}rows[0]["audio_filepath"])  # or give '
            "the manifest to NeMo as manifest_filepath"
        )
