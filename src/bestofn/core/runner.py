"""The one stage scheduler: how a group's stages run, and how consecutive groups overlap.

No transport here. The warm worker (``bestofn.worker.server``, behind its Unix socket), the
in-process group job (``run_group``), ``bestofn ab`` and ``bench pipeline`` all run groups
through a ``Runner``, so a benchmark measures the code the workflow runs.

A group goes through four stages (``bestofn.core.pipeline``: generate -> restore -> score ->
write). Each ``Stage`` declares what it needs: its device (``gpu``: it holds a gate, runs on
the phase's CUDA stream and is timed by CUDA events; ``host``: no CUDA call at all, so it may
run beside another thread's CUDA-graph capture), the batch size of its backend (takes per
call; reported, e.g. in the worker's ``/health``), and its setup and teardown.

``runtime.overlap`` (``OVERLAP_MODES``) groups the stages into phases, each behind its own
FIFO gate, so groups keep their arrival order in every phase:

    off   [generate, restore, score, write]           the whole group in the gate
    host  [generate, restore, score] [write]           the next group's GPU stages run while
                                                       one is written (scorers' text work too;
                                                       ``runtime.experimental.overlap``)
    full  [generate] [restore] [score] [write]         every GPU stage its own phase on its own
                                                       CUDA stream: generate a group while the
                                                       one before is restored and the one
                                                       before that scored

The results are the same in every mode (the same stages on the same inputs; the stages hand
each other host arrays, so no device tensor crosses a stream). Why restore and score are apart
under ``full``: a trace of the production set's steady state (``bench pipeline --profile``)
had the GPU idle for a good part of the time, the restore + score phase's span equal to the
whole group period, and its kernels under half that span: its host work (feature extraction,
copies, the decoders' host loops) was the bound, and a group's score can run while the next
one is restored (ledger figures workflow.profile.gpu_busy, workflow.profile.steady_s_per_clip).

Pairs: with a generator that pairs groups (moss-fast's runtime option ``pair_groups``), the
group that enters the generate phase takes the first group queued behind it (``run`` called,
its generate not started) whose ``pair_key`` is equal, and generates both in shared calls
(``generate_pair_stage``); the partner then finds its takes made when it reaches the phase.
With none queued, it waits for one while a group ahead is restored or scored (``overlap:
full``; at most ``PAIR_WAIT_S``), since groups reach a worker one at a time, and with none
ahead at most ``PAIR_IDLE_WAIT_S`` (a worker's first groups arrive a few ms apart). The
generator makes every call in one shape, so a group's takes are the same alone or paired; each
row names its partner (column ``paired_with``). A partner whose key cannot be made (e.g. its
reference voice does not load) is not paired, and fails on its own turn. Every stage error
is raised as ``GroupStageError`` naming the group and the stage; ``on_error`` sees it first,
inside the gate (the worker marks itself dying there on a fatal device error, before the gate
lets the next group in); ``admit`` runs on entering each GPU phase's gate and may refuse."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bestofn.core.pipeline import (
    Backends,
    GroupWork,
    generate_pair_stage,
    generate_stage,
    restore_stage,
    score_stage,
    write_stage,
)
from bestofn.util.spec import GroupSpec

# Pairing: how long a group may wait in the generate phase for a partner to arrive, at most,
# while a group ahead of it is restored or scored (the GPU has that work meanwhile). A new
# group reaches a worker when one leaves it, one at a time, so without waiting a group would
# mostly find the generate phase free and no partner queued.
PAIR_WAIT_S = 5.0
# ... and how long with no group ahead (the GPU idle), at most. A worker's first groups arrive
# a few ms apart (snakemake submits queue_depth jobs at once); a first group that starts alone
# shifts every later pair by one, so an even number of groups costs one pair-shape call more
# (ledger figure workflow.s_per_clip_per_gpu, whose note has those runs). A group with
# no partner coming pays this wait once.
PAIR_IDLE_WAIT_S = 0.25
# runtime.experimental.generate_priority -> the CUDA stream priority the generate phase runs at
# (lower is higher; -1 is the highest torch asks for on every GPU it supports)
STREAM_PRIORITY = {"normal": 0, "high": -1}
# How consecutive groups overlap (config ``runtime.overlap``; the schema holds the default).
# auto: full on CUDA (it ran through snakemake on two H200s), off elsewhere.
# host (config ``runtime.experimental.overlap``): the GPU stages in one phase, the write apart.
OVERLAP_MODES = ("auto", "off", "host", "full")


def resolve_overlap(mode: str | None, device: str) -> str:
    mode = (mode or "auto").strip().lower()
    if mode in ("on", "true", "1"):
        mode = "host"
    elif mode in ("false", "0", "none"):
        mode = "off"
    if mode not in OVERLAP_MODES:
        raise ValueError(f"runtime.overlap must be one of {', '.join(OVERLAP_MODES)}; got {mode!r}")
    if mode == "auto":
        return "full" if str(device).startswith("cuda") else "off"
    return mode


class FifoGate:
    """A lock that admits waiters in arrival order and counts them (the queue length)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def __enter__(self):
        with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._cond.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc):
        with self._cond:
            self._serving += 1
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        with self._cond:
            return max(0, self._next_ticket - self._serving - 1)

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._next_ticket > self._serving


class GroupStageError(RuntimeError):
    """A stage of a group failed; the message names the group and the stage, the cause is
    chained (``bestofn.worker.lifecycle.fatal_device_error`` looks through it)."""


@dataclass(eq=False)  # one job is one group's run: compared by identity
class GroupJob:
    """One group on its way through the stages: where it goes, and what the stages made."""

    spec: GroupSpec
    out: Path
    paths_relative_to: Path | None = None
    charged_load_s: float | None = None  # None: the runner's rule (``charge_load``)
    # the GPU's idle time before this group (worker_idle_s); None: the runner measures it
    idle_s: float | None = None
    work: GroupWork | None = None
    timings: dict = field(default_factory=dict)
    # pairing: the generator's pair key (computed once; None: this group runs alone)
    pair_key: object = field(default=None, compare=False)


@dataclass(frozen=True)
class Stage:
    """One step of every group: ``process(job)``, plus what it needs to run."""

    name: str
    process: Callable[[GroupJob], None]
    device: str = "gpu"  # gpu | host (host: no CUDA call)
    batch_size: int | None = None  # takes per call of its backend; None: the whole group
    setup: Callable[[], None] | None = None
    teardown: Callable[[], None] | None = None

    def describe(self) -> dict:
        return {"name": self.name, "device": self.device, "batch_size": self.batch_size}


@dataclass
class _Phase:
    gate: FifoGate
    stages: list[Stage]
    stream: object = None  # a torch.cuda.Stream, or None: the thread's current stream


def _backend_batch(*backends) -> int | None:
    sizes = [getattr(b, "batch_size", None) for b in backends]
    sizes = [int(s) for s in sizes if isinstance(s, int) and not isinstance(s, bool)]
    return max(sizes) if sizes else None


def _close(*backends) -> Callable[[], None]:
    def close():
        for b in backends:
            with contextlib.suppress(Exception):  # releasing is best effort
                b.close()

    return close


class Runner:
    """Runs groups through the pipeline's stages on loaded ``backends``; thread-safe: call
    ``run`` from one thread per group (up to the queue depth) and the gates order them.

    ``charge_load``: ``each`` charges the whole model load to every group (a group job that
    loaded its own models), ``first`` to the first group only (a warm worker).
    ``generate_priority``: the CUDA stream priority of generate (0: the current stream)."""

    def __init__(
        self,
        backends: Backends,
        device: str = "cpu",
        overlap: str | None = "off",
        *,
        flac_subtype: str = "PCM_16",
        write_threads: int | None = None,
        slot: int = -1,
        charge_load: str = "each",
        generate_priority: int = 0,
        admit: Callable[[], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ):
        if charge_load not in ("each", "first"):
            raise ValueError(f"charge_load must be each or first; got {charge_load!r}")
        self._backends = backends
        self.device = str(device)
        self.overlap = resolve_overlap(overlap, self.device)
        self.flac_subtype, self.slot, self.charge_load = flac_subtype, slot, charge_load
        self.write_threads = write_threads  # None: groupio.write_threads' default
        self.generate_priority = int(generate_priority)
        self.admit = admit or (lambda: None)
        self.on_error = on_error or (lambda e: None)
        self.stages = self._pipeline_stages()
        self.gate = FifoGate()  # the first phase's gate (speech renders take it too)
        self._restore_gate = FifoGate()  # overlap full: restore, then score, each its own phase
        self._score_gate = FifoGate()
        self._write_gate = FifoGate()  # groups are written in the order they were generated
        self._streams: dict[str, object] = {}
        self.lock = threading.Lock()
        self.groups_started = 0
        self.groups_done = 0
        self.gpu_stages = 0  # GPU stages running now (overlap: the GPU is idle at 0)
        self.gpu_free_at = time.monotonic()
        self.last_active = time.monotonic()  # end of the last stage (or of setup)
        self._set_up = False
        self._queued: list[GroupJob] = []  # run() called, generate not started (pairing)
        self.groups_paired = 0  # groups whose takes came from a shared generate call

    @property
    def backends(self) -> Backends:
        return self._backends

    @backends.setter
    def backends(self, backends: Backends) -> None:
        """Run on other loaded backends from the next group on (tests share one set)."""
        self._backends = backends
        self.stages = self._pipeline_stages()

    # ---- the stages ---------------------------------------------------------------------

    def _pipeline_stages(self) -> list[Stage]:
        b = self.backends
        defer = self.overlap != "off"  # scorers' host work finishes in the write stage

        def generate(job: GroupJob) -> None:
            with self.lock:
                if job in self._queued:
                    self._queued.remove(job)
            if job.work is not None:  # made beside the group that took it as its partner
                return
            partner = self._partner(job)
            if partner is None:
                job.work = generate_stage(job.spec, self.backends, self.device)
                return
            try:
                job.work, partner.work = generate_pair_stage(
                    [job.spec, partner.spec], self.backends, self.device
                )
            except BaseException:
                with self.lock:  # the partner generates on its own turn
                    partner.work = None
                raise
            with self.lock:
                self.groups_paired += 2

        def restore(job: GroupJob) -> None:
            restore_stage(job.work, self.backends)

        def score(job: GroupJob) -> None:
            score_stage(job.work, self.backends, defer)

        def write(job: GroupJob) -> None:
            job.timings = write_stage(
                job.work,
                self.backends,
                job.out,
                flac_subtype=self.flac_subtype,
                charged_load_s=job.charged_load_s,
                worker_idle_s=job.idle_s,
                worker_slot=self.slot,
                paths_relative_to=job.paths_relative_to,
                overlap=self.overlap,
                write_threads=self.write_threads,
            )

        return [
            Stage("generate", generate, "gpu", _backend_batch(b.generator),
                  teardown=_close(b.generator)),
            Stage("restore", restore, "gpu", _backend_batch(b.restorer),
                  teardown=_close(b.restorer)),
            Stage("score", score, "gpu", _backend_batch(*b.scorers), teardown=_close(*b.scorers)),
            Stage("write", write, "host"),
        ]  # fmt: skip

    def _phases(self) -> list[_Phase]:
        gen, restore, score, write = self.stages
        gen_stream = self._streams.get("generate")
        if self.overlap == "off":
            return [_Phase(self.gate, [gen, restore, score, write], gen_stream)]
        if self.overlap == "host":
            return [_Phase(self.gate, [gen, restore, score], gen_stream),
                    _Phase(self._write_gate, [write])]  # fmt: skip
        return [_Phase(self.gate, [gen], gen_stream),
                _Phase(self._restore_gate, [restore], self._streams.get("restore")),
                _Phase(self._score_gate, [score], self._streams.get("score")),
                _Phase(self._write_gate, [write])]  # fmt: skip

    def describe(self) -> dict:
        return {"overlap": self.overlap, "pairs": self.pairs,
                "stages": [s.describe() for s in self.stages]}  # fmt: skip

    # ---- pairs --------------------------------------------------------------------------

    @property
    def pairs(self) -> bool:
        """The generator may run two queued groups in one call (runtime option pair_groups)."""
        return bool(getattr(self.backends.generator, "pairs_groups", False))

    def _key(self, job: GroupJob):
        if job.pair_key is None:
            try:  # builds the prompt (a reference voice is encoded once, then cached)
                key = self.backends.generator.pair_key(job.spec)
            except Exception:  # not paired; the group's own generate says what is wrong
                key = None
            job.pair_key = ("alone",) if key is None else ("pair", key)
        return job.pair_key[1] if job.pair_key[0] == "pair" else None

    def _partner(self, job: GroupJob) -> GroupJob | None:
        """The first queued group with ``job``'s pair key, taken out of the queue (None: none,
        or pairing is off). Called in the generate phase, so no other generate runs."""
        if not self.pairs or (key := self._key(job)) is None:
            return None
        start = time.monotonic()
        while True:
            with self.lock:
                waiting = [j for j in self._queued if j.work is None]
            for other in waiting:
                if self._key(other) == key:
                    with self.lock:
                        if other in self._queued and other.work is None:
                            self._queued.remove(other)
                            return other
            # wait while a group ahead is restored or scored (the GPU is busy with it), and
            # briefly when the GPU is idle (a partner may be a few ms behind)
            ahead = self._restore_gate.busy or self._score_gate.busy
            waited = time.monotonic() - start
            if waited > (PAIR_WAIT_S if ahead else PAIR_IDLE_WAIT_S):
                return None
            time.sleep(0.005)

    # ---- lifecycle ----------------------------------------------------------------------

    def setup(self) -> Runner:
        """Once, before the first group: the stages' setup, then (CUDA) the weights in place
        before any other stream reads them, and the streams the phases run on."""
        if self._set_up:
            return self
        for stage in self.stages:
            if stage.setup is not None:
                stage.setup()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)
            if self.overlap == "full":
                self._streams["restore"] = torch.cuda.Stream(self.device)
                self._streams["score"] = torch.cuda.Stream(self.device)
            if self.generate_priority:
                self._streams["generate"] = torch.cuda.Stream(
                    self.device, priority=self.generate_priority
                )
        self._set_up = True
        self.last_active = self.gpu_free_at = time.monotonic()
        return self

    def teardown(self) -> None:
        """Release every stage's backend (best effort: the numbers are already taken)."""
        for stage in self.stages:
            if stage.teardown is not None:
                stage.teardown()

    # ---- running groups -----------------------------------------------------------------

    def run(self, job: GroupJob) -> dict:
        """Run one group through every phase; returns its stage timings."""
        self.setup()
        if self.pairs:
            with self.lock:
                self._queued.append(job)
        try:
            self._run_phases(job)
        finally:
            with self.lock:  # a group that failed before its generate is no one's partner
                if job in self._queued:
                    self._queued.remove(job)
        with self.lock:
            self.groups_done += 1
        return job.timings

    def _run_phases(self, job: GroupJob) -> None:
        for k, phase in enumerate(self._phases()):
            gpu = any(s.device == "gpu" for s in phase.stages)
            with phase.gate, self._on_stream(phase.stream):
                if gpu:
                    self.admit()  # e.g. queued behind the group that broke the device
                if k == 0:
                    self._admitted(job)
                for stage in phase.stages:
                    with self._stage(job.spec, stage):
                        stage.process(job)

    def _admitted(self, job: GroupJob) -> None:
        """At the first gate: the GPU's idle time before this group, and its load charge."""
        now = time.monotonic()
        with self.lock:
            if job.idle_s is None and self.overlap == "off":
                job.idle_s = now - self.last_active
            elif job.idle_s is None:  # the GPU's own idle time: 0 while another group's stage runs
                job.idle_s = 0.0 if self.gpu_stages else now - self.gpu_free_at
            first = self.groups_started == 0
            self.groups_started += 1
        if job.charged_load_s is None and self.charge_load == "first":
            job.charged_load_s = self.backends.load_s if first else 0.0

    @staticmethod
    def _on_stream(stream):
        if stream is None:
            return contextlib.nullcontext()
        import torch

        return torch.cuda.stream(stream)

    @contextlib.contextmanager
    def _stage(self, spec: GroupSpec, stage: Stage):
        gpu = stage.device == "gpu"
        if gpu:
            with self.lock:
                self.gpu_stages += 1
        try:
            try:
                yield
            except Exception as e:
                error = GroupStageError(
                    f"group {spec.group_id}: {stage.name} failed: {type(e).__name__}: {e}"
                )
                error.__cause__ = e  # set before on_error: it looks through the cause
                if gpu:
                    self.on_error(error)  # still inside the gate
                raise error from e
        finally:
            now = time.monotonic()
            with self.lock:
                if gpu:
                    self.gpu_stages -= 1
                    self.gpu_free_at = now
                self.last_active = max(self.last_active, now)

    def touch(self) -> None:
        """Something else used the device (a speech render): idle time starts again now."""
        with self.lock:
            self.last_active = max(self.last_active, time.monotonic())


def run_group(
    spec: GroupSpec,
    backends: Backends,
    group_dir: Path,
    *,
    flac_subtype: str = "PCM_16",
    charged_load_s: float | None = None,
    worker_idle_s: float = 0.0,
    device: str = "cpu",
    worker_slot: int = -1,
    paths_relative_to: Path | None = None,
    write_threads: int | None = None,
) -> dict:
    """Generate, restore, score and atomically write one group in this process (the group job
    without a worker); returns its stage timings. One group, every stage in turn (overlap
    ``off``; a warm worker may overlap groups instead, with the same results).

    ``charged_load_s`` is the model-load time attributed to this group (default: the whole
    load, as the group's own process loaded the models). ``flac_path`` is recorded relative
    to ``paths_relative_to`` (the workflow's working directory; default: this process's)."""
    runner = Runner(
        backends, device, "off", flac_subtype=flac_subtype, write_threads=write_threads,
        slot=worker_slot,
    )  # fmt: skip
    load = backends.load_s if charged_load_s is None else charged_load_s
    return runner.run(GroupJob(spec, Path(group_dir), paths_relative_to, load, worker_idle_s))
