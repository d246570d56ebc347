"""What a group job runs with: the config's ``runtime:`` section (``Runtime``, every default
from the schema), the worker slots and their queue places (``SlotPool``: file locks in a
state directory), and where that directory is and how many GPU slots there are."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bestofn.schemas import runtime_defaults
from bestofn.worker.options import WorkerOptions

log = logging.getLogger("bestofn.client")


def default_state_dir(workdir: str | Path = ".") -> Path:
    """Short per-user, per-workflow directory for sockets and locks (paths max ~107 bytes).

    Node-local (/tmp). Inside a SLURM job it is also per job: two jobs of one workflow on one
    node each have their own GPU, so each starts and serves its own warm worker."""
    key = hashlib.sha256(str(Path(workdir).resolve()).encode()).hexdigest()[:10]
    job = os.environ.get("SLURM_JOB_ID")
    return Path(f"/tmp/bestofn-{os.getuid()}") / (f"{key}-slurm{job}" if job else key)


def detect_slots(device: str) -> int:
    """GPU slots: what CUDA_VISIBLE_DEVICES lists (SLURM sets it for a job's GRES), else the
    GPUs SLURM gave this job on this node, else every GPU of the box. One slot on a CPU."""
    if not device.startswith("cuda"):
        return 1
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return len([v for v in visible.split(",") if v.strip()])
    on_node = os.environ.get("SLURM_GPUS_ON_NODE", "")
    if on_node.isdigit() and int(on_node) > 0:
        return int(on_node)
    gpus = Path("/proc/driver/nvidia/gpus")
    return max(1, len(list(gpus.iterdir()))) if gpus.is_dir() else 1


_DEFAULT = runtime_defaults()  # written once, in the config schema


@dataclass
class Runtime:
    """Performance knobs from config['runtime'] (never group params). Every field and its
    default come from the config schema's ``runtime`` section."""

    worker: bool = _DEFAULT["worker"]
    slots: int | None = _DEFAULT["slots"]
    queue_depth: int = _DEFAULT["queue_depth"]
    idle_timeout_s: float = _DEFAULT["idle_timeout_s"]
    start_timeout_s: float = _DEFAULT["start_timeout_s"]
    state_dir: str | None = _DEFAULT["state_dir"]
    log_dir: str | None = _DEFAULT["log_dir"]
    gpu_memory_gb: float | None = _DEFAULT["gpu_memory_gb"]
    overlap: str = _DEFAULT["overlap"]
    speech_max_batch: int = _DEFAULT["speech_max_batch"]
    speech_batch_window_ms: float = _DEFAULT["speech_batch_window_ms"]
    parallel_load: bool = _DEFAULT["parallel_load"]
    cache_dir: str | None = _DEFAULT["cache_dir"]
    warm_up: bool | str = _DEFAULT["warm_up"]
    write_threads: int | None = _DEFAULT["write_threads"]
    experimental: dict = field(default_factory=lambda: dict(_DEFAULT["experimental"]))

    @classmethod
    def from_config(cls, runtime: dict | None) -> Runtime:
        runtime = dict(runtime or {})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(runtime) - known)
        if unknown:
            raise ValueError(f"config runtime: unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**runtime)

    def worker_options(self, results_dir: str | Path) -> WorkerOptions:
        """What a worker started for ``results_dir`` runs with (``cache_dir``: relative to it)."""
        cache = Path(results_dir) / Path(self.cache_dir).expanduser() if self.cache_dir else None
        return WorkerOptions.from_runtime(asdict(self), cache_dir=str(cache) if cache else None)


class SlotPool:
    def __init__(self, state_dir: Path, slots: int, queue_depth: int, device: str):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.dir, 0o700)
        if self.dir.parent.name.startswith("bestofn-"):  # /tmp/bestofn-UID: owner only too
            os.chmod(self.dir.parent, 0o700)
        self.slots, self.depth, self.device = slots, queue_depth, device

    def socket(self, slot: int) -> str:
        return str(self.dir / f"slot{slot}.sock")

    def pidfile(self, slot: int) -> Path:
        return self.dir / f"slot{slot}.pid"

    @contextlib.contextmanager
    def place(self, poll_s: float = 0.2):
        """Hold one free (slot, queue place) until the block exits; yields the slot."""
        waited = time.monotonic()
        while True:
            for j in range(self.depth):
                for k in range(self.slots):
                    f = open(self.dir / f"slot{k}.q{j}.lock", "a")
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        f.close()
                        continue
                    try:
                        yield k
                    finally:
                        fcntl.flock(f, fcntl.LOCK_UN)
                        f.close()
                    return
            if time.monotonic() - waited > 60:
                log.info("all %d x %d worker places busy; waiting", self.slots, self.depth)
                waited = time.monotonic()
            time.sleep(poll_s)

    @contextlib.contextmanager
    def starter(self, slot: int):
        """One process at a time may start or replace a slot's worker."""
        with open(self.dir / f"slot{slot}.start.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def cuda_visible(self, slot: int) -> str:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = (
            [v.strip() for v in visible.split(",")]
            if visible
            else [str(i) for i in range(self.slots)]
        )
        return ids[slot % len(ids)]
