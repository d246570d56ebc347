rule group:
    """Generate, restore, score and write one (emotion, prompt) group of N takes."""
    input:
        reference=reference_audio,
    output:
        directory(f"{RESULTS}/groups/{{emotion}}/{{prompt_id}}"),
    log:
        f"{RESULTS}/logs/groups/{{emotion}}/{{prompt_id}}.log",
    resources:
        gpu=1,
    params:
        # The group's identity: its text, emotion, N, seed and the models. Performance knobs
        # live in config['runtime'] and are deliberately not params (changing them reruns nothing).
        spec=group_params,
        models=MODELS_PARAMS,
        device=config["device"],
        flac_subtype=config["flac_subtype"],
    script:
        "../scripts/run_group.py"
