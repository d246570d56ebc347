"""`bestofn status [--watch SECONDS]`: a run's progress a person can read, while it runs.

Read from the files the run writes, never from the database (the run's last rules write it):

- done: the published group directories (``bestofn.ops.cost.published_groups``), against the
  groups the config and sheets plan;
- takes/s: the published groups' ``scores.parquet`` modification times (the last file a group
  writes before it is published): takes of the groups finished in the last ``window_s``
  seconds over that window's span, so a run's pace now, not its average since it began;
- ETA: the takes left at that pace;
- running: a group log (``logs/groups/{emotion}/{prompt_id}.log``, rewritten at each attempt)
  of a group not yet published and without a failure in it;
- failed: a group log whose last attempt failed (its error line), not published since;
- quarantined: groups ``bestofn verify --quarantine`` moved aside (``quarantine/``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from bestofn.ops.cost import published_groups

FAILED_MARK = " failed"  # workflow_glue.run_group_rule logs "group E/P failed" on the way out
WINDOW_S = 600.0


@dataclass
class Status:
    planned: int
    takes: int
    done: int
    finished: list[float] = field(default_factory=list)  # scores.parquet mtimes, sorted
    running: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # group -> its last error line
    quarantined: int = 0
    now: float = 0.0

    @property
    def left(self) -> int:
        return self.planned - self.done

    def takes_per_s(self, window_s: float = WINDOW_S) -> float | None:
        recent = [t for t in self.finished if t >= self.now - window_s]
        if len(recent) < 2 or recent[-1] <= recent[0]:
            return None
        return (len(recent) - 1) * self.takes / (recent[-1] - recent[0])


def _last_error(log: Path) -> str | None:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    failed = [i for i, line in enumerate(lines) if FAILED_MARK in line and "group " in line]
    if not failed:
        return None
    errors = [ln for ln in lines[failed[-1] :] if "Error" in ln or "error" in ln]
    return (errors[-1] if errors else lines[failed[-1]]).strip()[-300:]


def read_status(plan, results: str | Path) -> Status:
    from bestofn.core.groupio import SCORES

    results = Path(results)
    done = published_groups(results) & set(plan.groups)
    st = Status(len(plan.groups), int(plan.config["takes"]), len(done), now=time.time())
    for emotion, prompt_id in done:
        try:
            st.finished.append((results / "groups" / emotion / prompt_id / SCORES).stat().st_mtime)
        except OSError:
            continue
    st.finished.sort()
    logs = results / "logs" / "groups"
    for emotion, prompt_id in sorted(set(plan.groups) - done):
        log = logs / emotion / f"{prompt_id}.log"
        if not log.is_file():
            continue
        error = _last_error(log)
        if error is None:
            st.running.append(f"{emotion}/{prompt_id}")
        else:
            st.failed[f"{emotion}/{prompt_id}"] = error
    quarantine = results / "quarantine"
    if quarantine.is_dir():
        st.quarantined = sum(
            1 for e in os.scandir(quarantine) if e.is_dir() for _ in os.scandir(e.path)
        )
    return st


def _duration(s: float) -> str:
    h, rest = divmod(int(s), 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def format_status(st: Status, window_s: float = WINDOW_S, listed: int = 10) -> str:
    pct = 100 * st.done / st.planned if st.planned else 100.0
    lines = [f"groups: {st.done:,} done, {st.left:,} left of {st.planned:,} ({pct:.1f} %)"]
    rate = st.takes_per_s(window_s)
    if st.left == 0:
        lines.append("eta: done")
    elif rate is None:
        lines.append(
            f"takes/s: none yet (fewer than 2 groups finished in the last {window_s:.0f} s)"
        )
    else:
        eta = st.left * st.takes / rate
        lines.append(f"takes/s: {rate:.2f} (groups finished in the last {window_s:.0f} s)")
        lines.append(f"eta: {_duration(eta)} for {st.left * st.takes:,} takes at that pace")
    lines.append(
        f"running: {len(st.running)}"
        + (f" ({', '.join(st.running[:listed])})" if st.running else "")
    )
    lines.append(f"failed: {len(st.failed)} (last attempt failed, not published)")
    for group, error in list(st.failed.items())[:listed]:
        lines.append(f"  {group}: {error}")
    if st.quarantined:
        lines.append(
            f"quarantined: {st.quarantined} (results/quarantine; the next run redoes them)"
        )
    return "\n".join(lines)


def watch(plan, results: str, every_s: float | None = None) -> int:
    """Print the status once, or every ``every_s`` seconds until no group is left; 1 while any
    group's last attempt failed."""
    while True:
        st = read_status(plan, results)
        print(time.strftime("%H:%M:%S"), format_status(st), sep="\n", flush=True)
        if not every_s or st.left == 0:
            return 1 if st.failed else 0
        time.sleep(every_s)
        print()
