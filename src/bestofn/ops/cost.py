"""`bestofn plan`: what remains to be generated, per emotion, the GPU-hours it will take at the
throughput measured so far, and the wall-clock at the box's slot count. Seconds at any size: no
Snakemake DAG, no model.

- The groups come from the config and sheets (``bestofn.core.plan``, every check included).
- A group is done when its directory exists under ``results/groups`` (published atomically:
  complete or absent). Hidden staging/partial siblings do not count.
- The rate is the measured wall time per take (clip) of the finished groups in
  ``results/bestofn.duckdb`` (table ``throughput``), per device. Remaining takes x that rate
  = the worker-hours left; on GPUs, GPU-hours (one worker per GPU). Model loading is left out
  (once per worker or SLURM job).

- The wall-clock at the box's slots (``runtime.slots``, else the GPUs the worker pool sees)
  takes its seconds per take from the best source there is, and names it: the groups already
  published (their scores.parquet footers and timing columns; per worker process, first start
  to last finish over its takes, so overlapped groups are not counted twice); else the pilot of
  ``bestofn doctor`` (``{results}/doctor.json``); else the documented per-GPU figure for the
  box's GPU model (DOCUMENTED below: measured on random weights at real size, not your
  weights).

Not counted: a finished group whose params changed since (a new text, N, seed, voice or models)
will run again; ``snakemake -n`` lists those too."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from bestofn.core.plan import Plan


@dataclass
class Rate:
    device: str
    groups: int
    clips: int
    wall_s: float

    @property
    def s_per_clip(self) -> float:
        return self.wall_s / self.clips


@dataclass
class Remaining:
    takes: int
    planned: dict[str, int] = field(default_factory=dict)  # emotion -> groups in the plan
    done: dict[str, int] = field(default_factory=dict)  # emotion -> groups published
    rates: list[Rate] = field(default_factory=list)
    why_no_rate: str = ""
    slots: int = 1
    per_slot: SlotRate | None = None  # seconds per take on one slot, and where it comes from
    why_no_wall: str = ""

    @property
    def left(self) -> dict[str, int]:
        return {e: n - self.done.get(e, 0) for e, n in self.planned.items()}

    @property
    def groups_left(self) -> int:
        return sum(self.left.values())

    def hours_left(self, rate: Rate) -> float:
        return self.groups_left * self.takes * rate.s_per_clip / 3600

    @property
    def wall_hours_left(self) -> float | None:
        """Wall-clock hours at ``slots`` slots working at once (model loading not included)."""
        if self.per_slot is None:
            return None
        return self.groups_left * self.takes * self.per_slot.s_per_take / self.slots / 3600


@dataclass
class SlotRate:
    s_per_take: float
    source: str  # "published groups", "doctor pilot" or "documented figure"
    detail: str


# Seconds per take on one GPU slot, per GPU model, as measured (ledger figure
# workflow.s_per_clip_per_gpu): the production set of config/recipes/base.yaml (N=64, moss-fast
# with pair_groups, Sidon, Parakeet, VoiceCLAP, Empathic-Insight) through snakemake, steady
# state, on random weights at real size; the value is the goal those runs met.
# No other GPU model has a measured figure: there the estimate waits for the doctor's pilot.
DOCUMENTED = {
    "H200": (
        0.030,
        "docs/PERFORMANCE.md, the production set on one NVIDIA H200 at N=64, random weights at "
        "real size: not your weights",
    ),
}
DOCTOR_FILE = "doctor.json"  # under the results directory; written by `bestofn doctor`
# Newest published groups whose parquet footers are read for the rate (bounds plan's time).
RATE_SAMPLE_GROUPS = 2000


def gpu_model_names() -> list[str]:
    """The box's NVIDIA GPU models as the driver names them (no torch, no subprocess)."""
    root = Path("/proc/driver/nvidia/gpus")
    names = []
    if root.is_dir():
        for info in sorted(root.glob("*/information")):
            for line in info.read_text(errors="replace").splitlines():
                if line.startswith("Model:"):
                    names.append(line.split(":", 1)[1].strip())
    return names


def documented_rate(gpu_names: list[str]) -> SlotRate | None:
    for name in gpu_names:
        for model, (s_per_take, detail) in DOCUMENTED.items():
            if model in name:
                return SlotRate(s_per_take, "documented figure", f"{name}; {detail}")
    return None


def doctor_rate(results: Path) -> SlotRate | None:
    """The pilot of ``bestofn doctor`` (one group per slot), if it ran and timed a group."""
    path = results / DOCTOR_FILE
    try:
        pilot = json.loads(path.read_text())["pilot"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not pilot or not pilot.get("takes") or not pilot.get("wall_s"):
        return None
    return SlotRate(
        pilot["wall_s"] / pilot["takes"],
        "doctor pilot",
        f"{path}: {pilot['groups']} group(s) of {pilot['takes'] // pilot['groups']} takes on "
        f"{pilot['device']}, each alone on its slot (no next group overlapped: an upper bound)",
    )


def published_rate(results: Path, limit: int = RATE_SAMPLE_GROUPS) -> SlotRate | None:
    """Seconds per take on one slot from the newest published groups' scores.parquet: per
    worker process, its first group's start to its last group's end, over its takes."""
    import pyarrow.parquet as pq

    from bestofn.core.groupio import SCORES

    files = []
    for emotion, prompt_id in published_groups(results):
        path = results / "groups" / emotion / prompt_id / SCORES
        try:
            files.append((path.stat().st_mtime, path))
        except OSError:
            continue
    workers: dict[tuple, list] = {}
    columns = ["host", "worker_pid", "started_at", "finished_at"]
    for _, path in sorted(files, reverse=True)[:limit]:
        try:
            f = pq.ParquetFile(path)
            if f.metadata.num_rows == 0 or not set(columns) <= set(f.schema_arrow.names):
                continue
            row = f.read_row_group(0, columns=columns).slice(0, 1).to_pylist()[0]
        except (OSError, ValueError):
            continue
        if row["started_at"] is None or row["finished_at"] is None:
            continue
        w = workers.setdefault((row["host"], row["worker_pid"]), [None, None, 0, 0])
        w[0] = row["started_at"] if w[0] is None else min(w[0], row["started_at"])
        w[1] = row["finished_at"] if w[1] is None else max(w[1], row["finished_at"])
        w[2] += f.metadata.num_rows
        w[3] += 1
    busy = sum((end - start).total_seconds() for start, end, _, _ in workers.values())
    takes = sum(w[2] for w in workers.values())
    if not takes or busy <= 0:
        return None
    groups = sum(w[3] for w in workers.values())
    return SlotRate(
        busy / takes,
        "published groups",
        f"{groups:,} newest published groups, {takes:,} takes, {len(workers)} worker(s)",
    )


def box_slots(config: dict) -> int:
    from bestofn.worker.client.runtime import detect_slots

    slots = (config.get("runtime") or {}).get("slots")
    return int(slots) if slots else detect_slots(config.get("device", "cpu"))


def published_groups(results: str | Path) -> set[tuple[str, str]]:
    """(emotion, prompt_id) of every published group directory (one scandir per emotion)."""
    root = Path(results) / "groups"
    done: set[tuple[str, str]] = set()
    if not root.is_dir():
        return done
    for emotion in os.scandir(root):
        if emotion.name.startswith(".") or not emotion.is_dir():
            continue
        with os.scandir(emotion.path) as entries:
            done.update(
                (emotion.name, g.name)
                for g in entries
                if not g.name.startswith(".") and g.is_dir(follow_symlinks=False)
            )
    return done


def measured_rates(db_path: str | Path) -> tuple[list[Rate], str]:
    """Wall seconds per clip of the finished groups, per device; or why there is none."""
    db_path = Path(db_path)
    if not db_path.is_file():
        return [], f"no measurement yet: {db_path} does not exist (it is built after a run)"
    import duckdb

    try:
        con = duckdb.connect(str(db_path), read_only=True)
    except duckdb.Error as e:
        return [], f"no measurement: {db_path} cannot be opened ({e})"
    try:
        rows = con.execute(
            "SELECT coalesce(device, '?'), count(*), sum(clips), sum(wall_s) FROM throughput "
            "WHERE level = 'group' AND wall_s > 0 AND clips > 0 GROUP BY 1 ORDER BY 3 DESC"
        ).fetchall()
    except duckdb.Error as e:
        return [], f"no measurement: {db_path} has no usable throughput table ({e})"
    finally:
        con.close()
    rates = [Rate(d, int(g), int(c), float(w)) for d, g, c, w in rows]
    return rates, "" if rates else f"no measurement yet: {db_path} holds no finished group"


def remaining(plan: Plan, results: str | Path | None = None) -> Remaining:
    results = Path(results if results is not None else plan.config["results"])
    done = published_groups(results)
    out = Remaining(takes=int(plan.config["takes"]))
    for emotion, prompt_id in plan.groups:
        out.planned[emotion] = out.planned.get(emotion, 0) + 1
        if (emotion, prompt_id) in done:
            out.done[emotion] = out.done.get(emotion, 0) + 1
    out.rates, out.why_no_rate = measured_rates(results / "bestofn.duckdb")
    out.slots = box_slots(plan.config)
    out.per_slot = published_rate(results) if out.done else None
    out.per_slot = out.per_slot or doctor_rate(results)
    if out.per_slot is None and str(plan.config.get("device", "cpu")).startswith("cuda"):
        out.per_slot = documented_rate(gpu_model_names())
    if out.per_slot is None:
        out.why_no_wall = (
            f"no published group, no pilot ({results / DOCTOR_FILE}: run `bestofn doctor`) "
            "and no documented figure for this box's device"
        )
    return out


def _hours(h: float) -> str:
    return f"{h:,.2f}" if h < 100 else f"{h:,.0f}"


def _clock(hours: float) -> str:
    if hours >= 1:
        return f"{_hours(hours)} h"
    return f"{hours * 60:.1f} min" if hours * 60 >= 1 else f"{hours * 3600:.0f} s"


def format_report(r: Remaining, per_emotion_limit: int = 50) -> str:
    left = r.left
    more = f"({len(left) - per_emotion_limit:,} more)" if len(left) > per_emotion_limit else ""
    width = max([len("emotion"), len(more), *(len(e) for e in left)])
    lines = [f"{'emotion':<{width}}  {'planned':>9}  {'done':>9}  {'remaining':>9}"]
    rows = sorted(left, key=lambda e: (-left[e], e))
    for e in rows[:per_emotion_limit]:
        lines.append(f"{e:<{width}}  {r.planned[e]:>9,}  {r.done.get(e, 0):>9,}  {left[e]:>9,}")
    if len(rows) > per_emotion_limit:
        rest = rows[per_emotion_limit:]
        lines.append(
            f"{more:<{width}}  {sum(r.planned[e] for e in rest):>9,}  "
            f"{sum(r.done.get(e, 0) for e in rest):>9,}  {sum(left[e] for e in rest):>9,}"
        )
    planned, done = sum(r.planned.values()), sum(r.done.values())
    lines.append(f"{'total':<{width}}  {planned:>9,}  {done:>9,}  {r.groups_left:>9,}")
    lines.append("")
    clips = r.groups_left * r.takes
    lines.append(f"remaining: {r.groups_left:,} groups x {r.takes} takes = {clips:,} takes")
    if not r.rates:
        lines.append(f"estimate: none ({r.why_no_rate})")
    for rate in r.rates:
        unit = "GPU-hours" if rate.device.startswith("cuda") else f"{rate.device} worker-hours"
        lines.append(
            f"estimate: {_hours(r.hours_left(rate))} {unit} left at {rate.s_per_clip:.4f} s/take "
            f"(measured on {rate.device}: {rate.groups:,} groups, {rate.clips:,} takes; "
            "model loading not included)"
        )
    hours = r.wall_hours_left
    if hours is None:
        lines.append(f"wall-clock: none ({r.why_no_wall})")
    else:
        s = r.per_slot
        lines.append(
            f"wall-clock: {_clock(hours)} left at {r.slots} slot(s) working at once, "
            f"{s.s_per_take:.4f} s/take per slot (model loading not included)"
        )
        lines.append(f"  from the {s.source}: {s.detail}")
    return "\n".join(lines)
