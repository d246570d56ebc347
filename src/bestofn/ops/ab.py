"""`bestofn ab`: the same groups with the same seeds under two configs (A and B), speed and
memory side by side, quality deltas over matched takes against thresholds fixed beforehand.

Every speed dial (codec dtype, int8 generator weights, batch sizes, whisper compute type...)
needs a quality gate: this is it. The sides run one after the other, each in its own spawned
process (bestofn.ops.ab_side): A's models load, A's groups run into a temporary results
directory, A's process exits; then B. Nothing one side leaves (a CUDA context, compiled code,
allocator state, a broken device) reaches the other's figures: on an H200, B loaded in A's
process once A had run refused every ``torch.load(weights_only=True)``, and A run in the
command's own process hit an illegal memory access that the same side in a spawned process did
not. A take of A is matched with the take of B of the same group and take
index (and so the same seed: the seeds derive from group id and take index only).

Thresholds file (YAML), one entry per score column, in the column's own units::

    wer: {max_increase: 0.005}        # B's mean WER may be at most 0.5 pt above A's
    speaker_sim: {max_decrease: 0.01}  # B's mean speaker similarity at most 0.01 below A's
    dnsmos_ovrl: {max_decrease: 0.05}

The delta is the mean over matched takes of (B - A). ``pcm_mean_abs_diff``, ``pcm_max_abs_diff``
and ``pcm_rel_rms_diff`` (``bestofn.ops.pcm_diff``) are not score columns: they compare B's audio
with A's take by take (for a decode dial, where both sides have the same codes), and are
computed only when the thresholds file names one. A missing or malformed file, a column no
scorer of A or B writes, or A and B planning different groups is an error before any model
loads (where the column is known before loading).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bestofn.ops.ab_side import ABError, ABSideError, run_side_process
from bestofn.util.user_input import load_yaml_file

RULES = ("max_increase", "max_decrease")
# Columns every group's parquet has, whatever the scorers (bestofn.core.pipeline._rows).
BASE_COLUMNS = {"duration_s", "n_frames", "sample_rate", "channels"}
# Quality columns reported (as 'info') when both sides have them and no threshold names them.
INFO_COLUMNS = (
    "wer", "cer", "speaker_sim", "dnsmos_ovrl", "dnsmos_sig", "dnsmos_bak", "dnsmos_p808",
    "vc_genuineness", "vc_blend", "vc_prompt_sim", "duration_s",
)  # fmt: skip
RANDOM_NOTE = (
    "random weights (fake-weights): the quality deltas are meaningless; only speed and memory count"
)
RESULT_SCHEMA = pa.schema(
    [
        ("metric", pa.string()),
        ("kind", pa.string()),  # quality | speed | memory
        ("a", pa.float64()),
        ("b", pa.float64()),
        ("delta", pa.float64()),  # b - a (quality: mean over matched takes of b - a)
        ("rule", pa.string()),  # max_increase | max_decrease | '' (no threshold)
        ("limit", pa.float64()),
        ("verdict", pa.string()),  # PASS | FAIL | info
        ("n_pairs", pa.int64()),
        ("note", pa.string()),
        ("config_a", pa.string()),
        ("config_b", pa.string()),
        ("device", pa.string()),
        ("n_groups", pa.int64()),
        ("n_takes", pa.int64()),
        ("random_weights", pa.bool_()),
    ]
)


@dataclass(frozen=True)
class Threshold:
    column: str
    rule: str  # max_increase | max_decrease
    limit: float

    def passes(self, delta: float) -> bool:
        if delta is None or math.isnan(delta):
            return False
        if self.rule == "max_increase":
            return delta <= self.limit
        return delta >= -self.limit


def load_thresholds(path) -> list[Threshold]:
    """The thresholds file, checked: each entry ``column: {max_increase|max_decrease: x}``
    with one rule and a finite number x >= 0."""
    path = Path(path)
    data = load_yaml_file(path, "thresholds file", expect=None)  # UserInputError: bestofn.cli
    if not isinstance(data, dict) or not data:
        raise ABError(
            f"{path}: the thresholds file must be a mapping 'column: {{max_increase: x}}' or "
            f"'column: {{max_decrease: x}}', got {type(data).__name__}"
        )
    out = []
    for column, entry in data.items():
        where = f"{path}: column {column!r}"
        if not isinstance(entry, dict) or len(entry) != 1 or next(iter(entry)) not in RULES:
            raise ABError(f"{where}: expected exactly one of {list(RULES)}, got {entry!r}")
        rule, limit = next(iter(entry.items()))
        if isinstance(limit, bool) or not isinstance(limit, int | float):
            raise ABError(f"{where}: {rule} must be a number, got {limit!r}")
        if not math.isfinite(limit) or limit < 0:
            raise ABError(f"{where}: {rule} must be a finite number >= 0, got {limit!r}")
        out.append(Threshold(str(column), rule, float(limit)))
    return out


def _plan(config_path: Path, base: Path, takes: int | None):
    from bestofn.core.config import load_config
    from bestofn.core.plan import PlanError, build_plan

    config = load_config(config_path)  # UserInputError: missing, malformed, not a mapping
    if takes is not None:
        config = {**config, "takes": int(takes)}
    try:
        return build_plan(config, base)
    except PlanError as e:
        raise ABError(f"{config_path}: {e}") from None


def _known_columns(models: dict) -> set[str] | None:
    """Columns the configured scorers write, from their classes (None: some scorer names its
    columns only once loaded, e.g. empathic-insight's heads)."""
    from bestofn.backends.registry import backend_class

    cols = set(BASE_COLUMNS)
    for s in models.get("scorers", []):
        declared = backend_class("scorer", s["backend"]).columns
        if not declared:
            return None
        cols |= set(declared)
    return cols


def random_weight_paths(config_path: Path, models: dict) -> list[str]:
    """Weight paths (or the config) that `bestofn fake-weights` wrote: a FAKE_WEIGHTS.md beside
    them or in a parent directory (up to three levels), or a RANDOM_WEIGHTS.md in the
    directory itself (a random checkpoint written alone, e.g. by a benchmark)."""
    found = []
    candidates = [("config", Path(config_path).resolve())]
    for role in ("generator", "restorer"):
        for key, value in ((models.get(role) or {}).get("options") or {}).items():
            candidates.append((f"{role}.{key}", value))
    for s in models.get("scorers", []):
        for key, value in (s.get("options") or {}).items():
            candidates.append((f"{s['backend']}.{key}", value))
    for name, value in candidates:
        if not isinstance(value, str | Path) or not (key_is_path(name) or name == "config"):
            continue
        if is_random_checkpoint(value):
            found.append(f"{name} = {value}")
    return found


def is_random_checkpoint(path) -> bool:
    """Whether ``path`` holds random weights: `bestofn fake-weights` wrote it (a FAKE_WEIGHTS.md
    beside it or up to three levels up), or a fake writer wrote it alone (a RANDOM_WEIGHTS.md in
    it, e.g. a benchmark's checkpoint)."""
    p = Path(path).expanduser()
    return (p / "RANDOM_WEIGHTS.md").is_file() or any(
        (d / "FAKE_WEIGHTS.md").is_file() for d in [p, *p.parents][:4]
    )


def key_is_path(name: str) -> bool:
    return name.endswith(("_path", "_dir"))


# ---- the side's column check ----------------------------------------------------------------


class ColumnCheck:
    """After a side's load: every thresholded column is one its scorers write (scorers that
    name their columns only once loaded). A class, not a closure: it travels to the side's
    process."""

    def __init__(self, label: str, path, thresholds_path, columns: list[str]):
        self.label, self.path, self.thresholds_path = label, path, thresholds_path
        self.columns = list(columns)

    def __call__(self, backends) -> None:
        cols = BASE_COLUMNS | {c for s in backends.scorers for c in s.columns}
        missing = [c for c in self.columns if c not in cols]
        if missing:
            raise ABError(
                f"thresholds file {self.thresholds_path}: column(s) {missing} are written by no "
                f"scorer of {self.label} ({self.path}); its columns: {sorted(cols)}"
            )


# ---- comparing ----------------------------------------------------------------------------


def _matched(a: pa.Table, b: pa.Table) -> tuple[dict, dict]:
    """Rows of A and B keyed by (group_id, take); seeds must agree take by take."""

    def keys(t: pa.Table) -> dict:
        pairs = zip(t["group_id"].to_pylist(), t["take"].to_pylist(), strict=True)
        return {key: i for i, key in enumerate(pairs)}

    ka, kb = keys(a), keys(b)
    if set(ka) != set(kb):
        raise RuntimeError(f"A and B wrote different takes: {sorted(set(ka) ^ set(kb))[:5]}")
    sa, sb = a["seed"].to_pylist(), b["seed"].to_pylist()
    for key in ka:
        if sa[ka[key]] != sb[kb[key]]:
            raise RuntimeError(f"take {key}: seed {sa[ka[key]]} under A, {sb[kb[key]]} under B")
    return ka, kb


def quality_rows(a: pa.Table, b: pa.Table, thresholds: list[Threshold]) -> list[dict]:
    ka, kb = _matched(a, b)
    keys = sorted(ka)
    named = {t.column: t for t in thresholds}
    columns = [t.column for t in thresholds] + [
        c for c in INFO_COLUMNS if c not in named and c in a.column_names and c in b.column_names
    ]
    rows = []
    for col in columns:
        va, vb = a[col].to_pylist(), b[col].to_pylist()
        pairs = [
            (va[ka[k]], vb[kb[k]])
            for k in keys
            if va[ka[k]] is not None and vb[kb[k]] is not None
            and not (math.isnan(va[ka[k]]) or math.isnan(vb[kb[k]]))
        ]  # fmt: skip
        n = len(pairs)
        mean_a = sum(x for x, _ in pairs) / n if n else math.nan
        mean_b = sum(y for _, y in pairs) / n if n else math.nan
        delta = sum(y - x for x, y in pairs) / n if n else math.nan
        t = named.get(col)
        note = "" if n else "no matched takes with a value on both sides"
        rows.append(
            {
                "metric": col,
                "kind": "quality",
                "a": mean_a,
                "b": mean_b,
                "delta": delta,
                "rule": t.rule if t else "",
                "limit": t.limit if t else None,
                "verdict": ("PASS" if t.passes(delta) else "FAIL") if t else "info",
                "n_pairs": n,
                "note": note,
            }
        )
    return rows


SPEED_METRICS = (
    ("generate_s_per_clip", "speed", "generation incl. codec decode, per clip"),
    ("restore_s_per_clip", "speed", ""),
    ("score_s_per_clip", "speed", ""),
    ("wall_s_per_clip", "speed", "group wall (generate + restore + score + write) per clip"),
    ("load_s", "speed", "model load, once per side"),
)


def speed_rows(a: dict, b: dict) -> list[dict]:
    metrics = [*SPEED_METRICS]
    if a.get("decode_s_per_clip") is not None and b.get("decode_s_per_clip") is not None:
        # generators that time their codec decode (moss-fast): the codec dtype dials' own row
        metrics.insert(1, ("decode_s_per_clip", "speed", "codec decode alone, per clip"))
    mem_key = "peak_cuda_allocated_gib" if "peak_cuda_allocated_gib" in a else "peak_rss_gib"
    metrics.append((mem_key, "memory", a.get("mem_note") or "load + run of the side"))
    return [
        {
            "metric": key,
            "kind": kind,
            "a": float(a[key]),
            "b": float(b[key]),
            "delta": float(b[key]) - float(a[key]),
            "rule": "",
            "limit": None,
            "verdict": "info",
            "n_pairs": None,
            "note": note,
        }
        for key, kind, note in metrics
    ]


def format_table(rows: list[dict], header: str) -> str:
    def num(v):
        return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"

    cols = ["metric", "A", "B", "delta (B-A)", "threshold", "verdict", "note"]
    body = [
        [
            r["metric"],
            num(r["a"]),
            num(r["b"]),
            num(r["delta"]),
            f"{r['rule']} {r['limit']:g}" if r["rule"] else "",
            r["verdict"],
            r["note"],
        ]
        for r in rows
    ]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))
    out = [header, line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(b, widths, strict=True)).rstrip() for b in body]
    return "\n".join(out)


# ---- the command --------------------------------------------------------------------------


def run_ab(
    config_a, config_b, thresholds_path, *, groups: int | None = 1, takes: int | None = None,
    out=None, base=".", device: str | None = None, workdir=None, log=print, warmup: int = 1,
) -> tuple[bool, pa.Table]:  # fmt: skip
    """Run A then B; return (every thresholded row passed, the result table). Writes ``out``
    (parquet) when given. Every input check runs before any model loads."""
    thresholds = load_thresholds(thresholds_path)  # first: a bad file costs no model load
    from bestofn.ops.pcm_diff import METRICS as PCM_METRICS

    pcm_thresholds = {t.column: t for t in thresholds if t.column in PCM_METRICS}
    thresholds = [t for t in thresholds if t.column not in PCM_METRICS]
    base = Path(base)
    config_a, config_b = Path(config_a), Path(config_b)
    plan_a, plan_b = _plan(config_a, base, takes), _plan(config_b, base, takes)
    dev_a = device or plan_a.config["device"]
    dev_b = device or plan_b.config["device"]
    if dev_a != dev_b:
        raise ABError(f"A runs on {dev_a!r}, B on {dev_b!r}: pass --device to compare on one")
    specs = list(plan_a.groups.values())
    if groups is not None:
        if groups < 1:
            raise ABError(f"--groups must be >= 1, got {groups}")
        specs = specs[:groups]
    for spec in specs:
        other = plan_b.groups.get((spec.emotion, spec.prompt_id))
        if other != spec:
            raise ABError(
                f"group {spec.group_id}: A and B plan it differently ({spec} vs {other}); "
                "an A/B compares the same groups (sheets, takes, seed)"
            )
    # The sheets' reference voices are relative to base (the workflow runs there); we may not.
    specs = [
        replace(s, reference_audio=str((base / s.reference_audio).resolve()))
        if s.reference_audio and not Path(s.reference_audio).is_absolute()
        else s
        for s in specs
    ]
    for label, plan, path in (("A", plan_a, config_a), ("B", plan_b, config_b)):
        known = _known_columns(plan.config["models"])
        missing = [t.column for t in thresholds if known is not None and t.column not in known]
        if missing:
            raise ABError(
                f"thresholds file {thresholds_path}: column(s) {missing} are written by no "
                f"scorer of {label} ({path}); its columns: {sorted(known)}"
            )
    random = random_weight_paths(config_a, plan_a.config["models"]) + random_weight_paths(
        config_b, plan_b.config["models"]
    )

    sides = {}
    with tempfile.TemporaryDirectory(prefix="bestofn-ab-", dir=workdir) as tmp:
        for label, plan in (("A", plan_a), ("B", plan_b)):
            side_dir = Path(tmp) / label
            side_dir.mkdir()
            path = config_a if label == "A" else config_b
            check = ColumnCheck(label, path, thresholds_path, [t.column for t in thresholds])
            sides[label] = run_side_process(
                label, plan.config["models"], specs, dev_a, side_dir, log, check, warmup
            )
        if pcm_thresholds:  # the takes' audio, side by side, before the temp dir goes
            from bestofn.ops.pcm_diff import pcm_rows

            pcm = pcm_rows(Path(tmp) / "A", Path(tmp) / "B", pcm_thresholds)
    a, b = sides["A"], sides["B"]
    for label, side in sides.items():
        cols = set(side["takes"].column_names)
        missing = [t.column for t in thresholds if t.column not in cols]
        if missing:
            raise ABError(f"thresholds file {thresholds_path}: {label} wrote no column {missing}")
    rows = speed_rows(a, b) + quality_rows(a["takes"], b["takes"], thresholds)
    rows += pcm if pcm_thresholds else []
    if random:
        for r in rows:
            if r["kind"] == "quality":
                r["note"] = ("; ".join(x for x in (r["note"], RANDOM_NOTE) if x)).strip()
    fixed = {
        "config_a": str(config_a),
        "config_b": str(config_b),
        "device": dev_a,
        "n_groups": len(specs),
        "n_takes": a["clips"],
        "random_weights": bool(random),
    }
    rows = [{**r, **fixed} for r in rows]
    passed = all(r["verdict"] != "FAIL" for r in rows)
    header = (
        f"bestofn ab: A = {config_a}, B = {config_b}; {len(specs)} group(s), {a['clips']} "
        f"matched takes, device {dev_a}; thresholds {thresholds_path}"
    )
    if random:
        header += f"\nNOTE: {RANDOM_NOTE} ({'; '.join(random[:3])})"
    log(format_table(rows, header))
    log(f"ab: {'PASS' if passed else 'FAIL'}")
    table = pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)
    if out:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        table = table.replace_schema_metadata(
            {"provenance": json.dumps({"A": a["provenance"], "B": b["provenance"]}, default=str)}
        )
        pq.write_table(table, out)
        log(f"ab: wrote {out}")
    return passed, table


def ab_main(args) -> int:
    try:
        passed, _ = run_ab(
            args.a, args.b, args.thresholds, groups=args.groups, takes=args.takes,
            out=args.out, base=args.base, device=args.device, warmup=args.warmup,
        )  # fmt: skip
    except ABError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ABSideError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    return 0 if passed else 1
