"""How the emotion reaches the generator: the Instruction text a group carries (the emotion
sheet's instruction column, else the generator's instruction option), part of the group's
identity; the plan's warning when every emotion would reach the generator the same way; the
ei_target checks against the Empathic-Insight heads found on disk."""

import json

import pytest
import yaml
from helpers import REPO, write_tsv

from bestofn.backends.base import Generator
from bestofn.cli import main as bestofn
from bestofn.core.plan import PlanError, build_plan, read_sheet
from bestofn.moss.options import check_instruction_option, group_instruction, instruction_text
from bestofn.util.spec import GroupSpec

PLUGIN = "test_conditioning:InstructedGenerator"


class InstructedGenerator(Generator):
    """A generator that takes an ``instruction`` option, as the MOSS ones do (never run)."""

    name = "instructed"

    def __init__(self, device: str = "cpu", instruction="none"):
        self.instruction = instruction


def test_instruction_modes_and_templates():
    args = ("Hope_Enthusiasm_Optimism", "Bright and eager.", "Gloomy.")
    assert instruction_text("none", *args) is None
    assert instruction_text("emotion", *args) == "Hope_Enthusiasm_Optimism"
    assert instruction_text("emotion_description", *args) == "Bright and eager."
    template = "extremely {emotion_words}. {description} Not: {negative_description}"
    assert instruction_text(template, *args) == (
        "extremely hope enthusiasm optimism. Bright and eager. Not: Gloomy."
    )


@pytest.mark.parametrize(
    "value, match",
    [("loud", "use one of none, emotion"), ("be {mood}", r"names \{mood\}"), ("{", "template")],
)
def test_a_bad_instruction_option_is_refused(value, match):
    with pytest.raises(ValueError, match=match):
        check_instruction_option(value, "moss-fast")


@pytest.mark.parametrize("backend", ["moss-fast", "moss-hf"])
def test_the_plan_refuses_a_bad_instruction_as_the_generator_does(backend):
    """One check: the generator's own (check_options), run by the plan before any model loads
    and by the generator when it is built."""
    from bestofn.backends.registry import backend_class
    from bestofn.core.plan import check_options

    entry = {"backend": backend, "options": {"instruction": "be {mood}"}}
    with pytest.raises(PlanError, match=rf"config models.generator: {backend}: .*names \{{mood\}}"):
        check_options("generator", "models.generator", entry)
    with pytest.raises(ValueError, match=r"names \{mood\}"):
        backend_class("generator", backend).check_options(entry["options"])
    check_options("generator", "models.generator", {"backend": backend, "options": {}})


def test_the_plans_instruction_wins_over_the_option():
    spec = GroupSpec("Anger", "p1", "Hi.", 1, emotion_description="Hot.")
    assert group_instruction("emotion_description", spec) == "Hot."
    told = GroupSpec("Anger", "p1", "Hi.", 1, emotion_description="Hot.", extra={"instruction": ""})
    assert group_instruction("emotion_description", told) is None  # the sheet said none
    told.extra["instruction"] = "Shout it."
    assert group_instruction("none", told) == "Shout it."


def project_with(project, instruction="none", rows=None, header=None):
    """The tiny project with the instructed generator and an emotions sheet of ``rows``."""
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config["models"]["generator"] = {"backend": PLUGIN, "options": {"instruction": instruction}}
    if rows is not None:
        write_tsv(project / "config/emotions.tsv", header, rows)
    return config


def test_the_sheets_instruction_column_overrides_the_template(project):
    header = ["emotion", "description", "instruction", "reference_audio"]
    rows = [
        ["calm", "A calm voice.", "", ""],
        ["happy", "A happy voice.", "Laugh through it.", ""],
        ["sad", "A sad voice.", "none", "config/voices/ref.flac"],  # cloning: no instruction
    ]
    config = project_with(project, "extremely {emotion_words}. {description}", rows, header)
    plan = build_plan(config, project)
    extra = {e: plan.groups[(e, "p1")].extra for e in ("calm", "happy", "sad")}
    assert extra["calm"]["instruction"] == "extremely calm. A calm voice."
    assert extra["happy"]["instruction"] == "Laugh through it."
    assert extra["sad"]["instruction"] == ""
    assert group_instruction("emotion", plan.groups[("sad", "p1")]) is None
    # the text is part of the group's identity: a changed template changes the group's params
    config["models"]["generator"]["options"]["instruction"] = "very {emotion}"
    again = build_plan(config, project)
    assert json.loads(again.group_params("calm", "p1"))["extra"]["instruction"] == "very calm"
    assert again.group_params("happy", "p1") == plan.group_params("happy", "p1")


def test_no_instruction_and_no_option_leave_the_identity_as_it_was(project):
    before = build_plan(yaml.safe_load((project / "config/config.yaml").read_text()), project)
    plan = build_plan(project_with(project), project)
    assert all("instruction" not in s.extra for s in plan.groups.values())
    assert plan.group_params("calm", "p1") == before.group_params("calm", "p1")


def test_a_bad_template_fails_the_plan(project):
    with pytest.raises(PlanError, match=r"\{mood\}"):
        build_plan(project_with(project, "be {mood}"), project)


def test_every_emotion_the_same_is_a_warning_naming_the_sheet(project):
    header = ["emotion", "description", "reference_audio"]
    ref = "config/voices/ref.flac"
    same = [["calm", "A calm voice.", ref], ["happy", "A happy voice.", ref]]
    plan = build_plan(project_with(project, "none", same, header), project)
    [warning] = [w for w in plan.warnings if "same way" in w]
    assert str(project / "config/emotions.tsv") in warning and "1 reference voice" in warning
    # an instruction, or a voice of its own per emotion, makes them differ: no warning
    for config in (
        project_with(project, "emotion_description", same, header),
        project_with(project, "none", [same[0], ["happy", "A happy voice.", ""]], header),
    ):
        assert not [w for w in build_plan(config, project).warnings if "same way" in w]


def test_bestofn_check_prints_the_warning(project, capsys):
    header = ["emotion", "description", "reference_audio"]
    ref = "config/voices/ref.flac"
    config = project_with(project, "none", [["calm", "x", ref], ["happy", "y", ref]], header)
    path = project / "config/instructed.yaml"
    path.write_text(yaml.safe_dump(config))
    assert bestofn(["check", "--config", str(path), "--base", str(project)]) == 0
    assert "every emotion reaches the generator the same way" in capsys.readouterr().err


def test_the_example_voice_acting_sheets_read_and_map_to_the_published_heads():
    from bestofn.backends.empathic import resolve_head
    from bestofn.fakes.empathic import NAMED_EMOTION_HEADS

    emotions = read_sheet(REPO / "config/voice_acting/emotions.tsv", "emotions")
    prompts = read_sheet(REPO / "config/voice_acting/prompts.tsv", "prompts")
    assert len(emotions) == 40 and len(prompts) >= 4
    assert all(r["description"] and r["negative_description"] for r in emotions)
    heads = [r["ei_head"] for r in emotions]
    assert len(set(heads)) == 40
    assert [resolve_head(r["emotion"], r["ei_head"], heads) for r in emotions] == heads
    # the published names we hold elsewhere are among them (emotion heads only)
    assert {"Anger", "Jealousy_&_Envy", "Hope_Enthusiasm_Optimism"} <= set(heads)
    assert set(NAMED_EMOTION_HEADS) - {"Gender"} <= set(heads)


def project_with_heads(project, selection, ei_heads=("", "")):
    """The tiny project scored by Empathic-Insight with heads named Anger and Jealousy_&_Envy
    (their names are all the plan reads) and ``selection``."""
    heads = project / "heads"
    heads.mkdir(exist_ok=True)
    for name in ("Anger", "Jealousy_&_Envy", "score_overall_quality"):
        (heads / f"model_{name}_best.pth").write_bytes(b"")
    (project / "encoder").mkdir(exist_ok=True)
    write_tsv(
        project / "config/emotions.tsv",
        ["emotion", "description", "ei_head"],
        [["calm", "A calm voice.", ei_heads[0]], ["angry", "An angry voice.", ei_heads[1]]],
    )
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    options = {"encoder_path": str(project / "encoder"), "heads_path": str(heads)}
    config["models"]["scorers"].append({"backend": "empathic-insight", "options": options})
    config["selection"] = selection
    return config


TARGETED = {"filter": "words_per_s > 0.5", "score": "norm(ei_target)"}


def test_an_unmapped_emotion_is_refused_when_the_selection_uses_ei_target(project):
    config = project_with_heads(project, TARGETED)
    with pytest.raises(PlanError) as e:
        build_plan(config, project)
    message = str(e.value)
    # calm maps to no head; angry does not match Anger either (names are matched, not meant)
    assert "emotion(s) angry, calm map to no Empathic-Insight head" in message
    assert "Anger, Jealousy_&_Envy" in message and "score_overall" not in message
    assert "emotions.tsv" in message


def test_the_sheets_ei_head_maps_an_emotion_and_reaches_the_spec(project):
    config = project_with_heads(project, TARGETED, ("Jealousy & Envy", "Anger"))
    plan = build_plan(config, project)
    assert plan.groups[("angry", "p1")].extra["ei_head"] == "Anger"
    assert plan.groups[("calm", "p1")].extra["ei_head"] == "Jealousy & Envy"


def test_an_unmapped_emotion_is_a_note_when_the_selection_does_not_use_ei_target(project):
    config = project_with_heads(project, {"filter": "true", "score": "words_per_s"}, ("", "Anger"))
    notes = [w for w in build_plan(config, project).warnings if "no Empathic-Insight head" in w]
    assert len(notes) == 1 and notes[0].startswith("note:") and "calm" in notes[0]
    assert "angry" not in notes[0]


def test_a_held_out_ei_target_counts_as_used(project):
    selection = {"filter": "true", "score": "words_per_s", "held_out": ["ei_target"]}
    with pytest.raises(PlanError, match="calm"):
        build_plan(project_with_heads(project, selection, ("", "Anger")), project)


def test_bestofn_check_refuses_norm_of_a_missing_column_by_name(project, capsys):
    selection = {"filter": "true", "score": "norm(ei_targte) + norm(ei_anger)"}
    config = project_with_heads(project, selection, ("Jealousy_&_Envy", "Anger"))
    path = project / "config/typo.yaml"
    path.write_text(yaml.safe_dump(config))
    assert bestofn(["check", "--config", str(path), "--base", str(project)]) == 2
    err = capsys.readouterr().err
    assert "norm(ei_targte) names 'ei_targte'" in err and "ei_target" in err
    # spelt right, the same config passes: the heads' columns are known before any load
    config["selection"]["score"] = "norm(ei_target) + norm(ei_anger)"
    path.write_text(yaml.safe_dump(config))
    assert bestofn(["check", "--config", str(path), "--base", str(project)]) == 0


class RecordingBuilder:
    """A prompt builder that keeps what it was asked to build."""

    def rows(self, text, **fields):
        self.fields = fields
        return fields


@pytest.mark.parametrize("backend", ["moss_fast", "moss_hf_common"])
def test_both_moss_generators_put_the_groups_instruction_in_the_prompt(backend):
    import importlib

    module = importlib.import_module(f"bestofn.backends.{backend}")
    cls = module.MossFastGenerator if backend == "moss_fast" else module.MossHFBase
    gen = cls.__new__(cls)
    gen.options = {**module.DEFAULTS, "instruction": "extremely {emotion_words}."}
    from bestofn.moss.budget import FrameBudget

    gen.budget = FrameBudget()  # the pacing dial's defaults
    spec = GroupSpec("Fatigue_Exhaustion", "p1", "Hi.", 1, emotion_description="Drained.")
    told = GroupSpec("Anger", "p1", "Hi.", 1, extra={"instruction": "Shout it."})
    if backend == "moss_fast":
        gen.prompt_builder = RecordingBuilder()
        assert gen.prompt(spec)["instruction"] == "extremely fatigue exhaustion."
        assert gen.prompt(told)["instruction"] == "Shout it."
        assert gen.prompt(spec)["tokens"] == 96  # the hint: one word, raised to min_tokens
    else:  # the published processor's build_user_message gets what _instruction gives
        assert gen._instruction(spec) == "extremely fatigue exhaustion."
        assert gen._instruction(told) == "Shout it."
