"""The plan's two recipe checks: a speaker floor needs a reference voice in every group it
gates (refused, naming the groups), and Sidon on a 48 kHz-native generator is a warning."""

from __future__ import annotations

import json

import yaml
from helpers import make_tiny_project

from bestofn.cli import main as bestofn
from bestofn.core.recipe_checks import restorer_notes, speaker_gate
from bestofn.util.spec import GroupSpec


def _groups(**refs):
    return {
        tuple(g.split("/")): GroupSpec(*g.split("/"), "Hi there.", n_takes=2, reference_audio=r)
        for g, r in refs.items()
    }


# the scorer that writes spk_sim declares it a reference column (SpeakerScorer)
SPEAKER = {"scorers": [{"backend": "duration"}, {"backend": "wavlm-speaker"}]}


def test_a_spk_sim_gate_without_a_reference_is_refused_naming_the_groups():
    groups = _groups(**{"calm/p1": "v.flac", "happy/p1": None, "happy/p2": None})
    errors, notes = speaker_gate(
        {"filter": "wer < 0.1 AND spk_sim >= 0.86", "score": "1"}, groups, SPEAKER
    )
    assert len(errors) == 1 and not notes
    assert "selection.filter uses spk_sim" in errors[0]
    assert "2 group(s) have no reference voice: happy/p1, happy/p2." in errors[0]
    assert "calm/p1" not in errors[0]
    # in the score only: a note; every group with a voice, or no speaker column: nothing
    errors, notes = speaker_gate({"filter": "wer < 0.1", "score": "norm(spk_sim)"}, groups, SPEAKER)
    assert not errors and "selection.score uses spk_sim" in notes[0]
    assert speaker_gate({"filter": "spk_sim > 0.8", "score": "1"},
                        _groups(**{"calm/p1": "v.flac"}), SPEAKER) == ([], [])  # fmt: skip
    assert speaker_gate({"filter": "wer < 0.1", "score": "1"}, groups, SPEAKER) == ([], [])
    # without the scorer that writes it, spk_sim is no speaker column here
    gate = {"filter": "spk_sim > 0.8", "score": "1"}
    assert speaker_gate(gate, groups, {"scorers": [{"backend": "duration"}]}) == ([], [])
    # a string literal naming the column is no use of it
    assert speaker_gate({"filter": "stop_reason <> 'spk_sim'", "score": "1"}, groups, SPEAKER) == (
        [],
        [],
    )


def test_bestofn_check_refuses_a_speaker_floor_without_references(tmp_path, capsys):
    project = make_tiny_project(tmp_path)  # calm has a voice, happy none
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config["models"]["scorers"] = [{"backend": "duration"}, {"backend": "resemblyzer"}]
    config["selection"]["filter"] = "words_per_s > 0.5 AND speaker_sim >= 0.8"
    path = project / "config/floor.yaml"
    path.write_text(yaml.safe_dump(config))
    assert bestofn(["check", "--config", str(path), "--base", str(project)]) == 2
    err = capsys.readouterr().err
    # the config file is named first, as every refused config field is (error: <file>: <what>)
    assert err.startswith(f"error: {path}: config selection.filter uses speaker_sim (resemblyzer)")
    assert "happy/p1, happy/p2" in err and "calm/" not in err and "Traceback" not in err


def _generator(tmp_path, rate):
    codec = tmp_path / f"codec{rate}"
    codec.mkdir()
    (codec / "config.json").write_text(json.dumps({"sampling_rate": rate}))
    return {"backend": "moss-fast", "options": {"codec_dir": str(codec)}}


def test_sidon_on_a_48k_native_generator_warns_naming_the_file(tmp_path):
    sidon = {"backend": "sidon"}
    [note] = restorer_notes({"generator": _generator(tmp_path, 48000), "restorer": sidon})
    assert "sidon restores a 48000 Hz generator" in note
    assert str(tmp_path / "codec48000" / "config.json") in note
    assert restorer_notes({"generator": _generator(tmp_path, 24000), "restorer": sidon}) == []
    assert restorer_notes({"generator": _generator(tmp_path, 48001)}) == []  # no restorer
