"""One side of `bestofn ab`: its models loaded, its groups run into a working directory, its
speed and peak memory measured, its models released; ``run_side_process`` does it in a spawned
process of its own, so nothing one side leaves reaches the other's figures (bestofn.ops.ab says
why). The side's errors come back to the command as ABError (bad input) or ABSideError."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import queue
import resource
import sys
import time
import traceback
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


class ABError(ValueError):
    """Bad input to `bestofn ab` (thresholds file, configs), found before any model loads."""


class ABSideError(RuntimeError):
    """A side failed while it loaded or ran its groups (in its own process): the message names
    the side and carries that process's traceback."""


# ---- memory -------------------------------------------------------------------------------


class PeakMemory:
    """Peak memory of one side: CUDA allocated bytes on a GPU device, else the process's peak
    resident set (Linux: reset through /proc/self/clear_refs so each side has its own peak;
    elsewhere the process lifetime's, which the note says)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.note = ""

    def reset(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
        except OSError:
            self.note = "process-lifetime peak RSS (could not reset it between sides)"

    def peak_gib(self) -> float:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**30
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 2**30
        except OSError:
            pass
        scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**30

    @property
    def metric(self) -> str:
        return "peak_cuda_allocated_gib" if self.cuda else "peak_rss_gib"


# ---- running one side ---------------------------------------------------------------------


def run_side(
    label: str, models: dict, specs, device: str, workdir: Path, log=print, check=None,
    warmup: int = 1,
) -> dict:  # fmt: skip
    """Load ``models``, run every spec into ``workdir``, release the models. Returns speed and
    memory numbers and the takes' table (every group's parquet). ``check(backends)`` runs
    after the load, before the first group. ``warmup`` untimed runs of the first group come
    first: a generator's first call compiles and captures CUDA graphs (moss-fast), which is
    load cost, not per-clip cost."""
    from bestofn.core.pipeline import load_backends
    from bestofn.core.runner import GroupJob, Runner

    mem = PeakMemory(device)
    gc.collect()
    mem.reset()
    t0 = time.perf_counter()
    backends = load_backends(models, device)
    # the group job's in-process scheduling (bestofn.core.runner.run_group): one group at a time
    runner = Runner(backends, device, "off")
    stages = {"generate_s": 0.0, "restore_s": 0.0, "score_s": 0.0, "write_s": 0.0, "wall_s": 0.0}
    tables = []
    log(f"ab {label}: models loaded in {backends.load_s:.1f} s (process {os.getpid()})")
    try:
        if check is not None:
            check(backends)
        for i in range(warmup if specs else 0):
            spec = specs[0]
            warm = workdir / "warmup" / str(i) / spec.emotion / spec.prompt_id
            t = runner.run(GroupJob(spec, warm, workdir, idle_s=0.0))
            log(f"ab {label}: warm-up {spec.group_id} {t['wall_s']:.2f} s (not timed)")
        decode_before = getattr(backends.generator, "decode_s", None)
        for spec in specs:
            group_dir = workdir / "groups" / spec.emotion / spec.prompt_id
            t = runner.run(GroupJob(spec, group_dir, workdir, idle_s=0.0))
            for k in stages:
                stages[k] += t.get(k, 0.0)
            tables.append(pq.read_table(group_dir / "scores.parquet"))
            log(f"ab {label}: {spec.group_id} {t['wall_s']:.2f} s")
        total_s = time.perf_counter() - t0
        decode_s = None
        if decode_before is not None:
            decode_s = backends.generator.decode_s - decode_before
        peak = mem.peak_gib()
        provenance = backends.provenance
        load_s = backends.load_s
    finally:
        runner.teardown()  # every stage's backend released before the other side loads
        del backends, runner
        gc.collect()
        if device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
    clips = sum(t.num_rows for t in tables)
    out = {f"{k}_per_clip": v / clips for k, v in stages.items()}
    out["decode_s_per_clip"] = None if decode_s is None else decode_s / clips
    out.update(
        {
            "load_s": load_s,
            "total_s": total_s,
            "clips": clips,
            mem.metric: peak,
            "mem_note": mem.note,
            "provenance": provenance,
            "takes": pa.concat_tables(tables, promote_options="default"),
        }
    )
    return out


def _side_main(reports, label, models, specs, device, workdir, check, warmup) -> None:
    """The side's process: run it, send its log lines and then its result (or its error)."""

    def log(msg) -> None:
        reports.put(("log", str(msg)))

    try:
        out = run_side(label, models, specs, device, workdir, log, check, warmup)
        # pickled here, not in the queue's feeder thread, so a result that cannot travel is an
        # error the parent hears about
        reports.put(("done", pickle.dumps(out)))
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        message = str(e) if isinstance(e, ABError) else f"{type(e).__name__}: {e}"
        reports.put(("error", (isinstance(e, ABError), message, traceback.format_exc())))


def run_side_process(
    label: str, models: dict, specs, device: str, workdir: Path, log=print,
    check=None, warmup: int = 1,
) -> dict:  # fmt: skip
    """``run_side`` in a spawned process of its own; its log lines come back through ``log``
    as they are written. A side that fails raises ABError (bad input) or ABSideError; a process
    that dies without a word (killed, out of memory) raises ABSideError with its exit code."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no CUDA state, no forks
    reports = ctx.Queue()
    proc = ctx.Process(
        target=_side_main, name=f"bestofn-ab-{label}",
        args=(reports, label, models, specs, device, Path(workdir), check, warmup),
    )  # fmt: skip
    proc.start()
    try:
        while True:
            try:
                kind, payload = reports.get(timeout=1.0)
            except queue.Empty:
                if proc.is_alive():
                    continue
                try:  # it may have reported just before it exited
                    kind, payload = reports.get(timeout=5.0)
                except queue.Empty:
                    raise ABSideError(
                        f"side {label}: its process exited with code {proc.exitcode} before it "
                        "reported (killed? out of memory?)"
                    ) from None
            if kind == "log":
                log(payload)
            elif kind == "done":
                return pickle.loads(payload)
            else:
                bad_input, message, trace = payload
                if bad_input:
                    raise ABError(message)
                raise ABSideError(f"side {label} failed: {message}\n{trace.rstrip()}")
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
            proc.join()
        reports.close()
