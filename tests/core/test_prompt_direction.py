"""Per-prompt direction: the prompts sheet's instruction, vocal_burst and language columns.
The Instruction is the prompt's cell, else the emotion's, else the option (whose template
reads {vocal_burst} and {emotion_synonyms}); only the resolved text is the group's identity,
so a changed template replans exactly the groups whose text changed. A prompt's language
reaches the group (and the generator's Language field); an English-only ASR is refused."""

import pytest
import yaml
from helpers import write_tsv

from bestofn.backends.base import Generator
from bestofn.core.plan import PlanError, build_plan
from bestofn.moss.options import instruction_text
from bestofn.moss.prompt import language_tag

PLUGIN = "test_prompt_direction:InstructedGenerator"
TEMPLATE = "extremely {emotion_synonyms}. includes this vocal burst: {vocal_burst}."


class InstructedGenerator(Generator):
    """A generator that takes an ``instruction`` option, as the MOSS ones do (never run)."""

    name = "instructed"

    def __init__(self, device: str = "cpu", instruction="none"):
        self.instruction = instruction


def sheets(project, prompt_rows, emotion_rows=None):
    header = ["prompt_id", "text", "instruction", "vocal_burst", "language"]
    write_tsv(project / "config/prompts.tsv", header, prompt_rows)
    if emotion_rows is not None:
        write_tsv(project / "config/emotions.tsv",
                  ["emotion", "description", "instruction", "synonyms"], emotion_rows)  # fmt: skip


def config_for(project, instruction=TEMPLATE, scorers=None):
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config["models"]["generator"] = {"backend": PLUGIN, "options": {"instruction": instruction}}
    if scorers is not None:
        config["models"]["scorers"] = scorers
    return config


EMOTIONS = [
    ["Hope_Enthusiasm_Optimism", "Bright.", "", "hope, optimism"],
    ["Anger", "Hot.", "Seethe, then explode.", ""],
]


def test_the_template_reads_the_prompts_burst_and_the_emotions_synonyms():
    assert instruction_text(TEMPLATE, "Hope_Enthusiasm_Optimism", vocal_burst="nervous laugh",
                            synonyms="hope, optimism") == (
        "extremely hope, optimism. includes this vocal burst: nervous laugh."
    )  # fmt: skip
    # no synonyms in the sheet: the emotion's own words
    assert instruction_text("extremely {emotion_synonyms}.", "Jealousy_Envy") == (
        "extremely jealousy envy."
    )


def test_precedence_prompt_then_emotion_then_option(project):
    sheets(project, [
        ["p1", "We made it through the storm.", "", "nervous laugh", ""],
        ["p2", "Get out of my house right now.", "Whisper it, cold as ice.", "", ""],
        ["p3", "Nobody moves until I say so.", "none", "", ""],
    ], EMOTIONS)  # fmt: skip
    plan = build_plan(config_for(project), project)
    instr = {k: s.extra["instruction"] for k, s in plan.groups.items()}
    hope = "Hope_Enthusiasm_Optimism"
    assert (
        instr[(hope, "p1")] == "extremely hope, optimism. includes this vocal burst: nervous laugh."
    )
    assert instr[("Anger", "p1")] == "Seethe, then explode."  # the emotion's cell beats the option
    assert instr[(hope, "p2")] == instr[("Anger", "p2")] == "Whisper it, cold as ice."  # prompt
    assert instr[(hope, "p3")] == instr[("Anger", "p3")] == ""  # the prompt says none
    assert not any("vocal_burst" in w for w in plan.warnings)  # p2, p3 have their own text
    sheets(project, [["p1", "We made it through the storm.", "", "", ""]], EMOTIONS)
    plan = build_plan(config_for(project), project)
    assert any("reads {vocal_burst}, but prompt(s) p1 have no vocal_burst" in w
               for w in plan.warnings)  # fmt: skip


def test_a_changed_template_replans_only_the_groups_whose_text_changed(project):
    sheets(project, [
        ["p1", "We made it through the storm.", "", "nervous laugh", ""],
        ["p2", "Get out of my house right now.", "Whisper it, cold as ice.", "", ""],
    ], EMOTIONS)  # fmt: skip
    before = build_plan(config_for(project), project)
    after = build_plan(config_for(project, TEMPLATE.replace("extremely", "utterly")), project)
    changed = {k for k in before.groups if before.group_identity(*k) != after.group_identity(*k)}
    # Anger's groups carry the emotion's own text, p2's groups the prompt's: only Hope/p1 moves
    assert changed == {("Hope_Enthusiasm_Optimism", "p1")}
    # a burst is identity only through the text it makes: a template without {vocal_burst}
    plain = "extremely {emotion_synonyms}."
    sheets(project, [["p1", "We made it through the storm.", "", "a sigh", ""],
                     ["p2", "Get out of my house right now.", "", "", ""]], EMOTIONS)  # fmt: skip
    a = build_plan(config_for(project, plain), project)
    sheets(project, [["p1", "We made it through the storm.", "", "a gasp", ""],
                     ["p2", "Get out of my house right now.", "", "", ""]], EMOTIONS)  # fmt: skip
    b = build_plan(config_for(project, plain), project)
    assert all(a.group_identity(*k) == b.group_identity(*k) for k in a.groups)


def test_the_sheets_without_the_new_columns_plan_as_before(project):
    """Old sheets keep their identities: English, and the option's text."""
    config = config_for(project, "extremely {emotion_words}.")
    plan = build_plan(config, project)
    spec = plan.groups[("calm", "p1")]
    assert spec.language == "en" and spec.extra["instruction"] == "extremely calm."


def test_a_prompts_language_reaches_the_group_and_the_generators_tag(project):
    sheets(project, [["p1", "C’est un os. Un vrai.", "", "", "fr"],
                     ["p2", "Scheiße, hinter mir, bitte nicht.", "", "", "de"],
                     ["p3", "Míralos, qué felices están todos.", "", "", "es"]])  # fmt: skip
    plan = build_plan(config_for(project), project)
    langs = {p: plan.groups[("calm", p)].language for p in ("p1", "p2", "p3")}
    assert langs == {"p1": "fr", "p2": "de", "p3": "es"}
    assert [language_tag(v) for v in langs.values()] == ["French", "German", "Spanish"]
    assert (language_tag("pt-BR"), language_tag("en_GB")) == ("Portuguese", "English")
    moved = {p: plan.group_identity("calm", p) for p in langs}
    sheets(project, [["p1", "C’est un os. Un vrai.", "", "", "en"],
                     ["p2", "Scheiße, hinter mir, bitte nicht.", "", "", "de"],
                     ["p3", "Míralos, qué felices están todos.", "", "", "es"]])  # fmt: skip
    again = build_plan(config_for(project), project)
    assert [p for p in langs if again.group_identity("calm", p) != moved[p]] == ["p1"]


def test_a_bad_language_code_is_named(project):
    sheets(project, [["p1", "Bonjour à tous.", "", "", "French"]])
    with pytest.raises(PlanError, match=r"prompts.tsv line 2: field 'language' \('French'\)"):
        build_plan(config_for(project), project)


def test_an_english_only_asr_refuses_other_languages(project):
    sheets(project, [["p1", "Good morning to you all.", "", "", ""],
                     ["p2", "C’est un os. Un vrai.", "", "", "fr"]])  # fmt: skip
    whisper = [{"backend": "whisper-asr"}]
    with pytest.raises(PlanError, match=r"p2 \(fr\) are not English, and scorer whisper-asr"):
        build_plan(config_for(project, scorers=whisper), project)
    sheets(project, [["p1", "Good morning to you all.", "", "", "en"]])
    build_plan(config_for(project, scorers=whisper), project)  # English: fine


def test_the_moss_prompt_carries_the_groups_language_and_direction(project):
    """A plan's group, handed to moss-fast (tiny random weights, byte tokenizer): its prompt's
    Language and Instruction fields are the prompt row's."""
    from bestofn.fakes.moss import build

    sheets(project, [["p1", "C’est un os. Un vrai.", "", "gasp", "fr"]],
           [["Fear", "Afraid.", "", "fear, dread"]])  # fmt: skip
    spec = build_plan(config_for(project), project).groups[("Fear", "p1")]
    gen = build("cpu", size="tiny", instruction="none")
    ids = gen.prompt(spec)[:, 0].tolist()
    body = bytes(t for t in ids if t < 256).decode("utf-8")
    assert "- Instruction:\nextremely fear, dread. includes this vocal burst: gasp.\n" in body
    assert "- Language:\nFrench\n- Text:\nC’est un os. Un vrai.\n" in body


def test_direction_a_generator_cannot_take_is_noted(project):
    """piper takes no instruction: the plan runs, and says the column is unused."""
    sheets(project, [["p1", "Good morning to you all.", "Whisper it.", "sigh", ""]])
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    plan = build_plan(config, project)
    assert "instruction" not in plan.groups[("calm", "p1")].extra
    assert any("the 'instruction' column is unused: generator 'piper'" in w for w in plan.warnings)
