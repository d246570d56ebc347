"""Bad input gets a clear error naming the file, line and field, before any model loads."""

import pytest
import yaml
from conftest import tiny_config, write_tsv

from bestofn.plan import PlanError, build_plan
from bestofn.selection import SelectionError
from bestofn.workflow_glue import check_selection_for


def plan(project, **overrides):
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config.update(overrides)
    return build_plan(config, project)


def test_good_project_expands_emotions_times_prompts(project):
    p = plan(project)
    assert sorted(p.groups) == [("calm", "p1"), ("calm", "p2"), ("happy", "p1"), ("happy", "p2")]
    assert p.groups[("calm", "p1")].reference_audio == "config/voices/ref.flac"
    assert p.groups[("happy", "p1")].reference_audio is None
    assert p.groups[("calm", "p2")].n_takes == 2


def test_prompt_subset_per_emotion(project):
    write_tsv(
        project / "config/emotions.tsv",
        ["emotion", "description", "prompts"],
        [["calm", "A calm voice.", "p2"], ["happy", "A happy voice.", ""]],
    )
    assert sorted(plan(project).groups) == [("calm", "p2"), ("happy", "p1"), ("happy", "p2")]


def expect(project, match, **overrides):
    with pytest.raises(PlanError, match=match):
        plan(project, **overrides)


def test_missing_column(project):
    write_tsv(project / "config/prompts.tsv", ["prompt_id"], [["p1"]])
    expect(project, r"prompts.tsv: missing column\(s\) \['text'\]")


def test_duplicate_prompt_id(project):
    write_tsv(project / "config/prompts.tsv", ["prompt_id", "text"], [["p1", "a"], ["p1", "b"]])
    expect(project, r"prompts.tsv line 3: duplicate prompt_id 'p1' \(first at line 2\)")


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_or_whitespace_text(project, text):
    write_tsv(project / "config/prompts.tsv", ["prompt_id", "text"], [["p1", "ok"], ["p2", text]])
    expect(project, r"prompts.tsv line 3: field 'text' .* is empty or whitespace")


def test_emotion_not_in_emotions_sheet(project):
    write_tsv(
        project / "config/prompts.tsv",
        ["prompt_id", "text", "emotions"],
        [["p1", "Hello.", "calm,furious"]],
    )
    expect(project, r"prompts.tsv line 2 \(prompt_id 'p1'\): field 'emotions' names 'furious'")


def test_reference_voice_missing(project):
    write_tsv(
        project / "config/emotions.tsv",
        ["emotion", "description", "reference_audio"],
        [["calm", "A calm voice.", "config/voices/nope.wav"]],
    )
    expect(
        project,
        r"emotions.tsv line 2 \(emotion 'calm'\): reference_audio .*nope.wav.* does not exist",
    )


def test_reference_voice_not_audio(project):
    (project / "config/voices/notes.wav").write_text("this is not audio")
    write_tsv(
        project / "config/emotions.tsv",
        ["emotion", "description", "reference_audio"],
        [["calm", "A calm voice.", "config/voices/notes.wav"]],
    )
    expect(project, r"emotions.tsv line 2 .*notes.wav.* is not readable audio")


@pytest.mark.parametrize("takes", [0, -3])
def test_takes_must_be_positive(project, takes):
    expect(project, r"config field takes: .*minimum", takes=takes)


def test_unknown_backend(project):
    models = tiny_config()["models"]
    models["scorers"] = [{"backend": "duration"}, {"backend": "whisperx"}]
    expect(project, r"unknown scorer backend 'whisperx'; known: .*whisper-asr", models=models)


def test_long_text_is_refused_not_cut(project):
    long = " ".join(["word"] * 30)
    write_tsv(project / "config/prompts.tsv", ["prompt_id", "text"], [["p1", long]])
    expect(
        project,
        r"line 2 \(prompt_id 'p1'\): text has 30 words, more than max_words=20",
        max_words=20,
    )


def test_unsafe_id_is_refused(project):
    write_tsv(project / "config/prompts.tsv", ["prompt_id", "text"], [["../p1", "Hello."]])
    expect(project, r"prompts.tsv line 2: field 'prompt_id' \('../p1'\)")


def test_unknown_sheet_column(project):
    write_tsv(project / "config/prompts.tsv", ["prompt_id", "text", "txet"], [["p1", "Hi.", "x"]])
    expect(project, r"unknown column\(s\) \['txet'\]")


@pytest.mark.parametrize(
    "selection, match",
    [
        ({"filter": "wer <= ", "score": "1"}, "invalid"),
        ({"filter": "true", "score": "no_such_column * 2"}, "no_such_column"),
        ({"filter": "true; DROP TABLE takes", "score": "1"}, "one SQL expression"),
    ],
)
def test_bad_selection_sql_fails_before_generation(selection, match):
    config = tiny_config(selection=selection)
    with pytest.raises(SelectionError, match=match):
        check_selection_for(config)


def test_good_selection_sql_passes():
    check_selection_for(tiny_config())


def test_missing_weights_paths_are_all_listed_before_any_load(project):
    from conftest import REPO

    from bestofn.plan import load_config

    config = load_config(REPO / "config/production.yaml")
    config["emotions"] = "config/emotions.tsv"
    config["prompts"] = "config/prompts.tsv"
    with pytest.raises(PlanError) as err:
        build_plan(config, project)
    text = str(err.value)
    assert "generator moss-fast: options.model_dir = /models/MOSS-TTS-Local-Tr" in text
    assert "scorer parakeet: options.model_path" in text
    assert "scorer empathic-insight: options.heads_path" in text
    assert text.count("\n") == 11  # every missing path, not just the first


def test_runtime_knobs_are_not_group_identity(project):
    base = tiny_config()["models"]
    faster = {**base, "generator": {"backend": "piper", "runtime": {"batch_size": 128}}}
    other = {**base, "generator": {"backend": "piper", "options": {"noise_scale": 0.3}}}
    assert plan(project, models=faster).models_params == plan(project, models=base).models_params
    assert plan(project, models=other).models_params != plan(project, models=base).models_params


# --- defaults come from the schema -------------------------------------------------------------


def test_plan_config_has_the_schema_defaults_and_input_is_untouched(project):
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config.pop("results")
    before = yaml.safe_dump(config)
    p = build_plan(config, project)
    assert yaml.safe_dump(config) == before
    assert p.config["results"] == "results"
    assert p.config["device"] == "cpu" and p.config["flac_subtype"] == "PCM_16"
    assert p.config["max_words"] == 80
    assert p.config["runtime"]["queue_depth"] == 2 and p.config["runtime"]["slots"] is None


def test_runtime_defaults_are_written_once_in_the_schema():
    import dataclasses

    from bestofn.schemas import runtime_defaults
    from bestofn.worker.client import Runtime

    defaults = runtime_defaults()
    fields = {f.name: f.default for f in dataclasses.fields(Runtime)}
    assert fields == defaults
    assert Runtime.from_config(None) == Runtime(**defaults)
    assert defaults["idle_timeout_s"] == 300.0 and defaults["start_timeout_s"] == 900.0
