"""Two costs of Snakemake's planning that grow with the number of jobs but need not.

1. A per-job cost that is the same for every job, computed once:

While planning, Snakemake 9 evaluates every resource and every input/params function of every
job through ``apply_input_function``, which asks ``inspect.signature`` of the callable two or
three times per call: about ten signatures per group job, the same few functions each time
(``Resource.evaluate`` and the workflow's params function), a visible share of a dry run
(py-spy; ledger figure planning.dry_run_16k). A function's signature does not change, so
``snakemake.common.get_function_params`` gets a cache in front of it:

- bound methods are cached by their function (the signature without ``self`` is the same for
  every instance), other callables by themselves; both weakly, so nothing is kept alive;
- a callable carrying Snakemake's own override (``_overwrite_params``) is answered from it, as
  Snakemake does, before any cache;
- anything not weak-referenceable or unhashable is passed through uncached.

2. The garbage collector's passes over the growing job graph: see tune_gc.

``install()`` is called from workflow/rules/common.smk. It does nothing when Snakemake's
function is not the one this was written against, or when BESTOFN_NO_SNAKEMAKE_SPEEDUPS is set
(the before/after benchmark sets it); BESTOFN_NO_SNAKEMAKE_JOB_PATCHES leaves out only part 3,
and BESTOFN_SNAKEMAKE_PATCHES_SKIP=name,name leaves out the named patches of part 3.

3. Per-job work of the dry run that gives the same answer for every job of a rule, or that no
   one reads: see install_job_patches (job_patches.py). Each patch checks the shape of the
   Snakemake function it replaces and leaves Snakemake's own in place (with a debug line)
   where it differs.

4. The interpreter's teardown after a dry run: see install_fast_exit.

5. Not a patch: the SLURM feeder (bestofn.worker.client.slurm_feeder) reads a job's bundle from the
   ``--target-jobs`` of the job's Snakemake command line; target_jobs_cli_shape checks that the
   executor interface still writes it so.

6. The rate limiter's timer at the end of a run: see install_daemon_reevaluation.

Every guard was checked on the versions in VERIFIED_ON, which pyproject.toml pins exactly;
tests/workflow/test_snakemake_speedups.py fails, naming the guard, when one does not match them."""

from __future__ import annotations

import gc
import os
import weakref

from bestofn.snakemake_speedups.job_patches import (
    APPLIED,
    _debug,
    _source,
    install_job_patches,
)

OVERRIDE = "_overwrite_params"  # snakemake.common.FUNC_OVERWRITE_PARAMS_ATTR

# The distributions whose internals the guards below read, at the versions they were checked on
# (pinned exactly in pyproject.toml; a newer release may turn a patch off, or on, silently).
VERIFIED_ON = {"snakemake": "9.27.1", "snakemake-interface-executor-plugins": "9.4.0"}


def cached(original):
    """``original`` (Snakemake's get_function_params) with a signature cache in front."""
    plain: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    methods: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get_function_params(func):
        if hasattr(func, OVERRIDE):
            return getattr(func, OVERRIDE)
        inner = getattr(func, "__func__", None)
        if inner is not None and getattr(func, "__self__", None) is not None:
            table, key = methods, inner
        else:
            table, key = plain, func
        try:
            return table[key]
        except (KeyError, TypeError):
            pass
        params = original(func)
        try:
            table[key] = params
        except TypeError:  # not weak-referenceable: answered, not cached
            pass
        return params

    get_function_params.bestofn_cached = True
    get_function_params.original = original
    return get_function_params


def tune_gc() -> None:
    """Fewer cyclic-garbage passes while Snakemake builds a DAG of 100k jobs.

    Building the DAG allocates millions of small objects; with Python's default thresholds
    (700, 10, 10) the collector walks the growing job graph again and again: 20-25 % of a dry
    run at 16,000 groups, and no cycle is freed by it (peak memory is the same with the
    collector off). Everything the Snakefile has loaded so far is long-lived: frozen out of
    the collector's view. Collections still run, just 300x less often in the youngest
    generation, so a ten-hour run's memory stays bounded."""
    gc.freeze()
    gc.set_threshold(200_000, 100, 1000)


def install(workflow=None) -> bool:
    """Put the cache in front of Snakemake's get_function_params, tune the garbage collector
    (tune_gc), install the per-job patches (install_job_patches), given the workflow the fast
    exit after a dry run (install_fast_exit), and the daemon re-evaluation timer
    (install_daemon_reevaluation); True if the cache is in place."""
    if os.environ.get("BESTOFN_NO_SNAKEMAKE_SPEEDUPS"):
        return False
    tune_gc()
    if not os.environ.get("BESTOFN_NO_SNAKEMAKE_JOB_PATCHES"):
        install_job_patches()
    if workflow is not None:
        install_fast_exit(workflow)
    install_daemon_reevaluation()
    try:
        import snakemake.common as common
        import snakemake.jobs as jobs
        import snakemake.rules as rules
    except ImportError:
        return False
    original = getattr(common, "get_function_params", None)
    if getattr(original, "bestofn_cached", False):
        return True
    if (
        original is None
        or getattr(common, "FUNC_OVERWRITE_PARAMS_ATTR", None) != OVERRIDE
        or any(getattr(m, "get_function_params", None) is not original for m in (rules, jobs))
    ):
        return False  # not the Snakemake this was written against: leave it alone
    fast = cached(original)
    for module in (common, rules, jobs):
        module.get_function_params = fast
    return True


# --- 4. The interpreter's teardown after a dry run ------------------------------------------


class FastExitSys:
    """``sys`` as ``snakemake.cli`` sees it, but for ``exit``: after a dry run, Snakemake's
    ``main`` ends with ``sys.exit(0 or 1)`` and the interpreter then frees the whole job graph
    object by object (1.5 s of a 16,000-group dry run, about 8 % of it; more at 100,000) only to
    end the process. Here the exit does what the interpreter does at exit that anyone can
    observe, in its order: wait for non-daemon threads (``threading._shutdown``), run the
    ``atexit`` functions (``logging.shutdown`` flushes and closes every log handler; weakref
    finalizers), flush stdout and stderr; then ``os._exit`` with the same status, skipping only
    the freeing. Only when all of this holds, else ``sys.exit`` as before:

    - the workflow was a dry run (nothing was written that a destructor might still flush);
    - the process is Snakemake's own command (its ``__main__`` is the ``snakemake`` script or
      ``python -m snakemake``): an in-process caller of ``snakemake.cli.main``, such as a test
      catching SystemExit, keeps its interpreter;
    - this is the main thread and the status is None or an int."""

    def __init__(self, real, workflow):
        self._real = real
        self.workflow = workflow

    def __getattr__(self, name):
        return getattr(self._real, name)

    def exit(self, status=None):
        if self._may_skip_teardown(status):
            _exit_now(status)
        return self._real.exit(status)

    def _may_skip_teardown(self, status) -> bool:
        import threading

        try:
            dryrun = bool(self.workflow.dryrun)
        except Exception:  # noqa: BLE001 - unknown: keep the plain exit
            return False
        return (
            dryrun
            and (status is None or type(status) is int)
            and threading.current_thread() is threading.main_thread()
            and _is_snakemake_command(self._real.modules.get("__main__"))
        )


def _is_snakemake_command(main_module) -> bool:
    import snakemake.cli as cli

    spec = getattr(main_module, "__spec__", None)
    if spec is not None and spec.name == "snakemake.__main__":
        return True
    return getattr(main_module, "main", None) is cli.main


def _exit_now(status) -> None:
    import atexit
    import sys
    import threading

    code = status or 0
    try:
        threading._shutdown()  # what the interpreter calls first at exit
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except BaseException:  # noqa: BLE001 - anything odd: the interpreter's own exit after all
        return
    os._exit(code)


def install_fast_exit(workflow) -> bool:
    """Give ``snakemake.cli`` a FastExitSys over the real ``sys`` (see there), if its ``main``
    ends with ``sys.exit`` as written against; True if in place. Skipped by
    BESTOFN_SNAKEMAKE_PATCHES_SKIP=fast_exit."""
    import atexit
    import sys
    import threading

    if "fast_exit" in os.environ.get("BESTOFN_SNAKEMAKE_PATCHES_SKIP", "").split(","):
        APPLIED["fast_exit"] = False
        return False
    try:
        import snakemake.cli as cli

        current = cli.sys
        if isinstance(current, FastExitSys):
            current.workflow = workflow  # parsed again (e.g. a second workflow in one process)
            return True
        ok = (
            current is sys
            and hasattr(threading, "_shutdown")
            and hasattr(atexit, "_run_exitfuncs")
            and "sys.exit(0 if success else 1)" in _source(cli.main)
        )
    except Exception as e:  # noqa: BLE001 - any surprise means: leave Snakemake alone
        _debug(f"fast_exit: not installed ({e!r})")
        APPLIED["fast_exit"] = False
        return False
    if not ok:
        _debug("fast_exit: not installed, Snakemake's own kept (unexpected shape)")
        APPLIED["fast_exit"] = False
        return False
    cli.sys = FastExitSys(sys, workflow)
    APPLIED["fast_exit"] = True
    return True


# --- 5. What the SLURM feeder reads from a job's command line -------------------------------


def target_jobs_cli_shape() -> bool:
    """True where a job's Snakemake still gets its bundle on its command line as
    ``bestofn.worker.client.slurm_feeder.parse_target_jobs`` reads it: the executor interface's
    ``RealExecutor.get_job_args`` passes ``--target-jobs`` with one ``rule:key=value,...``
    argument per job (``encode_target_jobs_cli_args``). False (with a debug line) otherwise."""
    try:
        from snakemake_interface_executor_plugins.executors.real import RealExecutor
        from snakemake_interface_executor_plugins.utils import (
            TargetSpec,
            encode_target_jobs_cli_args,
        )

        job_args = " ".join(_source(RealExecutor.get_job_args).split())
        spec = TargetSpec("group", {"emotion": "calm", "prompt_id": "p1"})
        ok = (
            'format_cli_arg( "--target-jobs", encode_target_jobs_cli_args(job.get_target_spec())'
            in job_args
            and encode_target_jobs_cli_args([spec]) == ["group:emotion=calm,prompt_id=p1"]
        )
    except Exception as e:  # noqa: BLE001 - any surprise means: the feeder finds no bundle
        _debug(f"target_jobs_cli: unexpected ({e!r})")
        return False
    if not ok:
        _debug("target_jobs_cli: --target-jobs is not written as the feeder reads it")
    return ok


# --- 6. The rate limiter's timer at the end of a run ----------------------------------------

REEVALUATION = "threading.Timer( delay, lambda: self._open_jobs.release(), ).start()"


def _schedule_reevaluation(self, delay) -> None:
    """Snakemake's ``JobScheduler._schedule_reevalutation`` with a daemon timer: while jobs
    run, the same release of the scheduler after ``delay`` (the ``--max-jobs-per-timespan``
    rate limiter, on by default at 100/1s, starts one at each pass of a real run); at the end of
    the run, the interpreter no longer waits for the last one before the process exits (up to
    the timespan, a second by default, after the run's last line)."""
    import threading

    timer = threading.Timer(delay, lambda: self._open_jobs.release())
    timer.daemon = True
    timer.start()


def install_daemon_reevaluation() -> bool:
    """Put ``_schedule_reevaluation`` in place of the scheduler's, if Snakemake's has the shape
    it was written against; True if in place. Skipped by
    BESTOFN_SNAKEMAKE_PATCHES_SKIP=daemon_reevaluation."""
    name = "daemon_reevaluation"
    if name in os.environ.get("BESTOFN_SNAKEMAKE_PATCHES_SKIP", "").split(","):
        APPLIED[name] = False
        return False
    try:
        from snakemake.scheduling.job_scheduler import JobScheduler

        current = JobScheduler._schedule_reevalutation
        if current is _schedule_reevaluation:
            return True
        body = " ".join(_source(current).split("\n", 1)[1].split())
        ok = body == REEVALUATION
    except Exception as e:  # noqa: BLE001 - any surprise means: leave Snakemake alone
        _debug(f"{name}: not installed ({e!r})")
        APPLIED[name] = False
        return False
    if not ok:
        _debug(f"{name}: not installed, Snakemake's own kept (unexpected shape)")
        APPLIED[name] = False
        return False
    JobScheduler._schedule_reevalutation = _schedule_reevaluation
    APPLIED[name] = True
    return True
