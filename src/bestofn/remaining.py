"""`bestofn plan`: what remains to be generated, per emotion, and the GPU-hours it will take at
the throughput measured so far. Seconds at any size: no Snakemake DAG, no model.

- The groups come from the config and sheets (``bestofn.plan``, every check included).
- A group is done when its directory exists under ``results/groups`` (published atomically:
  complete or absent). Hidden staging/partial siblings do not count.
- The rate is the measured wall time per take (clip) of the finished groups in
  ``results/bestofn.duckdb`` (table ``throughput``), per device. Remaining takes x that rate
  = the worker-hours left; on GPUs, GPU-hours (one worker per GPU). Model loading is left out
  (once per worker or SLURM job).

Not counted: a finished group whose params changed since (a new text, N, seed, voice or models)
will run again; ``snakemake -n`` lists those too."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from bestofn.plan import Plan


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

    @property
    def left(self) -> dict[str, int]:
        return {e: n - self.done.get(e, 0) for e, n in self.planned.items()}

    @property
    def groups_left(self) -> int:
        return sum(self.left.values())

    def hours_left(self, rate: Rate) -> float:
        return self.groups_left * self.takes * rate.s_per_clip / 3600


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
    return out


def _hours(h: float) -> str:
    return f"{h:,.2f}" if h < 100 else f"{h:,.0f}"


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
    return "\n".join(lines)
