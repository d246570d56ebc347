"""``bestofn export --format pairs``: preference pairs for alignment (DPO-style trainers read
(chosen, rejected) rows), as a Hugging Face dataset of parquet shards.

Per group, the takes that pass the reward's filter, in the reward's order (the one pick rule):
the best is paired with the worst, the second with the second-worst, and so on, the widest
spread first, each take in one pair at most; a pair is kept while the chosen take's score beats
the rejected's by at least the margin, and at most ``pairs_per_group`` per group. Takes that fail
the gate are never paired (a failed take is not a worse performance of the line, it is a broken
one). Each row has both audios, the text, the emotion, the Instruction the generator got, the
emotion's direction text and both takes' rows of scores (``chosen_*``, ``rejected_*``)."""

from __future__ import annotations

import hashlib
import math
import shutil
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from bestofn.export import steps
from bestofn.export.formats import Writer, take_key
from bestofn.export.hf import AUDIO_TYPE, ROW_GROUP_SIZE, _binary
from bestofn.export.rows import open_database, select_rows, split_of
from bestofn.export.settings import ExportError, ExportSettings
from bestofn.util import durable

SHARED = ("group_id", "emotion", "prompt_id", "text", "class")
LEFT_OUT = {"flac_path", "_group_finished", "passes"}


def pair_indices(scores: list, per_group: int, margin: float) -> list[tuple[int, int]]:
    """(chosen, rejected) positions in a group's passing takes, ranked best first: the i-th
    best with the i-th worst while the spread is at least ``margin`` (it only narrows)."""
    out = []
    n = len(scores)
    for i in range(min(per_group, n // 2)):
        hi, lo = scores[i], scores[n - 1 - i]
        if hi is None or lo is None or not math.isfinite(hi - lo) or hi - lo < margin:
            break
        if hi - lo <= 0 and margin <= 0:  # a tie says nothing about preference
            break
        out.append((i, n - 1 - i))
    return out


def _pairs_table(table: pa.Table, settings: ExportSettings, texts: dict) -> pa.Table:
    """One row per pair: the shared columns, both takes' rows prefixed chosen_/rejected_."""
    rows = table.to_pylist()
    by_group: dict[str, list[dict]] = {}
    for r in rows:
        by_group.setdefault(r["group_id"], []).append(r)
    own = [c for c in table.column_names if c not in SHARED and c not in LEFT_OUT]
    out: dict[str, list] = {c: [] for c in table.column_names if c in SHARED}
    out.update({"instruction": [], "description": [], "score_margin": []})
    for side in ("chosen", "rejected"):
        out.update({f"{side}_{c}": [] for c in own})
    for takes in by_group.values():
        takes.sort(key=lambda r: r["rank"])
        scores = [r["score"] for r in takes]
        for i, j in pair_indices(scores, settings.pairs_per_group, settings.margin):
            chosen, rejected = takes[i], takes[j]
            for c in SHARED:
                if c in out:
                    out[c].append(chosen[c])
            group = (chosen["emotion"], chosen["prompt_id"])
            instruction, description = texts.get(group, (None, None))
            out["instruction"].append(instruction)
            out["description"].append(description)
            out["score_margin"].append(chosen["score"] - rejected["score"])
            for side, r in (("chosen", chosen), ("rejected", rejected)):
                for c in own:
                    out[f"{side}_{c}"].append(r[c])
    types = {f.name: f.type for f in table.schema}
    fields = []
    for name in out:
        base = name.split("_", 1)[1] if name.startswith(("chosen_", "rejected_")) else name
        typ = types.get(base, types.get(name))
        if name in ("instruction", "description"):
            typ = pa.string()
        if name == "score_margin":
            typ = pa.float64()
        fields.append(pa.field(name, typ))
    return pa.table({f.name: pa.array(out[f.name], f.type) for f in fields})


class PairsWriter(Writer):
    """Preference pairs: the writer runs the whole export (its rows are pairs, not takes)."""

    name = "pairs"
    unit = "whole"

    def __init__(self):
        import datasets  # noqa: F401  (fail before any work when it is not installed)

    def export(self, results, settings, selection: dict, log, t0: float, texts):
        return export_pairs(results, settings, selection, log, t0, texts)


def export_pairs(results: Path, settings: ExportSettings, selection: dict, log, t0,
                 texts: dict | None = None) -> steps.ExportSummary:  # fmt: skip
    """``texts``: (emotion, prompt_id) -> (the Instruction its takes were generated with or
    None, the emotion's direction text), from the sheets (export.command)."""
    from datasets import Audio, Features

    con = open_database(results)
    try:
        passing = select_rows(con, replace(settings, which="passing", top=None), selection)
    finally:
        con.close()
    table = _pairs_table(passing, settings, texts or {})
    if not table.num_rows:
        raise ExportError(
            f"no pair: no group has two passing takes {settings.margin:g} or more apart "
            f"(reward {settings.reward or 'default'}, --where {settings.where!r})"
        )
    # each take's FLAC, checked as every export checks it (a broken one stops the export)
    sources = {}
    for side in ("chosen", "rejected"):
        view = table.select(["group_id"]).append_column("take", table[f"{side}_take"])
        for col in ("sample_rate", "channels", "duration_s"):
            view = view.append_column(col, table[f"{side}_{col}"])
        flac = passing.select(["group_id", "take", "flac_path"]).to_pylist()
        paths = {(r["group_id"], r["take"]): r["flac_path"] for r in flac}
        view = view.append_column(
            "flac_path",
            pa.array([paths[(g, t)] for g, t in zip(view["group_id"].to_pylist(),
                                                    view["take"].to_pylist(), strict=True)]),
        )  # fmt: skip
        _, srcs, _, _ = steps._check_sources(results, view, replace(settings, skip_broken=False))
        sources[side] = srcs
    key = "prompt_id" if settings.split_by == "prompt" else "group_id"
    splits = split_of(table.column(key).to_pylist(), settings.fractions, settings.split_seed)
    table = table.append_column("split", pa.array(splits, pa.string()))

    fields = [pa.field("chosen_audio", AUDIO_TYPE), pa.field("rejected_audio", AUDIO_TYPE)]
    features = Features.from_arrow_schema(pa.schema(fields + list(table.schema)))
    for side in ("chosen", "rejected"):
        features[f"{side}_audio"] = Audio(sampling_rate=settings.sample_rate)
    schema = features.arrow_schema

    tmp = settings.out.parent / f".{settings.out.name}.partial-{uuid.uuid4().hex[:8]}"
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    (tmp / "data").mkdir(parents=True)
    try:
        units, h = [], hashlib.sha256()
        for split in settings.fractions:
            idx = [i for i, s in enumerate(splits) if s == split]
            for n, start in enumerate(range(0, len(idx), settings.shard_size)):
                rows = idx[start : start + settings.shard_size]
                rel = f"data/{split}-{n:05d}.parquet"
                _write_shard(tmp / rel, table.take(pa.array(rows, pa.int64())), rows, sources,
                             schema, settings)  # fmt: skip
                digest = hashlib.sha256((tmp / rel).read_bytes()).hexdigest()
                units.append(steps.Unit(rel, rows, split, digest))
                h.update(f"{rel}\0{digest}\n".encode())
        counts = {
            "split": {s: splits.count(s) for s in settings.fractions if s in splits},
        }
        _write_card(tmp / "README.md", table, settings, selection, counts, h.hexdigest())
        steps._write_marker(tmp, settings, selection, units, counts, [], table.num_rows)
        steps._publish(tmp, settings.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    summary = steps.ExportSummary(
        settings.out, table.num_rows, len(units), 0, [], counts["split"], time.perf_counter() - t0
    )
    log(
        f"export: {table.num_rows} pair(s) as pairs in {settings.out} "
        f"({', '.join(f'{k}={v}' for k, v in counts['split'].items())}); wrote {len(units)} "
        f"shard(s); {summary.seconds:.1f} s"
    )
    return summary


def _write_shard(path, part: pa.Table, rows, sources, schema, settings) -> None:
    cols = {}
    for side in ("chosen", "rejected"):
        meta = part.select([f"{side}_sample_rate", f"{side}_channels", f"{side}_duration_s"])
        blobs = []
        for i, (rate, ch, dur) in zip(rows, zip(*meta.to_pydict().values(), strict=True),
                                      strict=True):  # fmt: skip
            data = steps._audio_of(
                sources[side][i], {"sample_rate": rate, "channels": ch, "duration_s": dur},
                settings,
            )  # fmt: skip
            blobs.append(data[0])
        names = [
            f"{take_key(g, t)}.flac"
            for g, t in zip(
                part["group_id"].to_pylist(), part[f"{side}_take"].to_pylist(), strict=True
            )  # fmt: skip
        ]
        cols[f"{side}_audio"] = (blobs, names)
    others = [n for n in schema.names if n not in cols]
    with pq.ParquetWriter(path, schema, compression="zstd") as w:
        for start in range(0, part.num_rows, ROW_GROUP_SIZE):
            end = min(start + ROW_GROUP_SIZE, part.num_rows)
            audio = {
                name: pa.StructArray.from_arrays(
                    [_binary(blobs[start:end]), pa.array(names[start:end], pa.string())],
                    fields=list(AUDIO_TYPE),
                )
                for name, (blobs, names) in cols.items()
            }
            piece = part.slice(start, end - start)
            t = pa.table({**audio, **{n: piece[n] for n in others}})
            w.write_table(t.select(schema.names).cast(schema))
    durable.fsync(path)


def _write_card(path: Path, table, settings, selection, counts, digest) -> None:
    splits = list(counts["split"])
    front = {
        "license": settings.card.get("license") or "unknown",
        "language": list(settings.card.get("language") or []),
        "task_categories": ["text-to-speech"],
        "tags": ["bestofn", "synthetic", "audio", "preference-pairs"],
        "configs": [
            {
                "config_name": "default",
                # the content digest: datasets caches a local folder by its card's configs
                "description": f"bestofn preference pairs, content sha256 {digest}",
                "data_files": [{"split": s, "path": f"data/{s}-*.parquet"} for s in splits],
            }
        ],
    }
    reward = steps.reward_card(selection, settings.reward or "default")
    body = [
        "---",
        yaml.safe_dump(front, sort_keys=False).rstrip(),
        "---",
        f"# {settings.card.get('pretty_name') or 'bestofn preference pairs'}",
        "",
        f"{table.num_rows} (chosen, rejected) pair(s) of takes of one group (same text, emotion "
        "and voice), for preference training.",
        "",
        f"- Gate (both takes pass it): `{reward['filter']}`",
        f"- Score (chosen beats rejected): `{reward['score']}`",
        f"- Margin: at least {settings.margin:g}; at most {settings.pairs_per_group} pair(s) per "
        "group, the widest spread first (best with worst, second with second-worst...).",
        f"- Splits: {', '.join(f'{k} {v}' for k, v in counts['split'].items())} (by "
        f"{settings.split_by}).",
        "",
        "```python",
        "import io, soundfile",
        "from datasets import Audio, load_dataset",
        "",
        f'ds = load_dataset("{settings.out.name}")',
        'ds = ds.cast_column("chosen_audio", Audio(decode=False))',
        f'row = ds["{splits[0]}"][0]  # row["text"], row["chosen_score"], row["rejected_score"]',
        'chosen, rate = soundfile.read(io.BytesIO(row["chosen_audio"]["bytes"]))',
        "```",
        "",
        "Columns: "
        + ", ".join(f"`{n}`" for n in ["chosen_audio", "rejected_audio", *table.column_names])
        + ".",  # fmt: skip
        "",
    ]
    path.write_text("\n".join(body))
