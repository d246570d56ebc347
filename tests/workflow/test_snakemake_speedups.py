"""bestofn.snakemake_speedups, part 3 (the per-job patches): each gives what stock Snakemake
gives, the same jobs, the same output and the same errors, checked against Snakemake's own
function in-process and end to end on a small workflow run with and without the patches."""

import builtins
import json
import logging
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bestofn import snakemake_speedups as sp
from bestofn.snakemake_speedups import job_patches as jp

BIN = Path(sys.executable).parent


# --- every guard matches the pinned Snakemake (a failure here, not a skip) --------------------

PATCHES = [
    "quiet_log_info", "conda_spec_without_params", "constant_resource_shortcut", "compiled_eval",
    "job_free_resource_cache", "plain_str_not_flagged", "no_log_directive",
    "directory_output_check", "fast_exit", "daemon_reevaluation",
]  # fmt: skip

GUARDS = """
import json
from bestofn import snakemake_speedups as sp
from bestofn.snakemake_speedups import job_patches as jp

class Workflow:
    dryrun = True

cache = sp.install(Workflow())
print(json.dumps({"signature_cache": cache, **sp.APPLIED,
                  "resources_once": jp._resources_once_shape(),
                  "target_jobs_cli": sp.target_jobs_cli_shape()}))
"""


def test_every_guard_matches_the_pinned_snakemake():
    """pyproject.toml pins what the guards were checked on; on those versions every patch goes
    in and the feeder's --target-jobs reading holds. A guard that no longer matches fails here:
    fix the patch (or drop it) before moving the pin."""
    import tomllib
    from importlib.metadata import version

    from helpers import REPO

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = dict(d.split("==") for d in deps if d.split("==")[0] in sp.VERIFIED_ON)
    assert pins == sp.VERIFIED_ON, "pyproject.toml pins other versions than VERIFIED_ON"
    installed = {name: version(name) for name in pins}
    assert installed == pins, f"installed {installed}, pinned {pins}: run `make install`"

    env = {k: v for k, v in os.environ.items() if not k.startswith("BESTOFN_")}
    env["PYTHONPATH"] = str(REPO / "src")
    proc = subprocess.run([sys.executable, "-c", GUARDS], capture_output=True, text=True, env=env,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    guards = json.loads(proc.stdout.splitlines()[-1])
    assert set(guards) == {"signature_cache", "resources_once", "target_jobs_cli", *PATCHES}
    assert [name for name, ok in guards.items() if not ok] == [], "guards that do not match"


def test_the_feeder_reads_the_bundle_the_executor_writes():
    """The command line a job's Snakemake gets, written by the executor interface's own
    functions, read back by the feeder's parser: every group of the bundle, in order."""
    import shlex

    from snakemake_interface_executor_plugins.utils import (
        TargetSpec,
        encode_target_jobs_cli_args,
        format_cli_arg,
    )

    from bestofn.worker.client.slurm_feeder import parse_target_jobs

    groups = [("calm", "p1"), ("happy", "p2.b"), ("sad", "a-b_c")]
    specs = [TargetSpec("group", {"emotion": e, "prompt_id": p}) for e, p in groups]
    specs.insert(1, TargetSpec("other", {"x": "1"}))
    arg = format_cli_arg("--target-jobs", encode_target_jobs_cli_args(specs))
    argv = shlex.split(f"python -m snakemake {arg} --allowed-rules group --executor slurm-jobstep")
    assert parse_target_jobs(argv) == groups


def stock(func):
    """Snakemake's own function, also when a test before this one installed the patch."""
    return getattr(func, "bestofn_original", func)


# --- the nested directory-output check ------------------------------------------------------


class FakeJob:
    """Stands for a Snakemake job: hashable by identity, ordered (Snakemake orders jobs by rule)."""

    def __init__(self, name, output):
        self.name, self.output = name, output

    def __lt__(self, other):
        return self.name < other.name

    def __gt__(self, other):
        return self.name > other.name

    def __repr__(self):
        return self.name


class FakeDAG:
    def __init__(self, jobs):
        self.jobs = jobs


def outcome(check, dag):
    try:
        check(dag)
    except Exception as e:  # noqa: BLE001 - compared by type and message
        return type(e).__name__, str(e)
    return None


@pytest.fixture
def directory_checks(tmp_path, monkeypatch):
    import snakemake.api  # noqa: F401 - snakemake.dag alone is a circular import
    from snakemake.dag import DAG
    from snakemake.exceptions import ChildIOException

    monkeypatch.chdir(tmp_path)
    original = stock(DAG.check_directory_outputs)
    return original, jp.directory_output_check(original, ChildIOException)


def test_nested_directory_output_raises_as_stock(directory_checks):
    original, fast = directory_checks
    cases = {
        "nested, other job": [("a", ["results/groups"]), ("b", ["results/groups/e/p"])],
        "nested, same job": [("a", ["results/groups", "results/groups/e/p"])],
        "siblings": [("a", ["results/groups/e/p1"]), ("b", ["results/groups/e/p2"])],
        "prefix but no parent": [("a", ["results/g"]), ("b", ["results/g-x/p", "results/gx"])],
        "absolute": [("a", ["/tmp/x"]), ("b", ["/tmp/x/y"])],
        "not plain (pathlib decides)": [("a", ["out//d"]), ("b", ["./out/d/f"])],
    }
    results = {}
    for name, spec in cases.items():
        dag = FakeDAG([FakeJob(j, out) for j, out in spec])
        results[name] = outcome(fast, dag)
        assert results[name] == outcome(original, dag), name
    assert results["nested, other job"][0] == "ChildIOException"
    assert "results/groups/e/p" in results["nested, other job"][1]
    assert results["absolute"][0] == "ChildIOException"
    assert results["not plain (pathlib decides)"][0] == "ChildIOException"
    for name in ["nested, same job", "siblings", "prefix but no parent"]:
        assert results[name] is None, name


def test_directory_check_matches_stock_on_random_outputs(directory_checks):
    """Random output sets over components that sort differently as strings and as paths
    ('a-b' < 'a/b' as text, 'a' < 'a-b' as parts), '..', absolute and non-plain paths."""
    original, fast = directory_checks
    rng = random.Random(10)
    parts = ["a", "b", "a-b", "a.b", "..", "a b"]
    raised = 0
    for _ in range(600):
        jobs = []
        for j in range(rng.randint(1, 4)):
            outs = []
            for _ in range(rng.randint(1, 3)):
                path = "/".join(rng.choice(parts) for _ in range(rng.randint(1, 3)))
                path = rng.choice(["", "", "", "/tmp/", "./", "x//"]) + path
                outs.append(path)
            jobs.append(FakeJob(f"job{j}", outs))
        dag = FakeDAG(jobs)
        expected = outcome(original, dag)
        assert outcome(fast, dag) == expected, [(j.name, j.output) for j in jobs]
        raised += expected is not None
    assert 50 < raised < 550  # both outcomes were exercised


def test_output_parts_are_pathlibs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cwd = Path.cwd().parts
    for path in ["a", "a/b", "/a/b", "a/../b", "a b/c", "a-b/c.d", "/a/.."]:
        assert jp.output_parts(path, cwd) == Path(path).absolute().parts, path
    for path in ["a//b", "./a", "a/./b", "a/", "//a", ".", "/", ""]:
        assert jp.output_parts(path, cwd) is None, path


# --- printing jobs under --quiet rules ------------------------------------------------------


def quiet_filter(*quiet):
    from snakemake.logging import DefaultFilter

    return DefaultFilter(
        set(quiet), debug_dag=False, verbose=False, dryrun=True, printshellcmds=True
    )


def test_rules_suppressed_only_when_every_handler_drops_job_info():
    from snakemake.settings.enums import Quietness

    parent = logging.getLogger("bestofn-test-parent")
    logger = logging.getLogger("bestofn-test-parent.child")
    logger.setLevel(logging.INFO)
    parent.propagate = False
    try:
        quiet = logging.StreamHandler()
        quiet.addFilter(quiet_filter(Quietness.RULES))
        logger.addHandler(quiet)
        assert jp.rules_suppressed(logger)

        quiet.filters[0].quiet = {Quietness.PROGRESS}  # prints rules
        assert not jp.rules_suppressed(logger)
        quiet.filters[0].quiet = {Quietness.ALL}  # a dry run still prints jobs then
        assert not jp.rules_suppressed(logger)
        quiet.filters[0].quiet = {Quietness.RULES}

        plain = logging.StreamHandler()  # e.g. a capture handler further up
        parent.addHandler(plain)
        assert not jp.rules_suppressed(logger)
        plain.setLevel(logging.WARNING)  # drops INFO itself
        assert jp.rules_suppressed(logger)
        logger.propagate = False
        plain.setLevel(logging.INFO)
        assert jp.rules_suppressed(logger)

        logger.setLevel(logging.WARNING)
        logger.addHandler(logging.StreamHandler())
        assert jp.rules_suppressed(logger)
    finally:
        for node in (logger, parent):
            for h in list(node.handlers):
                node.removeHandler(h)
        logger.propagate = parent.propagate = True


# --- conda spec, constant resources, resource expressions -----------------------------------


def test_conda_spec_skips_params_only_without_a_conda_directive():
    import snakemake.api  # noqa: F401
    import snakemake.rules as rules_module
    from snakemake.jobs import Job
    from snakemake.rules import Rule

    original = Job.__dict__["conda_env_spec"]
    if getattr(original.fget, "bestofn_original", None):
        original = property(original.fget.bestofn_original)

    class FakeRule:
        def __init__(self, conda_env):
            self._conda_env = conda_env
            self._expanded_conda_env = rules_module._NOT_CACHED
            self.expanded = []

        def expand_conda_env(self, wildcards, params=None, input=None):
            if self._conda_env is None:
                return Rule.expand_conda_env(self, wildcards, params, input)
            self.expanded.append(params)
            return f"spec:{self._conda_env}:{params}"

    class FakeJob:
        def __init__(self, conda_env):
            self.rule, self._conda_env_spec = FakeRule(conda_env), None
            self.wildcards_dict, self.input, self.params_read = {}, [], 0

        @property
        def params(self):
            self.params_read += 1
            return "P"

    for spec in [original, jp.conda_spec_without_params(original)]:
        FakeJob.conda_env_spec = spec
        none, env = FakeJob(None), FakeJob("envs/x.yaml")
        assert (none.conda_env_spec, env.conda_env_spec) == (None, "spec:envs/x.yaml:P")
        assert env.params_read == 1 and env.rule.expanded == ["P"]
        reads_without_conda = none.params_read
    assert reads_without_conda == 0  # patched: no params for a rule without conda
    FakeJob.conda_env_spec = original
    job = FakeJob(None)
    assert job.conda_env_spec is None
    assert job.params_read == 1  # stock expands them only to drop them


def test_constant_resources_answered_as_stock():
    import snakemake.api  # noqa: F401
    from snakemake.resources import Resource
    from snakemake.rules import Rule

    original = stock(Rule.apply_input_function)
    fast = jp.constant_resource_shortcut(original, Resource.evaluate)

    class FakeRule:
        name = "r"

    calls = []

    def counting(self, func, wildcards, *args, **kwargs):
        calls.append(func)
        return original(self, func, wildcards, *args, **kwargs)

    counted = jp.constant_resource_shortcut(counting, Resource.evaluate)
    aux = dict(input=[], attempt=2, rulename="r", async_run=None, threads=1)
    kw = dict(incomplete_checkpoint_func=lambda e: 0, raw_exceptions=True, **aux)
    for res in [Resource("gpu", 1), Resource("tmpdir", "/tmp"), Resource("mem_mb", 2000),
                Resource("runtime", lambda wildcards, attempt: 10 * attempt),
                Resource("x", lambda wildcards: wildcards.emotion)]:  # fmt: skip
        want = original(FakeRule(), res.evaluate, {"emotion": "calm"}, **kw)
        got = fast(FakeRule(), res.evaluate, {"emotion": "calm"}, **kw)
        assert type(got[0]) is type(want[0]) and got[0].name == want[0].name
        assert got[0].value == want[0].value and got[1] == want[1]
    calls.clear()
    counted(FakeRule(), Resource("gpu", 1).evaluate, {}, **kw)
    assert calls == []  # a constant is answered at once
    counted(FakeRule(), Resource("gpu", 1).evaluate, {}, **{**kw, "input": lambda: []})
    assert len(calls) == 1  # Snakemake would call that aux param: its own path


def test_compiled_eval_answers_as_eval():
    fast = jp.compiled_eval()
    namespace = {"attempt": 3, "system_tmpdir": "/tmp"}
    for source in ["1 + 2", "  attempt * 2", "\tsystem_tmpdir", "'n1'", "n1-standard-4",
                   "1 +", " \n1", "min(attempt, 2)", "1\n", "x := 1"]:  # fmt: skip
        for _ in range(2):  # compiled, then from the cache
            try:
                want = ("ok", builtins.eval(source, dict(namespace)))
            except Exception as e:  # noqa: BLE001
                want = ("error", type(e))
            try:
                got = ("ok", fast(source, dict(namespace)))
            except Exception as e:  # noqa: BLE001
                got = ("error", type(e))
            assert got == want, source


def cli_outcome(evaluator, *args, **kwargs):
    try:
        value = evaluator(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - compared by type and message
        return "error", type(e).__name__, str(e)
    return "ok", type(value).__name__, value


def test_job_free_resource_cache_answers_as_stock(monkeypatch):
    import snakemake.api  # noqa: F401
    from snakemake.iocontainers import InputFiles, Wildcards
    from snakemake.resources import Resource

    original = stock(Resource.cli_evaluator)
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[1])
        return original(*args, **kwargs)

    fast = jp.job_free_resource_cache(counting)
    monkeypatch.setenv("BESTOFN_TEST_MB", "700")
    empty, some = InputFiles(), InputFiles(["Snakefile-does-not-exist"])
    exprs = [
        "min(max(2*input.size_mb, 1000), 8000)",  # Snakemake's default mem_mb
        "max(2*input.size_mb, 1000) if input else 50000",  # its default disk_mb
        "system_tmpdir",
        "1000 * attempt + threads",
        "$BESTOFN_TEST_MB",
        "n1-standard-4",  # not Python: the text itself
        "int(wildcards.i) * 10",  # differs per job: never cached
        "shutil.disk_usage('.').total > 0",  # not a name of the cache: never cached
        "1 // 0",  # an error, every time
        "[x for x in range(attempt)]",  # a list: not a plain value, not cached
    ]
    for expr in exprs:
        for i in ["1", "2", "1"]:
            for inp in [empty, some]:
                kw = dict(wildcards=Wildcards(fromdict={"i": i}), input=inp, attempt=2,
                          async_run=lambda c: c)  # fmt: skip
                want = cli_outcome(original, "r", expr, threads=3, **kw)
                got = cli_outcome(fast, "r", expr, threads=3, **kw)
                assert got == want, (expr, i, inp)
                if want[0] == "ok" and want[1] == "list":
                    assert got[2] is not want[2]
    # Per (expression, attempt, threads): Snakemake's own once for the empty input, then the
    # cache; every time for a job with input, for a name outside the cache's and for errors.
    assert calls.count(exprs[0]) == 1 + 3  # once for the three empty-input jobs, 3 with input
    assert calls.count("system_tmpdir") == 1 + 3
    assert calls.count("int(wildcards.i) * 10") == 6
    assert calls.count("shutil.disk_usage('.').total > 0") == 6
    assert calls.count("1 // 0") == 6
    assert calls.count("[x for x in range(attempt)]") == 6
    # attempt and threads are part of the key
    kw = dict(wildcards=Wildcards(fromdict={}), input=empty, async_run=lambda c: c)
    for attempt, threads in [(1, None), (2, None), (2, 4), (1, None)]:
        want = cli_outcome(original, "r", "1000 * attempt", attempt=attempt, threads=threads, **kw)
        got = cli_outcome(fast, "r", "1000 * attempt", attempt=attempt, threads=threads, **kw)
        assert got == want


def test_plain_str_not_flagged_answers_as_stock():
    from pathlib import PurePosixPath

    import snakemake.api  # noqa: F401
    import snakemake.io as io

    original = stock(io.is_flagged)
    fast = jp.plain_str_not_flagged(original, io.AnnotatedString, io._IOFile)

    class Sub(str):
        pass

    class Virtual:  # registered as an AnnotatedStringInterface without subclassing it
        flags = {"temp": True}

        def is_flagged(self, flag):
            return flag in self.flags

    io.AnnotatedStringInterface.register(Virtual)
    falsy = io.AnnotatedString("f")
    falsy.flags["temp"] = 0  # present but falsy: not flagged
    falsy.flags["pipe"] = "yes"
    values = [falsy, "out/a.txt", Sub("out/a.txt"), io.temp("out/a.txt"), io.directory("d"),
              io.AnnotatedString("plain"), io.IOFile("out/b.txt"), io.IOFile(io.temp("t")),
              io.protected("p"), Virtual(), None, 3, PurePosixPath("x"), lambda w: "x"]  # fmt: skip
    for value in values:
        for flag in ["temp", "directory", "protected", "storage_object", "pipe", "nope"]:
            assert fast(value, flag) == original(value, flag), (value, flag)
    assert fast(io.temp("out/a.txt"), "temp") is True and fast(Virtual(), "temp") is True
    calls = []
    counted = jp.plain_str_not_flagged(
        lambda v, f: calls.append(v) or original(v, f), io.AnnotatedString, io._IOFile
    )
    for value in ["a", io.temp("a"), io.IOFile("b"), falsy]:
        counted(value, "temp")
    assert calls == []  # answered without the ABC check
    for value in [Sub("a"), Virtual(), None]:
        counted(value, "temp")
    assert len(calls) == 3


@pytest.mark.slow
def test_no_log_directive_gives_a_new_empty_log():
    """Snakemake's own with a real rule, with and without ``log:``, is compared end to end
    (rule tree has a log, the printed jobs are the same); here: which calls reach it."""
    import snakemake.api  # noqa: F401
    from snakemake.iocontainers import Log

    calls = []

    def counting(self, wildcards):
        calls.append(self)
        return "stock"

    fast = jp.no_log_directive(counting, Log)

    class FakeRule:
        def __init__(self, log):
            self.log = log

    empty = FakeRule(Log())
    first, second = fast(empty, {"i": "1"}), fast(empty, {"i": "1"})
    assert type(first) is Log and len(first) == 0 and first._names == {}
    assert first is not second and first is not empty.log and calls == []
    one = Log(["logs/{i}.txt"])
    named = Log()
    named.append("logs/x.txt")
    named._add_name("x")
    empty_named = Log()
    empty_named._names["y"] = (0, 0)  # a named empty item: Snakemake's own decides
    for log in [one, named, empty_named, ["plain list"]]:
        assert fast(FakeRule(log), {"i": "1"}) == "stock"
    assert len(calls) == 4


# --- end to end: a small workflow with and without the patches --------------------------------

SNAKEFILE = """
import atexit

from bestofn import snakemake_speedups

snakemake_speedups.install(workflow)
print("patches:", sorted(k for k, v in snakemake_speedups.APPLIED.items() if v))
atexit.register(print, "an atexit function ran")  # also after the fast exit of a dry run


rule all:
    input:
        expand("out/{i}.txt", i=range(int(config.get("n", 4)))),
        "tree",
        *(["tree/inner.txt"] if config.get("nested") else []),


rule make:
    output:
        "out/{i}.txt",
    params:
        p=lambda w: f"p{w.i}" + ("x" if w.i == str(config.get("changed")) else ""),
    resources:
        gpu=1,
        mem_mb=lambda w: 1 // 0 if w.i == str(config.get("bad")) else 100,
    shell:
        "echo {params.p} > {output}"


rule tree:
    output:
        directory("tree"),
    log:
        "logs/tree.log",
    shell:
        "mkdir -p {output}"


if config.get("nested"):

    rule inner:
        output:
            "tree/inner.txt",
        shell:
            "touch {output}"
"""


def dry_run(tmp_path: Path, patched: bool, *args: str, dry: bool = True):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BESTOFN_NO_SNAKEMAKE")}
    if not patched:
        env["BESTOFN_NO_SNAKEMAKE_JOB_PATCHES"] = "1"
        env["BESTOFN_SNAKEMAKE_PATCHES_SKIP"] = "fast_exit,daemon_reevaluation"
    proc = subprocess.run(
        [str(BIN / "snakemake"), "-s", str(tmp_path / "Snakefile"), "-d", str(tmp_path),
         *(["-n"] if dry else []), "-c1", *args],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    applied = re.search(r"patches: (\[.*\])", out)
    assert applied, out
    assert (applied.group(1) != "[]") == patched, applied.group(1)
    assert ("'fast_exit'" in applied.group(1)) == patched, applied.group(1)
    assert proc.stdout.rstrip().endswith("an atexit function ran"), proc.stdout
    kept = [
        line.strip()
        for line in out.splitlines()
        if not re.match(r"\[\w{3} \w{3} .*\d{4}\]$|Date:|Workflow ID:|patches:", line.strip())
        # a traceback names the function that raised: Snakemake's or its replacement here
        and not re.search(r'File ".*(/snakemake/dag\.py|/snakemake_speedups/\w+\.py)"', line)
    ]
    # Snakemake lists a job's updated inputs in set order, which varies from run to run.
    return proc.returncode, sorted(map(sort_list, kept))


def sort_list(line: str) -> str:
    head, sep, items = line.rpartition(": ")
    return head + sep + ", ".join(sorted(items.split(", ")))


@pytest.mark.slow
def test_same_jobs_printed_and_same_errors_with_and_without_patches(tmp_path):
    printed = {}
    # A resource expression per job (wildcards) next to Snakemake's job-free defaults.
    per_job = ("--set-resources", "make:runtime=int(wildcards.i)*10+attempt")
    for args in [("-p", *per_job), ("--quiet", "rules")]:
        stock_rc, stock_out = dry_run(tmp_path, False, *args)
        rc, printed[args] = dry_run(tmp_path, True, *args)
        assert (rc, printed[args]) == (stock_rc, stock_out) and rc == 0, args
    loud = printed[("-p", *per_job)]
    assert loud.count("rule make:") == 4
    assert any(line.endswith("echo p3 > out/3.txt") for line in loud)
    assert sum("runtime=31" in line for line in loud) == 1, loud
    assert "log: logs/tree.log" in loud, loud
    assert "rule make:" not in printed[("--quiet", "rules")]

    # A resource that fails for one job fails the dry run, also where nothing prints it.
    args = ("--config", "bad=2", "--quiet", "rules")
    stock_rc, stock_out = dry_run(tmp_path, False, *args)
    rc, out = dry_run(tmp_path, True, *args)
    assert rc == stock_rc == 1, out
    assert "ZeroDivisionError" in "\n".join(out)
    assert out == stock_out

    # An output inside another job's directory output is still an error.
    stock_rc, stock_out = dry_run(tmp_path, False, "--config", "nested=1", "--quiet", "rules")
    rc, out = dry_run(tmp_path, True, "--config", "nested=1", "--quiet", "rules")
    assert rc == stock_rc == 1
    assert any("File/directory is a child to another output" in line for line in out), out
    assert out == stock_out


@pytest.mark.slow
def test_same_needrun_decisions_after_a_run(tmp_path):
    """After a real run: an existing output, a deleted one, changed params and an incomplete
    marker give the same jobs, reasons and errors with and without the patches."""
    import base64

    rc, out = dry_run(tmp_path, True, dry=False)
    assert rc == 0 and (tmp_path / "out/2.txt").read_text() == "p2\n", out
    (tmp_path / "out/0.txt").unlink()
    args = ("--config", "changed=1", "-p")
    stock_rc, stock_out = dry_run(tmp_path, False, *args)
    rc, out = dry_run(tmp_path, True, *args)
    assert (rc, out) == (stock_rc, stock_out) and rc == 0
    text = "\n".join(out)
    assert "Missing output files: out/0.txt" in text and "Params have changed" in text, text
    assert "echo p1x > out/1.txt" in text and out.count("rule make:") == 2  # 0 and 1 only
    assert "wildcards: i=2" not in out and "wildcards: i=3" not in out

    key = base64.urlsafe_b64encode(b"out/2.txt").decode()
    (tmp_path / ".snakemake/incomplete").mkdir(parents=True, exist_ok=True)
    (tmp_path / ".snakemake/incomplete" / key).write_text("")
    args = ("--quiet", "rules")
    stock_rc, stock_out = dry_run(tmp_path, False, *args)
    rc, out = dry_run(tmp_path, True, *args)
    assert (rc, out) == (stock_rc, stock_out) and rc == 1
    assert any("Incomplete files" in line for line in out), out


# --- resources read once per key, and the fast exit -----------------------------------------


def test_resources_key_only_for_rules_whose_resources_are_the_same_for_every_job():
    import snakemake.api  # noqa: F401
    from snakemake.resources import Resource

    assert jp._resources_once_shape()

    class Rule:
        def __init__(self, **resources):
            self.resources = resources

    class Job:
        def __init__(self, rule, inputs=(), aux=None, attempt=1):
            self.rule, self.input, self._aux_resources = rule, list(inputs), aux or {}
            self.attempt, self.is_local = attempt, False
            self.dag = type("D", (), {"workflow": type("W", (), {"local_exec": True})})()

    def expr(name, text):
        return Resource.from_cli_expression(name, text)

    free = Rule(
        _cores=Resource("_cores", 1),
        gpu=Resource("gpu", 1),
        mem_mb=expr("mem_mb", "min(max(2*input.size_mb, 1000), 8000)"),
        tmpdir=expr("tmpdir", "system_tmpdir"),
        runtime=expr("runtime", "10 * attempt"),
    )
    a, b = jp.resources_key(Job(free)), jp.resources_key(Job(free))
    assert a is not None and a == b
    assert jp.resources_key(Job(free, attempt=2)) != a  # the attempt is part of the key
    assert jp.resources_key(Job(free, inputs=["in.txt"])) is None  # input sizes differ
    assert jp.resources_key(Job(free, aux={"x": 1})) is None
    for job_dependent in [
        Resource("mem_mb", lambda wildcards: 100),  # a function of the rule
        expr("runtime", "int(wildcards.i) * 10"),  # an expression naming the wildcards
        expr("disk_mb", "shutil.disk_usage('.').free"),  # or anything else
    ]:
        rule = Rule(_cores=Resource("_cores", 1), **{job_dependent.name: job_dependent})
        assert jp.resources_key(Job(rule)) is None, job_dependent


def test_fast_exit_only_after_a_dry_run_of_the_snakemake_command(monkeypatch):
    import types

    import snakemake.cli as cli

    class Workflow:
        dryrun = True

    real = types.SimpleNamespace(modules={"__main__": types.SimpleNamespace(main=cli.main)})
    fast = sp.FastExitSys(real, Workflow())
    assert fast._may_skip_teardown(0) and fast._may_skip_teardown(1)
    assert fast._may_skip_teardown(None)
    assert not fast._may_skip_teardown("a message")  # printed by the interpreter: its exit
    Workflow.dryrun = False
    assert not fast._may_skip_teardown(0)  # a real run ends as it always did
    Workflow.dryrun = True
    real.modules["__main__"] = types.SimpleNamespace(main=lambda: None)  # e.g. pytest
    assert not fast._may_skip_teardown(0)
    real.modules["__main__"] = types.SimpleNamespace(
        __spec__=types.SimpleNamespace(name="snakemake.__main__")
    )
    assert fast._may_skip_teardown(0)
    # anything else of sys is the real one's
    assert sp.FastExitSys(sys, Workflow()).argv is sys.argv


def test_the_reevaluation_timer_releases_the_scheduler_and_holds_no_exit():
    """The rate limiter's timer still releases the scheduler after its delay; it is a daemon,
    so the process ends with the run's last line, not up to a timespan later."""
    import threading
    import types

    before = set(threading.enumerate())
    scheduler = types.SimpleNamespace(_open_jobs=threading.Semaphore(0))
    sp._schedule_reevaluation(scheduler, 0.05)
    [timer] = set(threading.enumerate()) - before
    assert timer.daemon
    assert scheduler._open_jobs.acquire(timeout=5)  # released after the delay, as Snakemake's
