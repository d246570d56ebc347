"""bestofn's hook into Snakemake's command line: a ``--configfile`` that is missing or does not
parse ends as the workflow's own checks end (``error: <file>: <what>``, exit status 2), not in
a Python traceback.

Snakemake reads ``--configfile`` files in its command line, before any workflow code runs. A
missing file escapes as a FileNotFoundError traceback (Snakemake opens it outside its own
``try``); a malformed one is reported without its name; both exit 1. Snakemake imports every
installed logger plugin while it builds that command line, so a plugin's import is the one
point where a workflow's package can act before those files are read. Importing this module
puts ``load_configfile`` in front of Snakemake's loader (``snakemake.settings.types``, checked
on VERIFIED_ON): a file that loads gives Snakemake's own result, untouched; one that fails is
named by ``bestofn.workflow_glue.config_file_problem``. In any other workflow of the same
environment, only those error messages change.

The plugin registry requires a log handler: ``--logger bestofn`` writes Snakemake's records
to stderr through Snakemake's own formatter and filter, as its default output does.
"""

from __future__ import annotations

import sys
from logging import LogRecord

from snakemake_interface_logger_plugins.base import LogHandlerBase

# Snakemake's command line and the loader this wraps, at the version they were read on
# (pinned exactly in pyproject.toml; tests/workflow/test_config_errors.py runs through it).
VERIFIED_ON = {"snakemake": "9.27.1"}


class LogHandler(LogHandlerBase):
    def emit(self, record: LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging's own contract: a handler never raises
            self.handleError(record)

    @property
    def writes_to_stream(self) -> bool:
        return True

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return False

    @property
    def has_formatter(self) -> bool:
        return False

    @property
    def needs_rulegraph(self) -> bool:
        return False


def _install() -> bool:
    """Wrap Snakemake's config-file loader; False (Snakemake's own left in place) where the
    version or the loader is not the one this was read on."""
    try:
        import snakemake
        from snakemake.settings import types
    except ImportError:
        return False
    if getattr(snakemake, "__version__", None) != VERIFIED_ON["snakemake"]:
        return False
    loader = getattr(types, "load_configfile", None)
    if loader is None or getattr(loader, "__module__", "") != "snakemake.common.configfile":
        return False

    def load_configfile(path):
        try:
            return loader(path)
        except Exception:  # FileNotFoundError, WorkflowError: named below if we can
            from bestofn.workflow_glue import config_file_problem, refuse

            if problem := config_file_problem(path):
                refuse(problem)
            raise

    load_configfile.__wrapped__ = loader
    types.load_configfile = load_configfile
    return True


INSTALLED = _install()
