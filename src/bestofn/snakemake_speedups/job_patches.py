"""Part 3 of bestofn.snakemake_speedups: per-job work of Snakemake's dry run that gives the same
answer for every job of a rule, or that no one reads. install_job_patches installs each patch
whose target has the shape it was written against (checked on the Snakemake in
bestofn.snakemake_speedups.VERIFIED_ON) and leaves Snakemake's own in place otherwise."""

from __future__ import annotations

import os

# --- 3. Per-job work of the dry run --------------------------------------------------------
#
# Each patch wraps one Snakemake 9 function, checks first that it has the shape this was
# written against (SHAPES), and is skipped with a debug line otherwise. Each is exact: the same
# jobs, the same output, the same errors, except where its docstring says otherwise.

APPLIED: dict[str, bool] = {}  # patch name -> installed (for tests and the debug log)


def _debug(msg: str) -> None:
    try:
        from snakemake.logging import logger

        logger.debug(f"bestofn.snakemake_speedups: {msg}")
    except Exception:  # noqa: BLE001 - a debug line must never break planning
        pass


def _params(func) -> list[str]:
    import inspect

    return list(inspect.signature(func).parameters)


def rules_suppressed(logger) -> bool:
    """True when no handler of ``logger`` can emit a JOB_INFO or SHELLCMD record: every handler
    reachable from it carries Snakemake's DefaultFilter with ``--quiet rules`` (that filter
    drops both events whatever the record holds), or the logger drops INFO altogether. Any other
    handler (a logger plugin's queue, pytest's capture, a file handler without that filter)
    answers False: then the record is built as Snakemake builds it."""
    import logging

    from snakemake.logging import DefaultFilter
    from snakemake.settings.enums import Quietness

    if not logger.isEnabledFor(logging.INFO):
        return True
    node = logger
    while node is not None:
        for handler in node.handlers:
            if handler.level > logging.INFO:
                continue
            if not any(
                type(f) is DefaultFilter and Quietness.RULES in f.quiet for f in handler.filters
            ):
                return False
        if not node.propagate:
            break
        node = node.parent
    return True


def quiet_log_info(original, logger, resources_once=True):
    """``Job.log_info`` that, while no handler would print it (``rules_suppressed``), evaluates
    what the record would hold that can fail or is cached on the job (priority, log,
    benchmark, resources, threads, message, shell command: so a dry run raises the same errors)
    but neither formats the files nor builds and filters two log records per job. Resources
    and threads are read once per resources_key (the same values and errors for every job of
    that key), not per job: they were 8 % of a 16,000-group dry run (``resources_once``;
    BESTOFN_SNAKEMAKE_PATCHES_SKIP=resources_once reads them per job). Checkpoint and handover
    rules, and every printing case, go to Snakemake's own."""

    resources_read: set = set()  # resources_key()s whose resources were read without error

    def log_info(self, indent=False, printshellcmd=True):
        rule = self.rule
        if rule.is_checkpoint or rule.is_handover or not rules_suppressed(logger):
            return original(self, indent=indent, printshellcmd=printshellcmd)
        self.priority  # noqa: B018 - read for its errors, in the order Snakemake's log_info reads
        self.benchmark  # noqa: B018
        self.dag.jobid(self)
        self.message  # noqa: B018
        self.log  # noqa: B018
        key = resources_key(self) if resources_once else None
        if key is None or key not in resources_read:  # threads are one of the resources
            self.resources  # noqa: B018
            self.threads  # noqa: B018
            if key is not None:
                resources_read.add(key)
        self.shellcmd  # noqa: B018

    log_info.bestofn_original = original
    log_info.resources_read = resources_read
    return log_info


_CLI_EVALUATORS = frozenset(
    {
        "Resource.from_cli_expression.<locals>.threads_evaluator",
        "Resource.from_cli_expression.<locals>.nonthreads_evaluator",
    }
)


def _job_free_expression(evaluator) -> bool:
    """True for an evaluator Snakemake made from a resource expression (``--default-resources``,
    ``--set-resources``, a profile) whose text, after ``$VAR``/``~`` expansion, names only what
    is the same for every job without input files (_JOB_FREE_NAMES)."""
    if getattr(evaluator, "__qualname__", None) not in _CLI_EVALUATORS:
        return False
    cells = dict(zip(evaluator.__code__.co_freevars, evaluator.__closure__ or (), strict=False))
    try:
        value = cells["value"].cell_contents
    except (KeyError, ValueError):
        return False
    return type(value) is str and _names_job_free(os.path.expanduser(os.path.expandvars(value)))


def _names_job_free(source: str) -> bool:
    """True if the expression ``source`` names only _JOB_FREE_NAMES (False if it is none)."""
    try:
        code = compile(source.lstrip(" \t"), "<string>", "eval")
    except SyntaxError:
        return False
    return _code_names(code) <= _JOB_FREE_NAMES


def resources_key(job):
    """What a job's resources are a function of, when that is the same for many jobs: for a job
    with no input files and no aux resources, of a rule whose every resource is a constant or a
    job-free expression (_job_free_expression; threads included), Snakemake's
    ``Rule.expand_resources`` gives the same values (or the same error) for every job with the
    same rule, attempt and local-or-not: the key. Else None: the job's own resources are read.
    The rule's answer is kept on the rule."""
    rule = job.rule
    job_free = rule.__dict__.get("_bestofn_job_free_resources")
    if job_free is None:
        job_free = all(
            r._evaluator is None or _job_free_expression(r._evaluator)
            for r in rule.resources.values()
        )
        rule._bestofn_job_free_resources = job_free
    if not job_free or job._aux_resources or len(job.input):
        return None
    return (rule, job.attempt, job.is_local, job.dag.workflow.local_exec)


def conda_spec_without_params(original_property):
    """``Job.conda_env_spec`` that, for a rule without a ``conda:`` directive, answers None
    without expanding the job's params first. Snakemake passes ``self.params`` to
    ``Rule.expand_conda_env``, which returns None at once for such a rule: the params were
    expanded (every params function of every job, 9 % of a dry run) only to be dropped.
    Not exactly equivalent in one respect: a params function that raises now raises where the
    params are first needed (a rerun-trigger check of an existing output, or the job's run),
    not while the DAG is built; the value is the same."""
    getter = original_property.fget

    def conda_env_spec(self):
        if self._conda_env_spec is None and self.rule._conda_env is None:
            return None
        return getter(self)

    conda_env_spec.bestofn_original = getter
    return property(conda_env_spec, doc=original_property.__doc__)


def constant_resource_shortcut(original, evaluate):
    """``Rule.apply_input_function`` that answers a constant resource at once. Snakemake
    expands every resource of every job through it, ``Resource.evaluate`` bound to the
    resource: for a resource that is a plain value (no evaluator) that call returns the resource
    itself, after building a Wildcards object and the aux parameters. Answered the same
    ``(resource, False)`` here when nothing among the aux parameters is a callable Snakemake
    would call first."""

    def apply_input_function(self, func, wildcards, *args, **kwargs):
        if (
            not args
            and getattr(func, "__func__", None) is evaluate
            and func.__self__._evaluator is None
            and kwargs.get("groupid") is None
            and not any(callable(v) for k, v in kwargs.items() if k not in _NOT_CALLED)
        ):
            return func.__self__, False
        return original(self, func, wildcards, *args, **kwargs)

    apply_input_function.bestofn_original = original
    return apply_input_function


# Keyword arguments of apply_input_function that are not aux params called before use.
_NOT_CALLED = frozenset({"incomplete_checkpoint_func", "raw_exceptions", "groupid", "async_run"})


def compiled_eval():
    """``eval`` for snakemake.resources: resource expressions (``--default-resources``,
    ``--set-resources``, profile ``resources``) are evaluated per job from their source text,
    compiled again each time. Compiled once per text here; ``eval`` of a string strips leading
    spaces and tabs and compiles it as '<string>', and so does this."""
    import builtins
    import functools

    @functools.lru_cache(maxsize=256)
    def code(source: str):
        return compile(source.lstrip(" \t"), "<string>", "eval")

    def eval_(source, globals=None, locals=None, /):  # noqa: A002 - eval's own names
        if type(source) is str:
            source = code(source)
        return builtins.eval(source, globals, locals)

    eval_.bestofn_cached = True
    return eval_


# Names a resource expression may use and still give the same value for every job whose input
# is empty: the job-independent arguments Snakemake passes (attempt, threads, the system temp
# dir), the empty input and its sizes, and a few pure builtins. Anything else (wildcards, shutil,
# the ioutils helpers, any other name or attribute) sends the expression to Snakemake each time.
_JOB_FREE_NAMES = frozenset(
    {
        "input",
        "size_mb",
        "size_gb",
        "size_kb",
        "size",
        "attempt",
        "threads",
        "system_tmpdir",
        "max",
        "min",
        "int",
        "float",
        "round",
        "abs",
        "len",
        "str",
        "bool",
    }
)
_PLAIN_VALUE_TYPES = (int, float, str, bool, type(None))


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


def job_free_resource_cache(original):
    """``Resource.cli_evaluator`` (a resource expression such as Snakemake's default
    ``mem_mb=min(max(2*input.size_mb, 1000), 8000)``, evaluated per job) answered from a cache
    for a job with no input files when the expression names only what is the same for every
    such job (_JOB_FREE_NAMES): the value is then a function of the expression text after
    ``$VAR``/``~`` expansion, ``attempt``, ``threads`` and the temp dir, which form the key. Only
    plain values (int, float, str, bool, None; not Snakemake's TBDString) are kept; an
    expression that raises is evaluated, and raises, every time. Every other call goes to
    Snakemake's own."""
    import functools
    import tempfile

    job_free = functools.lru_cache(maxsize=256)(_names_job_free)
    values: dict = {}

    def cli_evaluator(name, val, *, wildcards, input, attempt, threads=None, async_run):  # noqa: A002
        key = None
        if type(val) is str and isinstance(input, list) and not input:
            expanded = os.path.expanduser(os.path.expandvars(val))
            if job_free(expanded):
                key = (name, expanded, attempt, threads, tempfile.gettempdir())
                hit = values.get(key, _MISSING)
                if hit is not _MISSING:
                    return hit
        kwargs = {"wildcards": wildcards, "input": input, "attempt": attempt}
        if threads is not None:
            kwargs["threads"] = threads
        value = original(name, val, async_run=async_run, **kwargs)
        if key is not None and type(value) in _PLAIN_VALUE_TYPES:
            values[key] = value
        return value

    cli_evaluator.bestofn_original = original
    cli_evaluator.values = values
    return cli_evaluator


_MISSING = object()


def plain_str_not_flagged(original, annotated=None, iofile=None):
    """``snakemake.io.is_flagged`` without the ABC check for the types it sees most.
    Snakemake's asks ``isinstance(value, AnnotatedStringInterface)`` first, run through
    ``ABCMeta.__instancecheck__``, a few times per job file (``_IOFile.is_storage`` alone asks
    for every file, again and again: 3 % of a dry run at 100,000 groups). Here:

    - a plain ``str`` is no AnnotatedStringInterface (checked at install): False at once;
    - Snakemake's ``AnnotatedString`` (what a job file's ``_file`` is after ``clone_flags``),
      when it answers with the interface's own ``is_flagged`` over its ``_flags`` dict (checked
      at install): that lookup, inlined;
    - Snakemake's ``_IOFile`` (a subclass of the interface, checked at install): its own
      ``is_flagged``, as Snakemake calls it after the check.

    Any other type, subclasses included, goes to Snakemake's own."""

    def is_flagged(value, flag):
        kind = type(value)
        if kind is str:
            return False
        if kind is annotated:
            flags = value._flags
            return flag in flags and bool(flags[flag])
        if kind is iofile:
            return value.is_flagged(flag)
        return original(value, flag)

    is_flagged.bestofn_original = original
    return is_flagged


def _replace_global(name: str, old, new) -> list[str]:
    """Set ``name`` to ``new`` in every loaded snakemake module that holds ``old`` under it."""
    import sys

    done = []
    for mod_name, module in list(sys.modules.items()):
        if mod_name.split(".")[0] == "snakemake" and getattr(module, name, None) is old:
            setattr(module, name, new)
            done.append(mod_name)
    return done


def no_log_directive(original, log_class):
    """``Rule.expand_log`` for a rule without ``log:``: a new empty ``Log``, which is what
    Snakemake's returns after walking the empty list through ``_apply_wildcards`` (about 1 % of
    a dry run at 100,000 groups: every job's ``log`` is read for its products). A rule with any
    log item, named or not, goes to Snakemake's own."""

    def expand_log(self, wildcards):
        rule_log = self.log
        if type(rule_log) is log_class and not rule_log and not rule_log._names:
            return log_class()
        return original(self, wildcards)

    expand_log.bestofn_original = original
    return expand_log


def output_parts(path: str, cwd: tuple[str, ...]):
    """The parts of ``Path(path).absolute()``, from the string where it is plain (no empty
    or '.' component, not starting with '//'); None where only pathlib can say."""
    if path.startswith("/"):
        if path.startswith("//"):
            return None
        rest = path[1:].split("/")
        head: tuple[str, ...] = ("/",)
    else:
        rest = path.split("/")
        head = cwd
    if "" in rest or "." in rest:
        return None
    return head + tuple(rest)


def directory_output_check(original, error_class):
    """``DAG.check_directory_outputs`` in one sort of tuples of path parts: Snakemake sorts
    ``(Path(f).absolute(), job)`` over all outputs and calls ``os.path.commonpath`` twice for
    each neighbour pair. Paths order and compare by their parts, and for absolute paths
    ``commonpath([a, b]) == commonpath([a])`` with ``a != b`` says the parts of ``a`` are a
    proper prefix of those of ``b``: the same pairs are compared and the same
    ``ChildIOException`` is raised, built from the same ``(Path, job)`` tuples. Outputs that
    are not plain strings (see output_parts) go to Snakemake's own check."""
    from pathlib import Path

    def check_directory_outputs(self):
        cwd = Path.cwd().parts
        if cwd[0] != "/":
            return original(self)
        entries = {}
        for job in self.jobs:
            for f in job.output:
                parts = output_parts(str(f), cwd)
                if parts is None:
                    return original(self)
                entries.setdefault((parts, job), f)
        keys = sorted(entries)
        for (a, job_a), (b, job_b) in zip(keys, keys[1:], strict=False):
            if len(a) < len(b) and b[: len(a)] == a and job_a != job_b:
                raise error_class(
                    parent=(Path(entries[(a, job_a)]).absolute(), job_a),
                    child=(Path(entries[(b, job_b)]).absolute(), job_b),
                )

    check_directory_outputs.bestofn_original = original
    return check_directory_outputs


def install_job_patches() -> dict[str, bool]:
    """Install each per-job patch whose target has the expected shape; returns APPLIED."""
    import importlib

    try:
        importlib.import_module("snakemake.api")  # first: snakemake.dag alone is a circular import
        import snakemake.dag as dag
        import snakemake.io as io
        import snakemake.iocontainers as iocontainers
        import snakemake.jobs as jobs
        import snakemake.resources as resources
        import snakemake.rules as rules
        from snakemake.logging import logger
    except ImportError as e:
        _debug(f"no per-job patches ({e})")
        return APPLIED
    Job, Rule, DAG = jobs.Job, rules.Rule, dag.DAG

    skip = set(filter(None, os.environ.get("BESTOFN_SNAKEMAKE_PATCHES_SKIP", "").split(",")))

    def patch(name, ok, apply):
        if APPLIED.get(name):
            return
        if name in skip:
            APPLIED[name] = False
            _debug(f"{name}: skipped (BESTOFN_SNAKEMAKE_PATCHES_SKIP)")
            return
        try:
            good = ok()
        except Exception as e:  # noqa: BLE001 - any surprise means: leave Snakemake alone
            good, why = False, repr(e)
        else:
            why = "unexpected shape"
        if not good:
            APPLIED[name] = False
            _debug(f"{name}: not installed, Snakemake's own kept ({why})")
            return
        apply()
        APPLIED[name] = True

    patch(
        "quiet_log_info",
        lambda: (
            _params(Job.log_info) == ["self", "indent", "printshellcmd"] and jobs.logger is logger
        ),
        lambda: setattr(
            Job,
            "log_info",
            quiet_log_info(
                Job.log_info, logger, "resources_once" not in skip and _resources_once_shape()
            ),
        ),
    )
    patch(
        "conda_spec_without_params",
        lambda: (
            isinstance(Job.__dict__.get("conda_env_spec"), property)
            and "self._conda_env_spec" in _source(Job.__dict__["conda_env_spec"].fget)
            and "self._conda_env" in _source(Rule.expand_conda_env)
            and "self._expanded_conda_env = None" in _source(Rule.expand_conda_env)
        ),
        lambda: setattr(
            Job, "conda_env_spec", conda_spec_without_params(Job.__dict__["conda_env_spec"])
        ),
    )
    patch(
        "constant_resource_shortcut",
        lambda: (
            _params(Rule.apply_input_function)[:6]
            == [
                "self",
                "func",
                "wildcards",
                "incomplete_checkpoint_func",
                "raw_exceptions",
                "groupid",
            ]
            and "return self" in _source(resources.Resource.evaluate)
            and "_evaluator" in _source(resources.Resource.__init__)
        ),
        lambda: setattr(
            Rule,
            "apply_input_function",
            constant_resource_shortcut(Rule.apply_input_function, resources.Resource.evaluate),
        ),
    )
    patch(
        "compiled_eval",
        lambda: (
            "eval(val, namespace)" in _source(resources.Resource.cli_evaluator)
            and "eval" not in vars(resources)
        ),
        lambda: setattr(resources, "eval", compiled_eval()),
    )
    patch(
        "job_free_resource_cache",
        lambda: (
            isinstance(vars(resources.Resource).get("cli_evaluator"), staticmethod)
            and _params(resources.Resource.cli_evaluator)
            == ["name", "val", "wildcards", "input", "attempt", "threads", "async_run"]
            and "cls.cli_evaluator(" in _source(resources.Resource.from_cli_expression)
            and "os.path.expandvars(val)" in _source(resources.Resource.cli_evaluator)
            and '"system_tmpdir": tempfile.gettempdir()'
            in _source(resources.Resource.cli_evaluator)
        ),
        lambda: setattr(
            resources.Resource,
            "cli_evaluator",
            staticmethod(job_free_resource_cache(resources.Resource.cli_evaluator)),
        ),
    )
    patch(
        "plain_str_not_flagged",
        lambda: (
            _params(io.is_flagged) == ["value", "flag"]
            and "if not isinstance(value, AnnotatedStringInterface):\n        return False\n"
            "    return value.is_flagged(flag)"
            in _source(io.is_flagged)
            and not issubclass(str, io.AnnotatedStringInterface)
            and issubclass(io.AnnotatedString, io.AnnotatedStringInterface)
            and issubclass(io._IOFile, io.AnnotatedStringInterface)
            and io.AnnotatedString.is_flagged is io.AnnotatedStringInterface.is_flagged
            and "return flag in self.flags and bool(self.flags[flag])"
            in _source(io.AnnotatedStringInterface.is_flagged)
            and isinstance(vars(io.AnnotatedString).get("flags"), property)
            and "return self._flags" in _source(io.AnnotatedString.flags.fget)
        ),
        lambda: _replace_global(
            "is_flagged",
            io.is_flagged,
            plain_str_not_flagged(io.is_flagged, io.AnnotatedString, io._IOFile),
        ),
    )
    patch(
        "no_log_directive",
        lambda: (
            _params(Rule.expand_log) == ["self", "wildcards"]
            and "log = Log()" in _source(Rule.expand_log)
            and "self._apply_wildcards(" in _source(Rule.expand_log)
            and "for f in log:" in _source(Rule.expand_log)
            and rules.Log is iocontainers.Log
        ),
        lambda: setattr(Rule, "expand_log", no_log_directive(Rule.expand_log, rules.Log)),
    )
    patch(
        "directory_output_check",
        lambda: (
            _params(DAG.check_directory_outputs) == ["self"]
            and "Path(f).absolute()" in _source(DAG.check_directory_outputs)
            and "commonpath" in _source(DAG.check_directory_outputs)
        ),
        lambda: setattr(
            DAG,
            "check_directory_outputs",
            directory_output_check(DAG.check_directory_outputs, dag.ChildIOException),
        ),
    )
    return APPLIED


def _resources_once_shape() -> bool:
    """What resources_key relies on, as in Snakemake 9.27.1: a job's resources are
    ``rule.expand_resources(wildcards, input, attempt, skip_evaluation)`` with the skip set
    from local_exec/is_local, plus its aux resources; its threads are one of them; expression
    resources are closures over their text named as in _CLI_EVALUATORS."""
    from snakemake import jobs, resources

    try:
        job_resources = _source(jobs.Job.resources.fget)
        cli = _source(resources.Resource.from_cli_expression)
        ok = (
            "self.rule.expand_resources(" in job_resources
            and "self.dag.workflow.local_exec or self.is_local" in job_resources
            and "self._aux_resources" in job_resources
            and "return self.resources._cores" in _source(jobs.Job.threads.fget)
            and "def threads_evaluator(" in cli
            and "def nonthreads_evaluator(" in cli
            and "_evaluator" in _source(resources.Resource.__init__)
        )
    except Exception as e:  # noqa: BLE001 - any surprise means: read them per job
        _debug(f"resources_once: not used ({e!r})")
        return False
    if not ok:
        _debug("resources_once: not used, resources read per job (unexpected shape)")
    return ok


def _source(func) -> str:
    import inspect

    return inspect.getsource(func)
