from snakemake.utils import min_version

min_version("9.0")


from bestofn.workflow_glue import config_file_problem, refuse

if problem := config_file_problem(
    "config/config.yaml", list(workflow.overwrite_configfiles or [])
):
    refuse(problem)  # the file named: Snakemake's own message names none


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/generate.smk"
include: "workflow/rules/select.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/export.smk"


rule all:
    default_target: True
    input:
        # Groups are named here too: a deleted group directory is then planned again even
        # though the database and report built from it still exist.
        group_dirs(),
        DATABASE,
        REPORT,


onsuccess:
    stop_workers()


onerror:
    stop_workers()
