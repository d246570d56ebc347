"""Lhotse: per split, ``recordings_{split}.jsonl.gz``, ``supervisions_{split}.jsonl.gz`` and
``cuts_{split}.jsonl.gz``, written by lhotse's own manifest classes. A take is one recording
(its FLAC under ``audio/``), one supervision over the whole of it (``text``, ``language`` and,
in ``custom``, ``emotion`` and ``prompt_id``: lhotse exposes custom keys as attributes, so
``sup.emotion`` works) and one cut whose ``custom`` holds the scores, seed and provenance.
Relative paths are relative to the export: load with ``.with_recording_path_prefix(DIR)``."""

from __future__ import annotations

import pyarrow as pa

from bestofn.export.formats import Writer, json_rows, with_exported_files

SUPERVISION_CUSTOM = ("emotion", "prompt_id")


class LhotseWriter(Writer):
    name = "lhotse"
    unit = "take"

    def __init__(self):
        import lhotse

        self.lhotse = lhotse

    def finish(self, tmp, meta: pa.Table, units, settings) -> pa.Table:
        from lhotse import (
            AudioSource,
            CutSet,
            Recording,
            RecordingSet,
            SupervisionSegment,
            SupervisionSet,
        )
        from lhotse.cut import MonoCut, MultiCut

        meta = with_exported_files(tmp, meta, units, settings)
        language = (settings.card.get("language") or [None])[0]
        per_split: dict[str, tuple[list, list, list]] = {}
        for row in json_rows(meta):
            rid = f"{row['group_id']}/{row['take']:03d}"
            channels = list(range(row["channels"]))
            rec = Recording(
                id=rid,
                sources=[AudioSource("file", channels, row.pop("audio_filepath"))],
                sampling_rate=row["sample_rate"],
                num_samples=row["num_samples"],
                duration=row["duration_s"],
            )
            sup = SupervisionSegment(
                id=rid,
                recording_id=rid,
                start=0.0,
                duration=rec.duration,
                channel=channels[0] if len(channels) == 1 else channels,
                text=row.pop("text"),
                language=row.pop("language", None) or language,  # the take's, else the card's
                custom={k: row.pop(k) for k in SUPERVISION_CUSTOM},
            )
            cut_cls, channel = (MonoCut, 0) if len(channels) == 1 else (MultiCut, channels)
            cut = cut_cls(
                id=rid, start=0.0, duration=rec.duration, channel=channel,
                supervisions=[sup], recording=rec, custom=row,
            )  # fmt: skip
            recs, sups, cuts = per_split.setdefault(row["split"], ([], [], []))
            recs.append(rec)
            sups.append(sup)
            cuts.append(cut)
        for split, (recs, sups, cuts) in per_split.items():
            RecordingSet.from_recordings(recs).to_file(tmp / f"recordings_{split}.jsonl.gz")
            SupervisionSet.from_segments(sups).to_file(tmp / f"supervisions_{split}.jsonl.gz")
            CutSet.from_cuts(cuts).to_file(tmp / f"cuts_{split}.jsonl.gz")
        self.relative = settings.paths == "relative"
        return meta

    def load_lines(self, out: str, splits: list[str]) -> str:
        prefix = f'.with_recording_path_prefix("{out}")' if self.relative else ""
        return (
            "from lhotse import CutSet\n"
            f'cuts = CutSet.from_file("{out}/cuts_{splits[0]}.jsonl.gz"){prefix}\n'
            "audio = cuts[0].load_audio()  # cuts[0].supervisions[0].text / .emotion, "
            "cuts[0].custom: scores"
        )
