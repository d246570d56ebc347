"""Two costs of Snakemake's planning that grow with the number of jobs but need not.

1. A per-job cost that is the same for every job, computed once:

While planning, Snakemake 9 evaluates every resource and every input/params function of every
job through ``apply_input_function``, which asks ``inspect.signature`` of the callable two or
three times per call: about ten signatures per group job, the same few functions each time
(``Resource.evaluate`` and the workflow's params function), 15 % of a dry run at 16,000 groups
(py-spy, docs/PERFORMANCE.md). A function's signature does not change, so
``snakemake.common.get_function_params`` gets a cache in front of it:

- bound methods are cached by their function (the signature without ``self`` is the same for
  every instance), other callables by themselves; both weakly, so nothing is kept alive;
- a callable carrying Snakemake's own override (``_overwrite_params``) is answered from it, as
  Snakemake does, before any cache;
- anything not weak-referenceable or unhashable is passed through uncached.

2. The garbage collector's passes over the growing job graph: see tune_gc.

``install()`` is called from workflow/rules/common.smk. It does nothing when Snakemake's
function is not the one this was written against, or when BESTOFN_NO_SNAKEMAKE_SPEEDUPS is set
(the before/after benchmark sets it)."""

from __future__ import annotations

import gc
import os
import weakref

OVERRIDE = "_overwrite_params"  # snakemake.common.FUNC_OVERWRITE_PARAMS_ATTR


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


def install() -> bool:
    """Put the cache in front of Snakemake's get_function_params and tune the garbage
    collector (tune_gc); True if the cache is in place."""
    if os.environ.get("BESTOFN_NO_SNAKEMAKE_SPEEDUPS"):
        return False
    tune_gc()
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
