"""The export's dataset card, README.md: YAML metadata as the Hugging Face Hub reads it
(license, language, and for hf the ``configs`` that name the splits), then what was selected
and how, the held-out results, the models and their hashes, the counts per emotion and split,
the audio settings and the three lines that load it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from bestofn import __version__
from bestofn.export.audio import RESAMPLE_QUALITY

WHICH = {
    "selected": "the selected take of every group (rank 1: the highest-scoring passing take)",
    "passing": "every take that passes the filter, with its rank in its group (1 = selected)",
    "all": "every take with its scores, passing or not (`passes`, `rank`), e.g. for reward models",
}


def _table(header: list[str], rows: list[list]) -> str:
    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _front_matter(settings, writer, splits: list[str], rows: int) -> str:
    card = settings.card
    meta = {"license": card.get("license") or "unknown"}
    for key in ("license_name", "license_link", "pretty_name"):
        if card.get(key):
            meta[key] = card[key]
    meta["language"] = list(card.get("language") or [])
    meta["task_categories"] = ["text-to-speech"]
    meta["tags"] = ["bestofn", "synthetic", "audio"]
    meta["size_categories"] = [_size_category(rows)]
    meta.update(writer.card_yaml(splits))
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def _size_category(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                        (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M")):  # fmt: skip
        if n < limit:
            return name
    return "10M<n<100M"


def _held_out(con) -> str:
    tables = {
        r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
    }
    if "held_out" not in tables:
        return "No held-out results in the database."
    res = con.sql("SELECT * FROM held_out")
    rows = res.fetchall()
    if not rows:
        return "No held-out scorer was configured (`selection.held_out`)."
    return _table(res.columns, [list(r) for r in rows])


def _models(con) -> str:
    rows = con.execute(
        "SELECT generator, models_hash, any_value(models), count(DISTINCT group_id) "
        "FROM takes GROUP BY ALL ORDER BY 4 DESC"
    ).fetchall()
    out = [_table(["generator", "models_hash", "groups"], [[r[0], r[1], r[3]] for r in rows])]
    for gen, mhash, models, _ in rows:
        try:
            models = json.dumps(json.loads(models), indent=1, sort_keys=True)
        except (TypeError, ValueError):
            pass
        out.append(f"\nModels `{mhash}` ({gen}), with their file hashes:\n\n```json\n{models}\n```")
    return "\n".join(out)


def _groups(con) -> str:
    rows = con.execute(
        "SELECT status, count(*) FROM groups GROUP BY status ORDER BY status"
    ).fetchall()
    return ", ".join(f"{n} {status}" for status, n in rows)


def write_card(path, con, meta: pa.Table, settings, selection, writer, counts, skipped) -> None:
    splits = list(counts["split"])
    emotions = list(counts["emotion"])
    rates = sorted(pc.unique(meta.column("sample_rate")).to_pylist())
    channels = sorted(pc.unique(meta.column("channels")).to_pylist())
    resampled = settings.sample_rate is not None or settings.channels is not None
    out_name = settings.out.name
    fr = settings.fractions
    total = sum(fr.values())
    body = [
        _front_matter(settings, writer, splits, meta.num_rows),
        f"# {settings.card.get('pretty_name') or 'bestofn export'}",
        "",
        f"Best-of-N voice-acting takes, exported by bestofn {__version__} on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC as **{settings.format}**: "
        f"{meta.num_rows} take(s) in {len(splits)} split(s).",
        "",
        "## What was selected, and how",
        "",
        f"- Takes: {WHICH[settings.which]}.",
        f"- Filter (a take must pass it): `{selection['filter']}`",
        f"- Score (highest wins; ties: lowest take): `{selection['score']}`",
        f"- Extra export filter (`--where`): `{settings.where}`"
        if settings.where
        else "- Extra export filter (`--where`): none",
        f"- Groups in the database: {_groups(con)}.",
        "- Skipped (missing or broken FLAC): " + ("; ".join(skipped) if skipped else "none"),
        "",
        "### Held-out scorers (computed, never selected on)",
        "",
        _held_out(con),
        "",
        "## Models",
        "",
        _models(con),
        "",
        "## Counts per emotion and split",
        "",
        _table(
            ["emotion", *splits, "all"],
            [
                [e, *[counts["emotion_split"].get((e, s), 0) for s in splits], counts["emotion"][e]]
                for e in emotions
            ]  # fmt: skip
            + [["all", *[counts["split"][s] for s in splits], meta.num_rows]],
        ),
        "",
        f"Splits by a seeded hash of the {settings.split_by} id (seed {settings.split_seed}; "
        "the first 8 bytes of sha256(f'{seed}\\0{id}') against the shares "
        + ", ".join(f"{k} {v / total:.3g}" for k, v in fr.items())
        + (
            "): every take of a prompt, in every emotion, is in one split."
            if settings.split_by == "prompt"
            else "): every take of a group is in one split."
        ),
        "",
        "## Audio",
        "",
        f"- Rate(s): {', '.join(map(str, rates))} Hz; channels: {', '.join(map(str, channels))}.",
        (
            f"- Converted: resampled with soxr ({RESAMPLE_QUALITY}) to "
            f"{settings.sample_rate or 'the source rate'} Hz, channels "
            f"{settings.channels or 'as generated'}; re-encoded as FLAC."
            if resampled
            else "- The groups' FLAC files, passed through byte for byte (not re-encoded)."
        ),
        "",
        "## License",
        "",
        f"- license: {settings.card.get('license') or 'unknown'}"
        + (f" ({settings.card['license_name']})" if settings.card.get("license_name") else "")
        + (f", {settings.card['license_link']}" if settings.card.get("license_link") else ""),
        "- Set in the config's `export.card` (config/README.md).",
        "",
        "## Load it",
        "",
        "```python",
        writer.load_lines(out_name, splits),
        "```",
        "",
        "Columns: "
        + ", ".join(f"`{n}`" for n in getattr(writer, "columns", meta.column_names))
        + ".",
        "",
    ]
    path.write_text("\n".join(body))
