"""Stock Snakemake (`snakemake.cli.main`, as .venv/bin/snakemake runs it) for
tests/workflow/test_slurm.py, with one change in the SLURM executor plugin: the pause between two
squeue status checks is capped at CAP_S seconds.

The plugin (snakemake-executor-plugin-slurm 2.8.0) adds 10 s to that pause after every check in
which no job finished (up to 180 s), so a job of a few minutes was noticed 1-1.5 minutes after it
ended, and a failed run's Snakemake, which waits out the pause before it exits, took another
40 s to exit. Only the controller (the Snakemake on the "login node") runs this file: the jobs'
own Snakemake is started by the plugin as `python -m snakemake`, untouched. Nothing the tests
assert depends on how often squeue is asked; it only decides how soon an end is seen.

    python tests/workflow/slurm_quick_poll.py --snakefile ... --profile ...  # snakemake's arguments
"""

import sys

CAP_S = 2


def cap_status_check_pause(cap_s: float = CAP_S) -> None:
    from snakemake_executor_plugin_slurm import Executor
    from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

    pause = RemoteExecutor.next_seconds_between_status_checks  # the property the plugin sets
    Executor.next_seconds_between_status_checks = property(
        pause.fget, lambda self, seconds: pause.fset(self, min(seconds, cap_s))
    )


if __name__ == "__main__":
    cap_status_check_pause()
    from snakemake.cli import main

    sys.exit(main())
