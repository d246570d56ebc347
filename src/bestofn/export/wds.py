"""WebDataset: tar shards ``shards/{split}-NNNNNN.tar``, written by ``webdataset.TarWriter``,
one sample per take: ``{key}.flac`` (the audio) and ``{key}.json`` (its row), the key being
``emotion/prompt_id/NNN`` (see ``formats.take_key``)."""

from __future__ import annotations

import pyarrow as pa

from bestofn.export.formats import Writer, dumps, json_rows, take_key, with_audio_facts


class WebDatasetWriter(Writer):
    name = "webdataset"
    unit = "shard"

    def __init__(self):
        import webdataset

        self.wds = webdataset

    def shard_path(self, split: str, n: int) -> str:
        return f"shards/{split}-{n:06d}.tar"

    def write_shard(self, path, part: pa.Table, audio: list[tuple], settings) -> None:
        part = with_audio_facts(part, audio)
        with self.wds.TarWriter(str(path)) as sink:
            for row, a in zip(json_rows(part), audio, strict=True):
                key = take_key(row["group_id"], row["take"])
                sink.write({"__key__": key, "flac": a[0], "json": dumps(row).encode()})

    def finish(self, tmp, meta: pa.Table, units, settings) -> pa.Table:
        self.shards = {}
        for u in units:
            self.shards.setdefault(u.split, []).append(u.relpath)
        return meta

    def load_lines(self, out: str, splits: list[str]) -> str:
        s = splits[0]
        n = len(self.shards.get(s, [])) - 1
        return (
            "import io, soundfile, webdataset as wds\n"
            f'ds = wds.WebDataset("{out}/shards/{s}-{{000000..{n:06d}}}.tar", shardshuffle=False)'
            ".decode()\n"
            'audio, rate = soundfile.read(io.BytesIO(next(iter(ds))["flac"]))  # s["json"]: '
            "text, emotion, scores"
        )
