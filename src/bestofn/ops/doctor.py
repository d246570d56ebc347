"""`bestofn doctor`: is this box ready for the config's run? One verdict per check (ok, warn,
fail, or skipped with the reason), then one real group per slot through the product's own run
path (``workflow_glue.run_group_job``: the warm worker, as a group job runs it), timed.

- torch's CUDA build against the driver's CUDA version (the driver's ``cuDriverGetVersion``).
  NVIDIA's CUDA Compatibility guide ("Minor Version Compatibility",
  https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html): from
  CUDA 11 on, a build of one major release runs on any driver of that major release, with a
  limited feature set where the driver's minor is older (warn); an older major fails.
- each GPU's free memory against the config's need: a measured peak (what the generator's
  class declares, ``measured_gpu_memory``), or the config's own cap ``runtime.gpu_memory_gb``.
- free disk under ``results`` against the run's estimated output (output_estimate: its
  assumptions are named; the pilot then measures the bytes per take).
- the weights lock (``bestofn.weights.lock.check_config``).
- the pilot: one group per slot at once, timed, written to ``{results}/doctor/pilot/`` (never
  under ``results/groups``: it is no published group), its timing to ``{results}/doctor.json``
  where ``bestofn plan`` reads it. The workers it started stay warm for the run that follows
  (they exit after ``runtime.idle_timeout_s``; ``bestofn workers stop`` ends them).

Exit status 1 when any check fails."""

from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bestofn.ops.cost import DOCTOR_FILE, box_slots, published_groups
from bestofn.workflow_glue import run_group_job

PILOT_DIR = "doctor/pilot"  # under the results directory

# Disk estimate before any take exists. Assumptions, each named in the check's line:
WORDS_PER_S = 2.5  # speaking rate of read speech; an assumption, not measured here
FLAC_RATIO = 0.6  # FLAC size / PCM size for speech; an assumption, the pilot measures it
CHANNELS = 1  # the restorers' output is mono; the pilot measures it
BYTES_PER_SAMPLE = {"PCM_16": 2, "PCM_24": 3, "PCM_S8": 1, "PCM_U8": 1}
GIB = 2**30


@dataclass
class Check:
    name: str
    verdict: str  # ok | warn | fail | skipped
    detail: str

    def line(self) -> str:
        return f"{self.verdict:<8} {self.name}: {self.detail}"


def _version(v: int) -> tuple[int, int]:
    return v // 1000, (v % 1000) // 10  # CUDA's encoding: 12040 -> 12.4


def driver_cuda_version() -> tuple[int, int] | None:
    """The CUDA version the installed driver supports (libcuda's cuDriverGetVersion)."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    out = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(out)) != 0 or out.value <= 0:
        return None
    return _version(out.value)


def cuda_build_check(device: str) -> Check:
    import torch

    name = "torch CUDA build vs driver"
    if not device.startswith("cuda"):
        return Check(name, "skipped", f"no CUDA device: the config's device is {device!r}")
    built = torch.version.cuda
    driver = driver_cuda_version()
    if built is None:
        return Check(name, "fail", f"torch {torch.__version__} is a CPU build; the config's "
                     "device is cuda (make install TORCH=<your CUDA build of torch>)")  # fmt: skip
    if driver is None:
        return Check(name, "fail", f"torch is built for CUDA {built} but no NVIDIA driver "
                     "answers (libcuda.so.1 not found or failing)")  # fmt: skip
    want = tuple(int(x) for x in built.split(".")[:2])
    have = (
        f"torch {torch.__version__} built for CUDA {built}; driver supports {driver[0]}.{driver[1]}"
    )
    if driver >= want:
        verdict = "ok"
    elif driver[0] == want[0]:
        verdict, have = "warn", have + " (same major: minor version compatibility, fewer features)"
    else:
        verdict, have = "fail", have + ": upgrade the driver or install torch for your CUDA"
    if verdict != "fail" and not torch.cuda.is_available():
        verdict, have = "fail", have + ", yet torch.cuda.is_available() is False"
    return Check(name, verdict, have)


def memory_need(config: dict) -> tuple[float, str] | None:
    """GiB one slot's worker needs, and where the figure comes from; None: no figure."""
    cap = (config.get("runtime") or {}).get("gpu_memory_gb")
    if cap:
        return float(cap), "the config's cap runtime.gpu_memory_gb"
    from bestofn.backends.registry import backend_class

    gen = config["models"]["generator"]
    return backend_class("generator", gen["backend"]).measured_gpu_memory(gen)


def gpu_memory_checks(config: dict, slots: int) -> list[Check]:
    import torch

    if not config.get("device", "cpu").startswith("cuda") or not torch.cuda.is_available():
        return [Check("GPU memory", "skipped", "no CUDA device")]
    need = memory_need(config)
    checks = []
    for i in range(min(slots, torch.cuda.device_count())):
        free, total = torch.cuda.mem_get_info(i)
        gpu = f"cuda:{i} {torch.cuda.get_device_name(i)}"
        have = f"{free / GIB:.1f} of {total / GIB:.1f} GiB free"
        if need is None:
            checks.append(Check(f"GPU memory {gpu}", "warn", f"{have}; no measured figure for "
                                "this generator: set runtime.gpu_memory_gb to check"))  # fmt: skip
            continue
        gib, source = need
        verdict = "ok" if free / GIB >= gib else "fail"
        checks.append(Check(f"GPU memory {gpu}", verdict, f"{have}, need {gib:.1f} GiB ({source})"))
    return checks


def _flac_bytes_per_sample(subtype: str) -> int:
    return BYTES_PER_SAMPLE.get(subtype, 3)


def output_rate(config: dict) -> tuple[int, str]:
    """The takes' sample rate as the restorer states it without loading, else 48 kHz assumed."""
    from bestofn.backends.registry import backend_class

    restorer = config["models"].get("restorer")
    if restorer:
        rate = (restorer.get("options") or {}).get("sample_rate")
        if rate:
            return int(rate), "the restorer's sample_rate option"
        rate = getattr(backend_class("restorer", restorer["backend"]), "output_sample_rate", None)
        if isinstance(rate, int):
            return rate, f"{restorer['backend']}'s output rate"
    return 48000, "assumed: no restorer states its rate before it loads"


def output_estimate(plan, groups_left: list) -> tuple[float, str]:
    """Bytes the groups left will write, and the formula with its assumptions."""
    cfg = plan.config
    words = sum(len(plan.groups[g].text.split()) * plan.groups[g].n_takes for g in groups_left)
    rate, rate_from = output_rate(cfg)
    bps = _flac_bytes_per_sample(cfg["flac_subtype"])
    seconds = words / WORDS_PER_S
    nbytes = seconds * rate * CHANNELS * bps * FLAC_RATIO
    how = (
        f"{words:,} words of takes / {WORDS_PER_S} words/s (assumed) = {seconds / 3600:,.1f} h "
        f"of audio x {rate} Hz ({rate_from}) x {CHANNELS} channel (assumed) x {bps} bytes "
        f"({cfg['flac_subtype']}) x FLAC ratio {FLAC_RATIO} (assumed)"
    )
    return nbytes, how


def _free_bytes(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def _size(n: float) -> str:
    return f"{n / GIB:,.1f} GiB" if n >= GIB else f"{n / 2**20:,.1f} MiB"


def disk_check(results: Path, need: float, how: str, name: str = "disk") -> Check:
    free = _free_bytes(results)
    verdict = "ok" if free >= need * 1.1 else ("warn" if free >= need else "fail")
    return Check(
        name, verdict, f"{_size(free)} free under {results}, the run needs about "
        f"{_size(need)} ({how}); ok from 10 % to spare",
    )  # fmt: skip


def weights_check(config: dict, base: Path) -> Check:
    try:
        from bestofn.weights.lock import check_config
    except ImportError as e:
        return Check("weights lock", "skipped", f"the weights lock check is not installed ({e})")
    problems = check_config(config, base)
    if problems:
        return Check("weights lock", "fail", "; ".join(problems))
    return Check("weights lock", "ok", "every locked file has its size and sha256")


def run_pilot(plan, results: Path, slots: int) -> tuple[Check, dict | None]:
    """One group per slot at once, through the product's own group path, timed."""
    cfg = plan.config
    keys = sorted(plan.groups)
    if not keys:
        return Check("pilot", "skipped", "the plan has no group"), None
    root = results / PILOT_DIR
    shutil.rmtree(root, ignore_errors=True)
    models = json.dumps(cfg["models"])
    answers: dict[int, dict] = {}

    def one(i: int) -> None:
        emotion, prompt_id = keys[i % len(keys)]
        out = root / str(i) / emotion / prompt_id
        out.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        try:
            timings = run_group_job(
                plan.group_params(emotion, prompt_id), models, out, device=cfg["device"],
                flac_subtype=cfg["flac_subtype"], runtime=cfg.get("runtime"),
                results_dir=str(results),
            )  # fmt: skip
        except Exception as e:  # every failure is the check's verdict, named
            answers[i] = {"group": f"{emotion}/{prompt_id}", "error": str(e)}
            return
        flacs = list((out / "takes").glob("*.flac"))
        answers[i] = {
            "group": f"{emotion}/{prompt_id}",
            "takes": plan.groups[(emotion, prompt_id)].n_takes,
            "wall_s": float(timings.get("wall_s", 0.0)),
            "request_s": time.perf_counter() - t0,  # with the worker's start and load
            "flac_bytes": sum(f.stat().st_size for f in flacs),
            "out": str(out),
        }

    threads = [threading.Thread(target=one, args=(i,)) for i in range(slots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runs = [answers[i] for i in range(slots)]
    failed = [r for r in runs if "error" in r]
    if failed:
        return Check(
            "pilot", "fail", "; ".join(f"{r['group']}: {r['error']}" for r in failed)
        ), None
    takes = sum(r["takes"] for r in runs)
    pilot = {
        "groups": len(runs), "takes": takes, "wall_s": sum(r["wall_s"] for r in runs),
        "device": cfg["device"], "flac_bytes": sum(r["flac_bytes"] for r in runs), "runs": runs,
    }  # fmt: skip
    detail = (
        f"{len(runs)} group(s) of {runs[0]['takes']} takes, one per slot: "
        f"{pilot['wall_s'] / takes:.4f} s/take per slot (group work), first answer after "
        f"{max(r['request_s'] for r in runs):.1f} s with the worker's start; in {root}"
    )
    return Check("pilot", "ok", detail), pilot


def doctor(plan, base: Path, pilot: bool = True) -> tuple[list[Check], dict]:
    cfg = plan.config
    results = base / cfg["results"]
    slots = box_slots(cfg)
    checks = [cuda_build_check(cfg["device"]), *gpu_memory_checks(cfg, slots)]
    done = published_groups(results)
    left = [g for g in sorted(plan.groups) if g not in done]
    need, how = output_estimate(plan, left)
    checks.append(disk_check(results, need, how))
    checks.append(weights_check(cfg, base))
    record: dict = {"created": datetime.now(UTC).isoformat(), "slots": slots, "pilot": None}
    if not pilot:
        checks.append(Check("pilot", "skipped", "--no-pilot"))
    elif any(c.verdict == "fail" for c in checks):
        checks.append(Check("pilot", "skipped", "a check above failed"))
    else:
        check, record["pilot"] = run_pilot(plan, results, slots)
        checks.append(check)
        p = record["pilot"]
        if p:
            takes_left = sum(plan.groups[g].n_takes for g in left)
            per_take = p["flac_bytes"] / p["takes"]
            how = f"{takes_left:,} takes x {per_take / 1024:,.1f} KiB, the pilot's FLAC bytes/take"
            checks.append(disk_check(results, per_take * takes_left, how, name="disk (pilot)"))
    record["checks"] = [c.__dict__ for c in checks]
    results.mkdir(parents=True, exist_ok=True)
    (results / DOCTOR_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return checks, record


def report(plan, base: str | Path = ".", pilot: bool = True) -> int:
    """Run the checks, print a verdict per check and the doctor's own; 1 on any failure."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    base = Path(base)
    checks, _ = doctor(plan, base, pilot=pilot)
    for c in checks:
        print(c.line())
    failed = [c.name for c in checks if c.verdict == "fail"]
    results = base / plan.config["results"]
    print(f"doctor: {'FAIL: ' + ', '.join(failed) if failed else 'ready'} "
          f"(record: {results / DOCTOR_FILE})")  # fmt: skip
    return 1 if failed else 0
