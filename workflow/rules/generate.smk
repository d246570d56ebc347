# One job per group. No input function and no log: directive (at 100k groups Snakemake's
# per-job work for those dominated planning, docs/PERFORMANCE.md): the reference voice is part
# of the group's identity through its content digest in params.spec, and the job writes its log
# to {results}/logs/groups/{emotion}/{prompt_id}.log. A run: block, not a script: (profiles set
# force-use-threads, so it runs in a thread of Snakemake): no per-job script source handling
# while planning, and no Python process started per group while running.


rule group:
    """Generate, restore, score and write one (emotion, prompt) group of N takes."""
    output:
        directory(f"{RESULTS}/groups/{{emotion}}/{{prompt_id}}"),
    resources:
        # one of the group jobs in flight that the local profiles cap (slots x queue depth);
        # GPUs are `gpu`, asked for only where a job gets GPUs of its own (profiles/slurm)
        group_slots=1,
    params:
        # The group's identity: its text, emotion, N, seed, reference voice and the models.
        # Performance knobs live in config['runtime'] and are deliberately not params
        # (changing them reruns nothing).
        spec=group_params,
        # a function: Snakemake would read the braces of an option's value (an instruction
        # template, "{description}") as wildcards in a plain string
        models=lambda wildcards: MODELS_PARAMS,
        device=config["device"],
        flac_subtype=config["flac_subtype"],
    run:
        run_group_rule(
            params,
            output[0],
            wildcards.emotion,
            wildcards.prompt_id,
            config,
            spec=PLAN.group_params(wildcards.emotion, wildcards.prompt_id),
        )
