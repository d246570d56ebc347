"""A call run meanwhile in a fresh Python interpreter, so that two halves of a job use two cores.

A fresh interpreter, not a fork: the caller has threads before it gets here (OpenBLAS's pool
from importing numpy, DuckDB's allocator thread once a database was opened, a test runner's),
and a child forked from a threaded process inherits every lock those threads held at that
moment, held by no one: it can wait on one forever. Not multiprocessing's spawn or forkserver
either: their child imports the caller's main script again, and Snakemake's ``script:`` runs
one without an ``if __name__ == "__main__"`` guard, which would write the report a second time
inside the child. The child here starts from a fixed bootstrap and imports only the function.

The function is named by module and name (as pickle names one), so it must be importable at
module level; its arguments and its answer travel as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

STDERR_TAIL = 4000  # characters of the child's stderr quoted in an error

# The child: the caller's sys.path (its imports resolve as the caller's do), then the call.
_BOOTSTRAP = (
    "import json, sys; job = json.loads(sys.argv[1]); sys.path[:] = job['sys_path']; "
    "from bestofn.report.fresh_process import serve; serve(job)"
)


def _target(fn) -> str:
    name = f"{fn.__module__}:{fn.__qualname__}"
    if "<" in name:  # <lambda>, <locals>: nothing a fresh interpreter could import
        raise ValueError(f"{name} cannot be imported by name: define it at module level")
    return name


def serve(job: dict) -> None:
    """The child's side: call the function, write its answer as JSON to stdout. Whatever the
    call itself prints goes to stderr, so stdout carries only the answer."""
    import importlib

    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    module, _, name = job["target"].partition(":")
    fn = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    json.dump(fn(*job["args"]), answer)
    answer.close()


class FreshProcess:
    """``fn(*args)`` started now in a fresh interpreter; ``.result()`` waits for its answer at
    most ``timeout_s`` from the start. Used as a context manager, a child still running at the
    end (the caller failed first) is stopped, so none outlives its caller."""

    def __init__(self, fn, *args, timeout_s: float, label: str = ""):
        self.target = _target(fn)
        self.label = label or self.target
        self.timeout_s = timeout_s
        self._stderr = tempfile.TemporaryFile()  # a file, not a pipe: the child never blocks on it
        job = {"target": self.target, "args": list(args), "sys_path": sys.path}
        self._deadline = time.monotonic() + timeout_s
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, json.dumps(job)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )

    def result(self):
        """The answer; a failed child raises RuntimeError, a child with no answer by the
        deadline is stopped and raises TimeoutError, each quoting the end of its stderr."""
        try:
            out, _ = self._proc.communicate(timeout=max(0.0, self._deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            raise TimeoutError(
                f"{self.label} gave no answer in {self.timeout_s:g} s and was stopped; "
                f"its stderr ends:\n{self._stderr_text()[-STDERR_TAIL:]}"
            ) from None
        err = self._stderr_text()
        code = self._proc.returncode
        if code:
            how = f"was killed by signal {-code}" if code < 0 else f"failed (exit {code})"
            raise RuntimeError(f"{self.label} {how}; its stderr ends:\n{err[-STDERR_TAIL:]}")
        sys.stderr.write(err)  # its warnings, as if it had run here
        return json.loads(out)

    def _stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.communicate()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        self._stderr.close()
