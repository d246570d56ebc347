# Config + sheets validation and the group list. Runs at DAG-build time, before any job:
# a bad row, an unknown backend or invalid selection SQL stops the run here.
from snakemake.logging import logger

from bestofn.core.plan import PlanError, build_plan
from bestofn.select.base import SelectionError
from bestofn.util.user_input import UserInputError
from bestofn.workflow_glue import check_selection_for, refuse, run_group_rule
from bestofn import snakemake_speedups

snakemake_speedups.install(workflow)  # per-job costs of planning cut (see the module)

# Validated once, by the library (its schemas ship in the package; errors name the field).
try:
    PLAN = build_plan(config, base=".")
    check_selection_for(config)
except (PlanError, SelectionError, UserInputError) as e:
    # a config field's problem is named by the config file(s) it came from; a sheet's, a
    # weight's or a file's names its own file already
    files = ", ".join(
        map(str, workflow.overwrite_configfiles or ["config/config.yaml"])
    )
    refuse(f"{files}: {e}" if str(e).startswith("config ") else str(e))
config.update(PLAN.config)  # the defaults the schema declares, for rules and scripts
for warning in PLAN.warnings:  # settings that run, but slower than meant
    logger.warning(f"bestofn: {warning}")

RESULTS = config["results"]
GROUPS = sorted(PLAN.groups)
DATABASE = f"{RESULTS}/bestofn.duckdb"
REPORT = f"{RESULTS}/report/throughput.md"
MODELS_PARAMS = PLAN.models_params


wildcard_constraints:
    emotion="[A-Za-z0-9][A-Za-z0-9_.-]*",
    prompt_id="[A-Za-z0-9][A-Za-z0-9_.-]*",


def group_dirs(wildcards=None):
    return [f"{RESULTS}/groups/{e}/{p}" for e, p in GROUPS]


def group_params(wildcards):
    # Called once per group job while planning: keep it a dict lookup and one json.dumps.
    # The identity only (the reference voice by its digest): the run: block gets the spec
    # with the voice's path from PLAN.group_params.
    return PLAN.group_identity(wildcards.emotion, wildcards.prompt_id)


def clear_load_failures():
    """A new run starts workers again: forget the models that could not load in a run before."""
    from bestofn.worker.client.runtime import Runtime, default_state_dir
    from bestofn.worker.client.group_job import clear_load_failure

    rt = Runtime.from_config(config.get("runtime"))
    clear_load_failure(rt.state_dir or default_state_dir())


onstart:
    clear_load_failures()


def stop_workers():
    """Stop this workflow directory's warm workers (onsuccess / onerror)."""
    from bestofn.worker.client.runtime import Runtime, default_state_dir
    from bestofn.worker.client.group_job import stop_all

    rt = Runtime.from_config(config.get("runtime"))
    stop_all(rt.state_dir or default_state_dir())
