"""`bestofn prompts import`: the three public prompt sets, in their published layouts (tiny
fixtures built here), read from a local folder and through the hub stand-in on loopback;
parsed as their sources describe (quoted dialogue, bracket tags, the head renames, the 4-word
floor); drawn reproducibly by seed; bad input named by file, exit 2, nothing written."""

import csv
import io
import json
import os
import subprocess
import sys
import tarfile
from http.server import ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest
import yaml
from helpers import Hub, sha

from bestofn.backends.base import Generator
from bestofn.cli import main as bestofn
from bestofn.core.plan import build_plan, read_sheet


class InstructedGenerator(Generator):
    """A generator that takes an ``instruction`` option, as the MOSS ones do (never run)."""

    name = "instructed"

    def __init__(self, device: str = "cpu", instruction="none"):
        self.instruction = instruction


def scene(i, language, emotions, prompt, key="emotions_sampled"):
    return {"id": i, "pathway": "SIT (Situation)", "language": language,
            "sample_info": {"challenge_title": f"t{i}", key: emotions},
            "dramabox_prompt": prompt}  # fmt: skip


SCENES = [
    scene(1, "English", "Hope/Optimism (clearly present), Fear (slightly present)",
          'A woman, studio recording.\n\n(gasping) "Let go of it. [breath] You don\'t get to '
          'dig it up again." (grunting) "This ends tonight."\n\nCUT TO:\n\nThe same voice.'),
    scene(2, "French", "Astonishment/Surprise (extremely present)",
          'A woman.\n\n(gasping) "Non... c’est pas possible." (cracks) "C’est un os. Un vrai."'),
    scene(3, "Spanish", "Jealousy & Envy (clearly present), Pleasure/Ecstasy (clearly present)",
          'A woman.\n\n(exhale) "Qué noche tan bonita." (swallows) "Míralos, qué felices."'),
    scene(4, "German", "Fear (slightly present)",
          'A teenager.\n\n(clicking) "Alter, die sind toast." (whisper) "Scheiße... hinter mir."'),
    scene(5, "English", "Fear (clearly present)", 'A man.\n\n(shouting) "Max! Max!"'),  # 2 words
    scene(6, "English", "Anger (clearly present)", "A man, furious, about to shout at"),  # cut off
]  # fmt: skip
ARCHETYPES = [  # the archetype files name their emotions under sample_info.emotions
    scene(1, "German", "Intoxication/Altered States (very intensely present)",
          'A woman.\n\n(dreamy) "Ich liege hier im Gras und denke nur an dich."', key="emotions"),
    scene(2, "English", "Fear (extremely present)",
          'A man.\n\n(low) "Nobody leaves this room until I say so."', key="emotions"),
]  # fmt: skip


PHYSICAL = [  # the acting-challenge and extreme-physical files name no emotion
    {"id": 1, "language": "English", "sample_info": {"challenge_title": "The Last Thin Air"},
     "dramabox_prompt": 'A boy.\n\n(gasping) "Can\'t breathe, the tank is gone, move!"'},
    {"id": 13, "language": "English", "sample_info": {}, "dramabox_prompt": "A "},  # cut off
    {"id": 14, "sample_info": {}, "dramabox_prompt": ""},  # empty; no language: the file's
]  # fmt: skip


def dramabox_clone(root: Path, scenes=SCENES, archetypes=ARCHETYPES, physical=()) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "data/dramabox_sit_situation.json").write_text(json.dumps(scenes, ensure_ascii=False))
    (root / "data/dramabox_cc2c_archetype_de.json").write_text(json.dumps(archetypes))
    if physical:
        (root / "data/dramabox_extreme_physical.json").write_text(json.dumps(physical))
    (root / "data/archetypes.json").write_text("{}")  # other data files are not read
    return root


def run(argv, capsys):
    rc = bestofn(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def sheet(path):
    return {r["prompt_id"]: r for r in read_sheet(path, "prompts")}


def test_dramabox_from_a_local_clone(tmp_path, capsys):
    clone = dramabox_clone(tmp_path / "Voice-Acting-Pipeline", physical=PHYSICAL)
    rc, out, err = run(["prompts", "import", str(clone), "--out", str(tmp_path / "s")], capsys)
    assert rc == 0, err
    assert "4 skipped" in out and "7 written" in out  # 11 scenes: 3 cut off, one of 2 words
    prompts = sheet(tmp_path / "s/prompts.tsv")
    first = prompts["db-sit_situation-1"]
    assert first["text"] == "Let go of it. You don't get to dig it up again. This ends tonight."
    assert first["instruction"].startswith('A woman, studio recording. (gasping) "Let go of it.')
    assert first["instruction"].endswith("CUT TO: The same voice.")  # the whole prompt, one line
    assert first["emotions"] == "Hope_Enthusiasm_Optimism"  # the first emotion, renamed
    assert first["language"] == "en"
    assert prompts["db-sit_situation-2"]["language"] == "fr"
    assert (
        prompts["db-sit_situation-2"]["text"] == "Non... c’est pas possible. C’est un os. Un vrai."
    )
    assert prompts["db-sit_situation-3"]["emotions"] == "Jealousy_Envy"
    assert prompts["db-sit_situation-4"]["language"] == "de"
    assert prompts["db-cc2c_archetype_de-1"]["emotions"] == (
        "Intoxication_Altered_States_of_Consciousness"
    )
    assert prompts["db-extreme_physical-1"]["emotions"] == "unlabelled"
    emotions = {r["emotion"]: r for r in read_sheet(tmp_path / "s/emotions.tsv", "emotions")}
    assert emotions["Jealousy_Envy"]["ei_head"] == "Jealousy_&_Envy"
    assert emotions["unlabelled"]["ei_head"] == ""
    assert set(emotions) == {p["emotions"] for p in prompts.values()}
    info = json.loads((tmp_path / "s/import.json").read_text())
    assert info["set"] == "dramabox" and info["commit"] is None and info["skipped_short"] == 4
    assert len(info["files"]) == 3


def test_long_prompts_are_noted_or_left_out(tmp_path, capsys):
    line = " ".join(["word"] * 90)
    fear = "Fear (clearly present)"
    scenes = [scene(1, "English", fear, f'A man. "{line}"'),
              scene(2, "English", fear, 'A man. "Four short words here."')]  # fmt: skip
    clone = dramabox_clone(tmp_path / "clone", scenes, [])
    rc, out, err = run(["prompts", "import", str(clone), "--out", str(tmp_path / "a")], capsys)
    assert rc == 0 and "note: 1 written prompts have more than 80 words" in err
    assert len(sheet(tmp_path / "a/prompts.tsv")) == 2
    argv = ["prompts", "import", str(clone), "--out", str(tmp_path / "b"), "--max-words", "80"]
    rc, out, err = run(argv, capsys)
    assert rc == 0 and "1 prompts left out: more than --max-words 80" in out
    assert "written prompts have more than" not in err  # left out: no note about them
    # the sets name no class: every emotion is speech, and the import says to mark them
    assert "every emotion's class is speech" in err
    assert {r["class"] for r in read_sheet(tmp_path / "b/emotions.tsv", "emotions")} == {"speech"}
    assert list(sheet(tmp_path / "b/prompts.tsv")) == ["db-sit_situation-2"]
    assert json.loads((tmp_path / "b/import.json").read_text())["skipped_long"] == 1


def test_the_draw_is_reproducible_by_seed(tmp_path, capsys):
    scenes = [scene(i, "English", "Fear (clearly present)", f'A man. "Line number {i} is here."')
              for i in range(40)]  # fmt: skip
    clone = dramabox_clone(tmp_path / "clone", scenes, [])
    drawn = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        argv = ["prompts", "import", str(clone), "--out", str(tmp_path / name),
                "--per-emotion", "5", "--seed", str(seed)]  # fmt: skip
        assert run(argv, capsys)[0] == 0
        drawn[name] = (tmp_path / name / "prompts.tsv").read_bytes()
    assert drawn["a"] == drawn["b"]
    assert drawn["a"] != drawn["c"]
    assert len(sheet(tmp_path / "a/prompts.tsv")) == 5


def emotion_prompts_tar(path: Path, files: dict) -> Path:
    """A tar in the published layout: <top>/speaker/emotion/vocal_burst.json."""
    with tarfile.open(path, "w") as tar:
        for name, value in files.items():
            data = json.dumps(value).encode()
            info = tarfile.TarInfo(f"geminittsprompts-output-en/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


EMOTION_FILES = {
    "alice/Hope_Optimism/nervous_laugh.json": [
        "[excited] We made it, we actually made it through the storm!",
        "Tomorrow is going to be so much better, I can feel it.",
        "Yes!",  # one word: skipped
    ],
    "alice/Jealousy_Envy/bitter_scoff.json": {"prompt": "Of course she got the promotion again."},
    "bob/Anger/angry_growl.json": ["Get out of my house right now, all of you."],
}


def emotion_prompts_tar_with_manifest(path: Path) -> Path:
    """The published layout, plus a JSON file above it (not a prompt file)."""
    emotion_prompts_tar(path, EMOTION_FILES)
    with tarfile.open(path, "a") as tar:
        data = b'{"files": 3}'
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def casting_csv() -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["instruction", "text"])
    w.writerow(
        ["A gruff sea captain, weathered and loud.", "(SIGH) Hoist the sails, we leave at dawn."]
    )
    w.writerow(["A shy librarian, whispering.", "Please keep your voices down in here."])
    w.writerow(["A child.", "No way!"])  # 2 words: skipped
    return buf.getvalue().encode()


@pytest.fixture
def hub(tmp_path):
    """The hub stand-in serving the two hub datasets; the env that points huggingface_hub at it."""
    tar = emotion_prompts_tar_with_manifest(tmp_path / "g.tar")
    Hub.files = {
        "laion/voice-acting-prompts": {"geminittsprompts-output-en.tar": tar.read_bytes(),
                                        "other-set.tar": b"not fetched", "README.md": b"# card\n"},
        "laion/voice-acting-instructions": {"casting/part-000.csv": casting_csv()},
    }  # fmt: skip
    Hub.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
           "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "0",
           "HF_HUB_DISABLE_TELEMETRY": "1"}  # fmt: skip
    yield env
    server.shutdown()


def cli(env, *argv):
    return subprocess.run([sys.executable, "-m", "bestofn.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_voice_acting_prompts_through_the_hub(tmp_path, hub):
    out = tmp_path / "sheets"
    proc = cli(hub, "prompts", "import", "laion/voice-acting-prompts", "--out", str(out),
               "--revision", "main", "--include", "geminittsprompts-output-en.tar")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "1 skipped" in proc.stdout and "4 written" in proc.stdout
    info = json.loads((out / "import.json").read_text())
    assert info["commit"] == sha("laion/voice-acting-prompts") and info["revision"] == "main"
    assert info["files"] == ["geminittsprompts-output-en.tar"]  # not the other archive
    fetched = {p for method, p in Hub.requests if method == "GET" and "/resolve/" in p}
    assert fetched == {f"/datasets/laion/voice-acting-prompts/resolve/{info['commit']}/"
                       "geminittsprompts-output-en.tar"}  # at the resolved commit  # fmt: skip
    prompts = sheet(out / "prompts.tsv")
    hope = prompts["alice-Hope_Optimism-nervous_laugh-0"]
    assert hope["text"] == "We made it, we actually made it through the storm!"  # tag stripped
    assert hope["vocal_burst"] == "nervous laugh" and hope["language"] == "en"
    assert hope["emotions"] == "Hope_Enthusiasm_Optimism" and hope["instruction"] == ""
    assert prompts["alice-Jealousy_Envy-bitter_scoff-0"]["emotions"] == "Jealousy_Envy"
    emotions = {r["emotion"]: r for r in read_sheet(out / "emotions.tsv", "emotions")}
    assert emotions["Hope_Enthusiasm_Optimism"]["synonyms"] == "hope optimism"  # the folder's
    assert emotions["Jealousy_Envy"]["ei_head"] == "Jealousy_&_Envy"
    assert set(emotions) == {"Anger", "Hope_Enthusiasm_Optimism", "Jealousy_Envy"}


def test_voice_acting_instructions_through_the_hub(tmp_path, hub):
    out = tmp_path / "sheets"
    proc = cli(hub, "prompts", "import", "laion/voice-acting-instructions", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "1 skipped" in proc.stdout and "2 written" in proc.stdout
    prompts = sheet(out / "prompts.tsv")
    captain = prompts["vai-part-000-2"]
    assert captain["instruction"] == "A gruff sea captain, weathered and loud."
    assert captain["text"] == "(SIGH) Hoist the sails, we leave at dawn."  # cues kept (WER skips)
    assert {p["emotions"] for p in prompts.values()} == {"unlabelled"}  # no emotion labels
    emotions = read_sheet(out / "emotions.tsv", "emotions")
    assert [e["emotion"] for e in emotions] == ["unlabelled"] and emotions[0]["ei_head"] == ""


def test_a_set_the_hub_does_not_have_is_named(tmp_path, hub):
    out = tmp_path / "o"
    proc = cli(hub, "prompts", "import", "laion/no-such-set", "--out", str(out))
    assert proc.returncode == 2 and proc.stderr.startswith("error: laion/no-such-set: not a")
    proc = cli(hub, "prompts", "import", "laion/no-such-set", "--set", "voice-acting-prompts",
               "--out", str(out))  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: laion/no-such-set@main: cannot fetch the dataset")
    assert "Traceback" not in proc.stderr and not out.exists()


def test_an_unreachable_hub_is_named(tmp_path, hub):
    import socket

    with socket.socket() as closed:  # a port nothing listens on once this block ends
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {**hub, "HF_ENDPOINT": f"http://127.0.0.1:{port}"}
    proc = cli(env, "prompts", "import", "laion/voice-acting-prompts", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: laion/voice-acting-prompts@main: cannot fetch")
    assert not (tmp_path / "o").exists()


def test_a_local_copy_of_a_hub_set(tmp_path, capsys):
    folder = tmp_path / "copy"
    folder.mkdir()
    lines = {"c/Anger/growl.json": ["Raus aus meinem Haus, alle zusammen!"]}
    emotion_prompts_tar(folder / "geminittsprompts-output-de.tar", lines)
    rc, out, err = run(["prompts", "import", str(folder), "--out", str(tmp_path / "s")], capsys)
    assert rc == 0, err
    (row,) = sheet(tmp_path / "s/prompts.tsv").values()
    assert row["language"] == "de"  # the archive's -de suffix


def test_a_local_casting_file_with_languages(tmp_path, capsys):
    rows = [{"instruction": "Une voix douce.", "text": "Je t’attendrai ici, c’est promis.",
             "language": "French"},
            {"instruction": "A calm voice.", "text": "I will wait for you right here.",
             "language": "en"}]  # fmt: skip
    _write(tmp_path / "c/part.parquet", parquet_bytes(rows))
    rc, out, err = run(["prompts", "import", str(tmp_path / "c"), "--out", str(tmp_path / "s")],
                       capsys)  # fmt: skip
    assert rc == 0, err
    langs = {r["text"]: r["language"] for r in sheet(tmp_path / "s/prompts.tsv").values()}
    assert langs == {
        "Je t’attendrai ici, c’est promis.": "fr",
        "I will wait for you right here.": "en",
    }


def parquet_bytes(rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


FIVE_WORDS = 'A man. "One two three four five."'


def one_scene(emotions="Fear (clearly present)", prompt=FIVE_WORDS, lang="English"):
    return lambda d: dramabox_clone(d / "c", [scene(1, lang, emotions, prompt)], [])


def one_file(name, data):
    return lambda d: _write(d / "c" / name, data)


def one_tar(files, corrupt=False):
    def build(d):
        tar = emotion_prompts_tar(_dir(d / "c") / "g-en.tar", files)
        return _corrupt_member(tar) if corrupt else tar

    return build


MEMBER = "g-en.tar:geminittsprompts-output-en/a/"
ROWS = [{"instruction": "A.", "text": "Four words right here."}, {"instruction": "B.", "text": ""}]
BAD_INPUTS = {
    "missing": (lambda d: d / "nowhere", "nowhere", "no such file or folder"),
    "json": (one_file("data/dramabox_x.json", b'[{"id": 1,'), "dramabox_x.json", "malformed JSON"),
    "head": (one_scene("Boredom (clearly present)"), "dramabox_sit_situation.json item 0 (id 1)",
             "'Boredom' maps to no Empathic-Insight head"),
    "no-prompt": (lambda d: dramabox_clone(d / "c", [{"id": 1, "language": "English"}], []),
                  "item 0 (id 1)", "no dramabox_prompt text"),
    "emotions": (one_scene(emotions=["Fear"]), "item 0 (id 1)", "emotions are not text"),
    "language": (one_scene(lang="Klingon"), "item 0 (id 1)", "language 'Klingon'"),
    "csv": (one_file("rows.csv", b'instruction,text\n"a gruff,"x" y\n'), "rows.csv line",
            "malformed CSV"),
    "csv-empty-text": (one_file("rows.csv", b"instruction,text\nA shy librarian.,\n"),
                       "rows.csv row 2", "empty text"),
    "csv-columns": (one_file("rows.csv", b"prompt,line\na,b\n"), "rows.csv",
                    "no 'instruction', 'text' column"),
    "parquet": (one_file("rows.parquet", b"PAR1 not really"), "rows.parquet", "malformed parquet"),
    "parquet-empty-text": (one_file("rows.parquet", parquet_bytes(ROWS)), "rows.parquet row 1",
                           "empty text"),
    "csv-language": (one_file("rows.csv", b"instruction,text,language\nA.,One two three.,xx\n"),
                     "rows.csv row 2", "language 'xx' is none of en (English)"),
    "tar-json": (one_tar({"a/Anger/growl.json": "x"}, corrupt=True), MEMBER + "Anger/growl.json",
                 "malformed JSON"),
    "tar-head": (one_tar({"a/Boredom/sigh.json": ["One two three four."]}),
                 MEMBER + "Boredom/sigh.json", "'Boredom' maps to no"),
    "tar-empty": (one_tar({"a/Anger/growl.json": ["[shouting]"]}), MEMBER + "Anger/growl.json",
                  "text 0 is empty"),
}  # fmt: skip


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_input_is_named_and_writes_nothing(tmp_path, capsys, name):
    build, where, what = BAD_INPUTS[name]
    source = build(tmp_path)
    source = tmp_path / "c" if name != "missing" else source
    out = tmp_path / "out"
    rc, _, err = run(["prompts", "import", str(source), "--out", str(out)], capsys)
    assert rc == 2
    assert err.startswith("error: ") and where in err and what in err, err
    assert "Traceback" not in err
    assert not out.exists()


def test_an_out_that_is_a_file_is_named(tmp_path, capsys):
    clone = dramabox_clone(tmp_path / "clone")
    (tmp_path / "out").write_text("mine")
    rc, _, err = run(["prompts", "import", str(clone), "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and err.startswith(f"error: {tmp_path / 'out'}: --out is a file")
    assert (tmp_path / "out").read_text() == "mine"


def test_a_failed_import_leaves_earlier_sheets_whole(tmp_path, capsys):
    clone = dramabox_clone(tmp_path / "clone")
    out = tmp_path / "s"
    assert run(["prompts", "import", str(clone), "--out", str(out)], capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (clone / "data/dramabox_sit_situation.json").write_text("[{")
    assert run(["prompts", "import", str(clone), "--out", str(out)], capsys)[0] == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temp files either


def test_the_imported_sheets_plan_with_language_and_direction(tmp_path, capsys):
    """The sheets an import writes run through the plan: each prompt only under its own
    emotion, its language on the group, the DramaBox prompt as the Instruction (prompt wins
    over the option's template)."""
    clone = dramabox_clone(tmp_path / "clone")
    assert run(["prompts", "import", str(clone), "--out", str(tmp_path / "config")], capsys)[0] == 0
    config = {
        "emotions": "config/emotions.tsv", "prompts": "config/prompts.tsv", "takes": 2,
        "models": {"generator": {"backend": "test_prompt_import:InstructedGenerator",
                                 "options": {"instruction": "extremely {emotion_synonyms}."}},
                   "restorer": {"backend": "identity"}, "scorers": [{"backend": "duration"}]},
        "selection": {"filter": "true", "score": "1"},
    }  # fmt: skip
    plan = build_plan(yaml.safe_load(yaml.safe_dump(config)), tmp_path)
    assert len(plan.groups) == 6  # one emotion per prompt, never the cross product
    fr = plan.groups[("Astonishment_Surprise", "db-sit_situation-2")]
    assert fr.language == "fr"
    assert fr.extra["instruction"].startswith('A woman. (gasping) "Non...')


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _corrupt_member(tar_path: Path):
    """Rewrite the archive with its one member's JSON cut short."""
    with tarfile.open(tar_path) as tar:
        (m,) = tar.getmembers()
    data = b'["cut'
    with tarfile.open(tar_path, "w") as tar:
        m.size = len(data)
        tar.addfile(m, io.BytesIO(data))
    return tar_path
