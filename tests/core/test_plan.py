"""Bad input gets a clear error naming the file, line and field, before any model loads."""

from pathlib import Path

import pytest
import yaml
from helpers import tiny_config, write_tsv

from bestofn.core.plan import PlanError, build_plan
from bestofn.select.base import SelectionError
from bestofn.weights.paths import weight_options
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
    from helpers import REPO

    from bestofn.core.config import load_config

    config = load_config(REPO / "config/recipes/base.yaml")
    config["emotions"] = "config/emotions.tsv"
    config["prompts"] = "config/prompts.tsv"
    assert config["weights_root"] == "/models" and not Path("/models").exists()
    with pytest.raises(PlanError, match="config field weights_root: '/models'"):
        build_plan(config, project)
    (project / "models").mkdir()  # an empty weights root: every path under it is missing
    config["weights_root"] = "models"
    with pytest.raises(PlanError) as err:
        build_plan(config, project)
    text = str(err.value)
    weights = project / "models"
    assert f"generator moss-fast: options.model_dir = {weights}/MOSS-TTS-Local-Tr" in text
    assert "scorer parakeet: options.model_path" in text
    assert "scorer empathic-insight: options.heads_path" in text
    n_paths = sum(1 for *_, key, _ in weight_options(config["models"]))
    assert text.count("\n") == n_paths == 12  # every missing path, not just the first


def test_runtime_knobs_are_not_group_identity(project):
    base = tiny_config()["models"]
    asr = {"backend": "whisper-asr", "options": {"beam_size": 1}}
    base = {**base, "scorers": [{"backend": "duration"}, asr]}
    faster = {**base, "scorers": [{"backend": "duration"}, {**asr, "runtime": {"cpu_threads": 2}}]}
    other = {**base, "generator": {"backend": "piper", "options": {"noise_scale": 0.3}}}
    assert plan(project, models=faster).models_params == plan(project, models=base).models_params
    assert plan(project, models=other).models_params != plan(project, models=base).models_params


# --- sheets as spreadsheets save them ---------------------------------------------------------


def test_sheet_with_utf8_bom_is_read(project):
    # Excel's "CSV UTF-8" and Google Sheets' exports start the file with a byte-order mark.
    sheet = "prompt_id\ttext\np1\tCafé au lait.\np2\tIt is nine.\n"
    (project / "config/prompts.tsv").write_bytes(b"\xef\xbb\xbf" + sheet.encode("utf-8"))
    p = plan(project)
    assert sorted(p.groups) == [("calm", "p1"), ("calm", "p2"), ("happy", "p1"), ("happy", "p2")]
    assert p.groups[("calm", "p1")].text == "Café au lait."


def test_latin1_sheet_gets_a_clear_error(project):
    sheet = "prompt_id\ttext\np1\tGood morning.\np2\tCafé au lait.\n"
    (project / "config/prompts.tsv").write_bytes(sheet.encode("latin-1"))
    with pytest.raises(PlanError) as err:
        plan(project)
    msg = str(err.value)
    assert str(project / "config/prompts.tsv") in msg
    # line 3, "p2\tCaf" is 6 bytes, so the é is byte 7 of the line (offset 38 in the file)
    assert "line 3, byte 7 (file offset 38): 0xe9 is not UTF-8" in msg
    assert "'é' in Latin-1" in msg
    assert "Save the sheet as UTF-8" in msg


def test_latin1_sheet_after_a_bom_names_the_file_offset(project):
    data = b"\xef\xbb\xbfprompt_id\ttext\np1\tna\xefve\n"
    (project / "config/prompts.tsv").write_bytes(data)
    with pytest.raises(PlanError, match=r"line 2, byte 6 \(file offset 23\): 0xef is not UTF-8"):
        plan(project)


def test_crlf_sheet_is_read_without_carriage_returns(project):
    # Excel on Windows ends lines with CRLF; no value (nor the last column's name) keeps the CR.
    (project / "config/emotions.tsv").write_bytes(
        b"emotion\tdescription\r\ncalm\tA calm voice.\r\nhappy\tA happy voice.\r\n"
    )
    (project / "config/prompts.tsv").write_bytes(
        b"\xef\xbb\xbfprompt_id\ttext\r\np1\tGood morning.\r\np2\tIt is nine.\r\n"
    )
    p = plan(project)
    assert sorted(p.groups) == [("calm", "p1"), ("calm", "p2"), ("happy", "p1"), ("happy", "p2")]
    assert p.groups[("happy", "p2")].text == "It is nine."
    assert p.groups[("happy", "p2")].emotion_description == "A happy voice."


def test_utf16_sheet_with_bom_is_read(project):
    # Excel's "Unicode Text" export: tab-separated UTF-16 with a byte-order mark.
    sheet = "prompt_id\ttext\r\np1\tNaïve.\r\np2\tIt is nine.\r\n"
    (project / "config/prompts.tsv").write_bytes(sheet.encode("utf-16"))
    assert plan(project).groups[("calm", "p1")].text == "Naïve."


# --- backend options ----------------------------------------------------------------------------


def test_unknown_backend_option_is_refused_with_a_close_match(project):
    models = tiny_config()["models"]
    models["generator"] = {"backend": "piper", "options": {"noise_scal": 0.5}}
    with pytest.raises(PlanError) as err:
        plan(project, models=models)
    msg = str(err.value)
    assert "models.generator.options: generator backend 'piper' has no option 'noise_scal'" in msg
    assert "did you mean 'noise_scale'?" in msg
    assert (
        "piper's options: config_path, length_scale, model_path, noise_scale, noise_w_scale" in msg
    )


def test_unknown_runtime_knob_is_refused(project):
    models = tiny_config()["models"]
    models["scorers"] = [{"backend": "duration"}, {"backend": "dnsmos", "runtime": {"thread": 2}}]
    expect(
        project,
        r"models.scorers\[1\].runtime: scorer backend 'dnsmos' has no option 'thread'; "
        r"did you mean 'threads'\?",
        models=models,
    )


def test_injected_objects_are_not_config_options(project):
    models = tiny_config()["models"]
    models["scorers"] = [{"backend": "parakeet", "options": {"_model": "x"}}]
    expect(project, r"scorer backend 'parakeet' has no option '_model'", models=models)


def test_option_in_both_options_and_runtime_is_refused(project):
    models = tiny_config()["models"]
    models["scorers"] = [
        {"backend": "dnsmos", "options": {"threads": 1}, "runtime": {"threads": 2}}
    ]
    expect(project, r"\['threads'\] set in both options and runtime", models=models)


def _entries(models: dict):
    yield "generator", models["generator"]
    if models.get("restorer"):
        yield "restorer", models["restorer"]
    for s in models.get("scorers", []):
        yield "scorer", s


@pytest.mark.parametrize(
    "config_name",
    ["config.yaml", "recipes/emotions.yaml", "recipes/clone.yaml", "recipes/delay.yaml",
     "recipes/base.yaml"],
)  # fmt: skip
def test_shipped_configs_use_only_known_options(config_name):
    from helpers import REPO

    from bestofn.backends.registry import backend_class
    from bestofn.core.config import load_config

    models = load_config(REPO / "config" / config_name)["models"]
    for role, entry in _entries(models):
        keys = set(entry.get("options") or {}) | set(entry.get("runtime") or {})
        known = backend_class(role, entry["backend"]).known_options()
        assert keys <= known, (entry["backend"], keys - known)


def test_every_registered_backend_declares_its_options():
    from bestofn.backends import moss_fast, moss_hf
    from bestofn.backends.registry import backend_class, registered

    for role, names in registered().items():
        for name in names:
            known = backend_class(role, name).known_options()  # TypeError if undeclared
            assert "device" not in known and not any(k.startswith("_") for k in known)
    assert backend_class("generator", "moss-fast").known_options() == set(moss_fast.DEFAULTS)
    assert backend_class("generator", "moss-hf").known_options() == set(moss_hf.DEFAULTS)
    assert {"batch_size", "model_path", "dtype"} <= backend_class(
        "scorer", "parakeet"
    ).known_options()


def test_a_kwargs_constructor_must_declare_its_options(monkeypatch):
    from bestofn.backends.base import Scorer

    class Loose(Scorer):
        def __init__(self, device="cpu", **options):
            pass

    with pytest.raises(TypeError, match="override known_options"):
        Loose.known_options()
    # ... and a config naming such a backend is refused with that, not a traceback
    import bestofn.core.plan as plan_module

    monkeypatch.setattr(plan_module, "backend_class", lambda role, name: Loose)
    with pytest.raises(PlanError, match=r"backend 'loose' does not declare its options: .*Loose"):
        plan_module.check_options("scorer", "models.scorers[0]", {"backend": "loose"})


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
    from bestofn.worker.client.runtime import Runtime

    defaults = runtime_defaults()
    fields = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(Runtime)
    }
    assert fields == defaults
    assert Runtime.from_config(None) == Runtime(**defaults)
    assert defaults["idle_timeout_s"] == 300.0 and defaults["start_timeout_s"] == 900.0


@pytest.mark.parametrize(
    "pair_groups, runtime, warns",
    [
        (True, {}, "runtime.queue_depth is 2"),  # the schema's default depth
        (True, {"queue_depth": 3}, "runtime.queue_depth is 3"),
        (True, {"queue_depth": 4}, None),
        (True, {"queue_depth": 6}, None),
        (True, {"queue_depth": 4, "worker": False}, "needs the warm worker"),
        (False, {"queue_depth": 1}, None),
    ],
)
def test_pairing_without_room_for_partners_is_a_warning(pair_groups, runtime, warns):
    from bestofn import schemas
    from bestofn.core.plan import slow_settings

    config = tiny_config(runtime=runtime)
    config["models"]["generator"] = {
        "backend": "moss-fast",
        "runtime": {"pair_groups": pair_groups},
    }
    got = slow_settings(schemas.apply_defaults(config))
    assert (got == []) if warns is None else (len(got) == 1 and warns in got[0])


# --- wall-clock before and during a run (bestofn.ops.cost) -------------------------------------


def test_wall_clock_before_any_group_uses_the_documented_gpu_figure(project, monkeypatch):
    import bestofn.ops.cost as rem

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(rem, "gpu_model_names", lambda: ["NVIDIA H200", "NVIDIA H200"])
    r = rem.remaining(plan(project, device="cuda"), project / "results")
    assert r.slots == 2 and r.per_slot.source == "documented figure"
    assert r.wall_hours_left == pytest.approx(4 * 2 * 0.030 / 2 / 3600)
    report = rem.format_report(r)
    assert "wall-clock: 0 s left at 2 slot(s) working at once, 0.0300 s/take per slot" in report
    assert "from the documented figure: NVIDIA H200; " in report and "not your weights" in report
    # another GPU model has no documented figure: the estimate says what would give one
    monkeypatch.setattr(rem, "gpu_model_names", lambda: ["NVIDIA A10"])
    r = rem.remaining(plan(project, device="cuda"), project / "results")
    assert r.per_slot is None and "run `bestofn doctor`" in rem.format_report(r)


def test_wall_clock_during_a_run_reads_the_published_groups(project):
    from datetime import UTC, datetime, timedelta

    import pyarrow as pa
    import pyarrow.parquet as pq

    import bestofn.ops.cost as rem

    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def group(name, pid, start_s, end_s, takes=2):
        d = project / "results/groups" / name
        d.mkdir(parents=True)
        rows = {"host": ["h"] * takes, "worker_pid": [pid] * takes,
                "started_at": [t0 + timedelta(seconds=start_s)] * takes,
                "finished_at": [t0 + timedelta(seconds=end_s)] * takes}  # fmt: skip
        pq.write_table(pa.table(rows), d / "scores.parquet")

    group("calm/p1", 1, 0, 10)
    group("calm/p2", 1, 5, 20)  # overlapped the group before on worker 1: counted once
    group("happy/p1", 2, 0, 4)
    r = rem.remaining(plan(project), project / "results")
    assert r.per_slot.source == "published groups"
    assert r.per_slot.s_per_take == pytest.approx((20 + 4) / 6)
    assert "3 newest published groups, 6 takes, 2 worker(s)" in r.per_slot.detail
    assert r.wall_hours_left == pytest.approx(1 * 2 * 4.0 / 1 / 3600)  # 1 group left, 1 slot


def test_a_moss_generators_identity_holds_its_whole_pacing_dial():
    """The pacing dial's defaults are part of the models' identity (a changed default changes
    the prompt and the budget, so it reruns the groups); options given win; other backends
    are left as they are."""
    from bestofn.core.pipeline import _with_pacing

    entry = _with_pacing({"backend": "moss-fast", "options": {"frames_per_word": 4.2}})
    assert entry["options"]["frames_per_word"] == 4.2
    assert entry["options"]["min_tokens"] == 96 and entry["options"]["budget_offset"] == 300
    assert entry["options"]["tokens_hint"] is True
    piper = {"backend": "piper", "options": {}}
    assert _with_pacing(piper) == piper
