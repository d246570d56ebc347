"""Generator, codec, restorer and scorers agree on codebooks and sample rates, checked before
any group runs (before any model loads where the files say it), naming both files."""

from __future__ import annotations

import io
import json
import tarfile
import types

import pytest
import yaml

from bestofn.core.agreement import AgreementError, check_files, check_loaded
from bestofn.core.pipeline import load_backends
from bestofn.core.plan import PlanError, build_plan


def write_json(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def moss_dirs(tmp_path, model: dict | None = None, codec: dict | None = None):
    """Tiny MOSS model + codec config.json files (only the facts the check reads)."""
    m = {"n_vq": 4, "audio_vocab_size": 16, "sampling_rate": 48000, **(model or {})}
    c = {"n_vq": 12, "codebook_size": 16, "sampling_rate": 48000, **(codec or {})}
    write_json(tmp_path / "model/config.json", m)
    write_json(tmp_path / "codec/config.json", c)
    return tmp_path / "model", tmp_path / "codec"


def moss_models(model_dir, codec_dir, backend="moss-fast") -> dict:
    options = {"model_dir": str(model_dir), "codec_dir": str(codec_dir)}
    return {"generator": {"backend": backend, "options": options}, "scorers": []}


def test_agreeing_configs_pass(tmp_path):
    check_files(moss_models(*moss_dirs(tmp_path)))
    # the model may use fewer residual codebooks than the codec has, in nested layouts too
    model, codec = moss_dirs(
        tmp_path, codec={"n_vq": None, "quantizer_kwargs": {"num_quantizers": 32}}
    )
    check_files(moss_models(model, codec))


@pytest.mark.parametrize(
    "model, codec, what",
    [
        ({"audio_vocab_size": 64}, {}, r"codebook size: .*model/config.json has audio_vocab_size"),
        ({}, {"codebook_size": 64}, r"codebook size: .*codec/config.json has codebook_size = 64"),
        (
            {"audio_vocab_size": None, "audio_codebook_sizes": [16, 16, 16, 32]},
            {},
            "audio_codebook_sizes = \\[16, 16, 16, 32\\]",
        ),
        ({"n_vq": 16}, {}, r"codebook count: .*n_vq = 16.*n_vq = 12"),
        (
            {},
            {"n_vq": None, "quantizer_config": {"n_codebooks": 2}},
            r"codebook count: .*n_codebooks = 2",
        ),
        ({}, {"sampling_rate": 24000}, r"sample rate: .*sampling_rate = 48000.*= 24000"),
    ],
)
def test_a_mismatch_names_both_files(tmp_path, model, codec, what):
    model_dir, codec_dir = moss_dirs(tmp_path, model, codec)
    with pytest.raises(AgreementError, match=what) as err:
        check_files(moss_models(model_dir, codec_dir))
    text = str(err.value)
    assert str(model_dir / "config.json") in text and str(codec_dir / "config.json") in text


def test_mismatch_stops_the_worker_load_before_any_model_loads(tmp_path):
    # No weights, no tokenizer: the generator's own load would fail on those. The agreement
    # check runs first, so the error is the mismatch, raised before anything is built.
    model_dir, codec_dir = moss_dirs(tmp_path, {"audio_vocab_size": 64})
    for backend in ("moss-fast", "moss-hf"):
        with pytest.raises(AgreementError, match="codebook size"):
            load_backends(moss_models(model_dir, codec_dir, backend))


def test_mismatch_fails_the_plan_at_dag_time(project, tmp_path):
    model_dir, codec_dir = moss_dirs(tmp_path / "w", codec={"codebook_size": 64})
    (model_dir / "tokenizer.json").write_text("{}")
    (model_dir / "model.safetensors").write_bytes(b"")
    config = yaml.safe_load((project / "config/config.yaml").read_text())
    config["models"] = moss_models(model_dir, codec_dir)
    with pytest.raises(PlanError, match="codebook size") as err:
        build_plan(config, project)
    assert str(codec_dir / "config.json") in str(err.value)


def _nemo(path, rate):
    cfg = yaml.safe_dump({"preprocessor": {"sample_rate": rate}}).encode()
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("./model_config.yaml")
        info.size = len(cfg)
        tar.addfile(info, io.BytesIO(cfg))
    return path


def test_scorer_and_restorer_weights_must_have_the_rate_they_are_fed(tmp_path):
    nemo = _nemo(tmp_path / "asr.nemo", 22050)
    w2v = write_json(tmp_path / "w2v/preprocessor_config.json", {"sampling_rate": 24000}).parent
    models = {
        "generator": {"backend": "piper"},
        "restorer": {"backend": "sidon", "options": {"w2v_bert_dir": str(w2v)}},
        "scorers": [{"backend": "parakeet", "options": {"model_path": str(nemo)}}],
    }
    with pytest.raises(AgreementError) as err:
        check_files(models)
    text = str(err.value)
    assert f"{w2v / 'preprocessor_config.json'} (options.w2v_bert_dir) says 24000 Hz" in text
    assert "sidon/adapter.py (SidonRestorer.input_sample_rate) feeds it 16000 Hz" in text
    assert f"{nemo} (model_config.yaml) (options.model_path) says 22050 Hz" in text
    assert "parakeet.py (ParakeetScorer.input_sample_rate) feeds it 16000 Hz" in text
    # the right rates pass
    _nemo(nemo, 16000)
    write_json(w2v / "preprocessor_config.json", {"sampling_rate": 16000})
    check_files(models)


def test_rates_between_loaded_stages(tmp_path):
    def stage(name, **attrs):
        return types.SimpleNamespace(name=name, **attrs)

    low = stage("tts", sample_rate=8000)
    sidon = stage("sidon", input_sample_rate=16000, output_sample_rate=48000)
    asr = stage("asr", input_sample_rate=16000)
    with pytest.raises(AgreementError, match=r"generator tts makes 8000 Hz.*restorer sidon"):
        check_loaded(types.SimpleNamespace(generator=low, restorer=sidon, scorers=[asr]))
    identity = stage("identity")
    with pytest.raises(AgreementError, match=r"scorer asr expects 16000 Hz.*audio is 8000 Hz"):
        check_loaded(types.SimpleNamespace(generator=low, restorer=identity, scorers=[asr]))
    ok = stage("tts", sample_rate=22050)
    check_loaded(types.SimpleNamespace(generator=ok, restorer=identity, scorers=[asr]))
    check_loaded(types.SimpleNamespace(generator=low, restorer=stage("up", sample_rate=48000),
                                       scorers=[asr]))  # fmt: skip
    # and through load_backends, with a plugin generator at 8 kHz and a 16 kHz scorer
    models = {
        "generator": {
            "backend": "lab.faults:ScriptedGenerator",
            "options": {"sample_rate": 8000},
        },
        "scorers": [{"backend": "resemblyzer"}],
    }
    with pytest.raises(AgreementError, match="scorer resemblyzer expects 16000 Hz"):
        load_backends(models)
