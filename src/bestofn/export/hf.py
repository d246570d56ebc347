"""Hugging Face ``datasets``: parquet shards ``data/{split}-NNNNN.parquet`` with an ``Audio``
column (the FLAC bytes as they are, or re-encoded at the export rate) and every other column
typed as DuckDB typed it; the features ride in the parquet schema's ``huggingface`` metadata,
as ``datasets`` writes them, and the card's ``configs`` names the splits, so
``datasets.load_dataset(DIR)`` opens it. ``cast_column('audio', Audio(decode=False))`` gives
the FLAC bytes (soundfile reads them); ``datasets`` 5 decodes audio itself only with torchcodec
and FFmpeg's libraries, which bestofn does not install.

The config's description carries a digest of the export's content, which makes
``load_dataset(DIR)`` read this export rather than an earlier one from its cache. In
``datasets`` 5.2.0 (huggingface/datasets, src/datasets/load.py,
``LocalDatasetModuleFactory.get_module``; src/datasets/builder.py, ``_relative_data_dir``) a
local folder is cached under ``<cache>/<folder name>/<config>/<version>/<hash>``, the hash
being ``Hasher.hash({"dataset_infos", "builder_configs"})``; the builder configs made from a
card's ``configs`` hold its ``data_files`` patterns and its other ``BuilderConfig`` fields,
not the files or their mtimes. Without the digest, two exports in folders of one name (or a
re-export with --overwrite) hash alike, and the second load silently returns the first's rows.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bestofn.export.formats import Writer, take_key, with_audio_facts

# datasets' own choice for audio: small row groups, so a random access reads little.
ROW_GROUP_SIZE = 100
AUDIO_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _binary(blobs: list[bytes]) -> pa.Array:
    """A binary array over the blobs, built from one buffer (pa.array on a list of large bytes
    objects is ~10x slower: it converts them one by one)."""
    offsets = np.zeros(len(blobs) + 1, np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError(f"{len(blobs)} takes of {offsets[-1]} bytes in one parquet row group")
    offsets = offsets.astype(np.int32)
    data = pa.py_buffer(b"".join(blobs))
    return pa.Array.from_buffers(pa.binary(), len(blobs), [None, pa.py_buffer(offsets), data])


class HFWriter(Writer):
    name = "hf"
    unit = "shard"

    def __init__(self):
        import datasets  # noqa: F401  (fail before any work when it is not installed)

    def shard_path(self, split: str, n: int) -> str:
        return f"data/{split}-{n:05d}.parquet"

    def begin(self, meta: pa.Table, settings) -> None:
        from datasets import Audio, Features

        rates = pc.unique(meta.column("sample_rate")).to_pylist()
        rate = settings.sample_rate or (rates[0] if len(rates) == 1 else None)
        fields = [pa.field("audio", AUDIO_TYPE)]
        for f in meta.schema:
            typ = pa.int32() if f.name in ("sample_rate", "channels") else f.type
            fields.append(pa.field(f.name, typ))
        if "num_samples" not in meta.schema.names:
            fields.append(pa.field("num_samples", pa.int64()))
        features = Features.from_arrow_schema(pa.schema(fields))
        features["audio"] = Audio(sampling_rate=rate)
        self.schema = features.arrow_schema
        self.columns = self.schema.names
        self.rate = rate

    def write_shard(self, path, part: pa.Table, audio: list[tuple], settings) -> None:
        part = with_audio_facts(part, audio)
        names = [
            f"{take_key(g, t)}.flac"
            for g, t in zip(
                part.column("group_id").to_pylist(), part.column("take").to_pylist(), strict=True
            )
        ]
        others = [n for n in self.schema.names if n != "audio"]
        with pq.ParquetWriter(
            path,
            self.schema,
            # FLAC is compressed already: its bytes are stored as they are, without statistics
            compression={
                **{n: "zstd" for n in others},
                "audio.bytes": "none",
                "audio.path": "zstd",
            },
            use_dictionary=others,
            write_statistics=others,
        ) as w:
            for start in range(0, part.num_rows, ROW_GROUP_SIZE):
                end = min(start + ROW_GROUP_SIZE, part.num_rows)
                col = pa.StructArray.from_arrays(
                    [_binary([a[0] for a in audio[start:end]]), pa.array(names[start:end])],
                    fields=list(AUDIO_TYPE),
                )
                rows = part.slice(start, end - start)
                table = pa.table({"audio": col, **{n: rows.column(n) for n in rows.column_names}})
                w.write_table(table.select(self.schema.names).cast(self.schema))

    def finish(self, tmp, meta: pa.Table, units, settings) -> pa.Table:
        # every unit's fingerprint covers its rows (split included), its takes' audio and the
        # audio settings: equal digests, equal exports
        h = hashlib.sha256()
        for u in sorted(units, key=lambda u: u.relpath):
            h.update(f"{u.relpath}\0{u.fingerprint}\n".encode())
        self.digest = h.hexdigest()
        return meta

    def card_yaml(self, splits: list[str]) -> dict:
        return {
            "configs": [
                {
                    "config_name": "default",
                    "description": f"bestofn export, content sha256 {self.digest}",
                    "data_files": [{"split": s, "path": f"data/{s}-*.parquet"} for s in splits],
                }
            ]
        }

    def load_lines(self, out: str, splits: list[str]) -> str:
        return (
            "import io, soundfile\n"
            "from datasets import Audio, load_dataset\n\n"
            f'ds = load_dataset("{out}")  # splits: {", ".join(splits)}\n'
            'ds = ds.cast_column("audio", Audio(decode=False))  # the FLAC bytes, as exported\n'
            f'row = ds["{splits[0]}"][0]  # row["text"], row["emotion"], row["score"], ...\n'
            'audio, rate = soundfile.read(io.BytesIO(row["audio"]["bytes"]))'
        )
