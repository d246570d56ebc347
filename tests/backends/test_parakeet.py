"""Parakeet-TDT scorer on a tiny TDT model built offline from a config (random weights).

The tiny model is saved to a .nemo archive and restored through the backend's own loader,
exactly as the real Parakeet-TDT-0.6b-v3 checkpoint would be.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from bestofn.backends import parakeet
from bestofn.backends.registry import build
from bestofn.util import dtypes
from bestofn.util.spec import GroupSpec
from bestofn.util.textnorm import wer_cer

# Whether NeMo is installed, not imported: importing nemo.collections.asr takes ~8 s, which every
# pytest-xdist worker paid while collecting (this file's tests import it where they run).
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("nemo") is None, reason="nemo_toolkit[asr] not installed"
)


@pytest.fixture(scope="module")
def tiny_nemo(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("parakeet")
    from bestofn.fakes.parakeet import TINY_SIZE, build_tdt_model

    model = build_tdt_model(workdir, TINY_SIZE, seed=0)
    path = workdir / "tiny_tdt.nemo"
    model.save_to(str(path))
    return path


@pytest.fixture(scope="module")
def scorer(tiny_nemo):
    # Through the registry, as the fused worker builds it from config.
    return build("scorer", "parakeet", {"model_path": str(tiny_nemo), "batch_size": 2})


def _takes(seed=0, sr=16000, seconds=(0.7, 1.9, 1.2, 2.6, 0.4)):
    rng = np.random.default_rng(seed)
    t = [np.arange(int(s * sr)) / sr for s in seconds]
    # tones + noise: deterministic, different per take
    return [
        (0.3 * np.sin(2 * np.pi * (150 + 60 * i) * x) + 0.05 * rng.standard_normal(len(x))).astype(
            np.float32
        )
        for i, x in enumerate(t)
    ]


def test_restored_model_is_tdt(scorer):
    from nemo.collections.asr.models import EncDecRNNTBPEModel

    assert isinstance(scorer.model, EncDecRNNTBPEModel)
    assert scorer.model.cfg.loss.loss_name == "tdt"
    assert scorer.model.preprocessor.featurizer.dither == 0.0  # deterministic transcripts


def test_restore_without_random_init_gives_every_tensor_of_a_plain_restore(tiny_nemo):
    """The backend builds NeMo's model with torch.nn.init's draws skipped (the strict load
    replaces every weight): each parameter and buffer, non-persistent ones included, has the
    bits of NeMo's own restore, which draws them first."""
    import torch
    from nemo.collections.asr.models import ASRModel

    from bestofn.backends.skip_init import random_init_skipped

    plain = ASRModel.restore_from(str(tiny_nemo), map_location=torch.device("cpu")).eval()
    ours = parakeet.load_nemo_asr(tiny_nemo, "cpu")

    def tensors(m):
        return {**dict(m.named_parameters()), **dict(m.named_buffers())}

    a, b = tensors(plain), tensors(ours)
    assert a.keys() == b.keys() and len(a) > 50
    for name, t in a.items():
        assert torch.equal(t, b[name]), name
    with random_init_skipped():  # and it did skip: a draw inside leaves its tensor alone
        kept = torch.nn.init.normal_(torch.zeros(4))
    assert torch.equal(kept, torch.zeros(4))
    assert not torch.equal(torch.nn.init.normal_(torch.zeros(4)), torch.zeros(4))


def test_skipped_init_is_this_threads_only():
    """Another thread building at the same time still draws its random numbers."""
    import threading

    import torch

    from bestofn.backends.skip_init import random_init_skipped

    inside, drawn = threading.Event(), {}

    def other():
        assert inside.wait(10)
        drawn["other"] = torch.nn.init.kaiming_uniform_(torch.zeros(8, 8))

    t = threading.Thread(target=other)
    t.start()
    with random_init_skipped():
        drawn["mine"] = torch.nn.init.kaiming_uniform_(torch.zeros(8, 8))
        inside.set()
        t.join()
    assert torch.equal(drawn["mine"], torch.zeros(8, 8))
    assert drawn["other"].abs().sum() > 0


def test_batched_transcripts_match_nemo_transcribe(scorer):
    """Our in-memory batched path (sorted, padded, batch_size=2) gives NeMo's own
    transcribe() output for the same arrays, take by take, in input order."""
    takes = _takes()
    ours = scorer.transcribe(takes, 16000)
    ref = scorer.model.transcribe(takes, batch_size=1, verbose=False)
    ref = [(h.text if hasattr(h, "text") else h).strip() for h in ref]
    assert ours == ref
    assert any(ours), "random tiny model should still emit some tokens"


def test_resamples_and_downmixes(scorer):
    """A 48 kHz stereo take scores like its 16 kHz mono version."""
    from bestofn.util.audio import resample

    mono16 = _takes(seconds=(1.5,))[0]
    stereo48 = np.stack([resample(mono16, 16000, 48000)] * 2, axis=1)
    assert scorer.transcribe([stereo48], 48000) == scorer.transcribe(
        [resample(resample(mono16, 16000, 48000), 48000, 16000)], 16000
    )


def test_score_columns_and_wer(scorer):
    takes = _takes(seconds=(1.0, 2.0, 0.5))
    spec = GroupSpec(emotion="neutral", prompt_id="p1", text="Hello, World!", n_takes=3)
    cols = scorer.score(takes, 16000, spec)
    assert set(cols) == set(parakeet.ParakeetScorer.columns)
    assert all(len(v) == 3 for v in cols.values())
    for t, w, c in zip(cols["transcript"], cols["wer"], cols["cer"], strict=True):
        assert (w, c) == wer_cer(spec.text, t)
        assert w >= 0 and c >= 0


def test_bf16_autocast_path_runs(tiny_nemo):
    """bf16 where this CPU runs every op under autocast (AVX512-BF16 and the like), else the
    float32 fallback: either way the backend transcribes, and says which it ran."""
    s = parakeet.ParakeetScorer(model_path=str(tiny_nemo), dtype="bfloat16", hash_weights=False)
    runs_bf16 = dtypes.unsupported("cpu", "bfloat16", parakeet.AUTOCAST_OPS) is None
    assert s.dtype == s.provenance()["dtype"] == ("bfloat16" if runs_bf16 else "float32")
    out = s.transcribe(_takes(seconds=(1.0, 0.6)), 16000)
    assert len(out) == 2 and all(isinstance(t, str) for t in out)


def test_bf16_falls_back_to_fp32_where_unsupported(tiny_nemo, monkeypatch, caplog):
    """As on a CPU without AVX512-BF16 (no bf16 LSTM in oneDNN): forced here on any CPU."""
    import logging

    # A fresh float32 scorer (never probed): the module's `scorer` went through NeMo's own
    # transcribe() in another test, after which its transcripts of these takes change (dither,
    # pad_to and the decoding config stay as set; what else transcribe() leaves is not known).
    fp32 = parakeet.ParakeetScorer(
        model_path=str(tiny_nemo), dtype="float32", batch_size=2, hash_weights=False
    )
    monkeypatch.setattr(dtypes, "probe", lambda *a: "RuntimeError: forced by the test")
    with caplog.at_level(logging.WARNING, logger="bestofn.util.dtypes"):
        s = parakeet.ParakeetScorer(
            model_path=str(tiny_nemo), dtype="bfloat16", batch_size=2, hash_weights=False
        )
    assert s.dtype == s.provenance()["dtype"] == "float32"
    assert "parakeet: bfloat16 is not supported on cpu" in caplog.text
    assert "running in float32" in caplog.text
    takes = _takes()
    assert s.transcribe(takes, 16000) == fp32.transcribe(takes, 16000)


def test_provenance_hashes_the_nemo_file(scorer, tiny_nemo):
    import hashlib

    p = scorer.provenance()
    assert p["model_path"] == str(tiny_nemo)
    assert p["model_sha256"] == hashlib.sha256(tiny_nemo.read_bytes()).hexdigest()
    assert p["dtype"] == "float32" and p["batch_size"] == 2


def test_missing_path_names_path_and_field(tmp_path):
    missing = tmp_path / "nope.nemo"
    with pytest.raises(FileNotFoundError, match=r"nope\.nemo.*model_path"):
        parakeet.ParakeetScorer(model_path=str(missing))


def test_corrupt_archive_is_a_clear_error(tmp_path):
    bad = tmp_path / "corrupt.nemo"
    bad.write_bytes(b"this is not a tar archive" * 100)
    with pytest.raises(parakeet.ParakeetLoadError, match=r"corrupt\.nemo.*model_path"):
        parakeet.ParakeetScorer(model_path=str(bad))


def test_uncached_model_name_fails_offline(tmp_path):
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
        parakeet.resolve_nemo_file(None, "nvidia/parakeet-tdt-0.6b-v3", str(tmp_path / "empty"))


def test_model_name_resolves_from_local_hf_cache(tmp_path, tiny_nemo):
    """A pretrained name is found in the Hugging Face cache layout, offline."""
    import shutil

    repo = tmp_path / "hub" / "models--nvidia--parakeet-tdt-0.6b-v3"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    shutil.copy(tiny_nemo, repo / "snapshots" / commit / "parakeet-tdt-0.6b-v3.nemo")
    scorer = parakeet.ParakeetScorer(hf_cache_dir=str(tmp_path / "hub"), hash_weights=False)
    assert scorer.nemo_path.name == "parakeet-tdt-0.6b-v3.nemo"
    assert scorer.provenance()["source"] == "hf-cache:nvidia/parakeet-tdt-0.6b-v3"


def test_sdpa_attention_gives_the_manual_encoder_output(tiny_nemo):
    """NeMo's SDPA path (the CUDA default) computes the same attention as its manual float32
    softmax: on the CPU in float32 the encoder outputs agree to rounding and the transcripts
    are the same; the scorer says which path it ran."""
    takes = _takes()
    runs = {}
    for attention in ("manual", "sdpa"):
        s = parakeet.ParakeetScorer(
            model_path=str(tiny_nemo), attention=attention, hash_weights=False, batch_size=8
        )
        mods = [m for m in s.model.encoder.modules() if hasattr(m, "use_pytorch_sdpa")]
        assert mods and all(m.use_pytorch_sdpa == (attention == "sdpa") for m in mods)
        assert s.provenance()["attention"] == attention
        enc, lens = s.encode_batch(takes)
        runs[attention] = (enc, lens, s.transcribe(takes, 16000))
    (enc_m, lens_m, text_m), (enc_s, lens_s, text_s) = runs["manual"], runs["sdpa"]
    assert lens_m.tolist() == lens_s.tolist()
    for i, n in enumerate(lens_m.tolist()):  # padded frames past a take's length are not used
        np.testing.assert_allclose(
            enc_s[i, :, :n].numpy(), enc_m[i, :, :n].numpy(), rtol=1e-4, atol=1e-4
        )
    assert text_s == text_m


def test_attention_defaults_and_bad_value(tiny_nemo):
    s = parakeet.ParakeetScorer(model_path=str(tiny_nemo), hash_weights=False)
    assert s.attention == "manual"  # the CPU default: as the checkpoint ships
    with pytest.raises(ValueError, match="attention must be auto, sdpa or manual"):
        parakeet.ParakeetScorer(model_path=str(tiny_nemo), attention="flash", hash_weights=False)


def test_decodings_give_the_same_transcripts(tiny_nemo):
    """runtime.decoding: NeMo's label loop with CUDA graphs (the CUDA default; on a CPU NeMo
    runs it without graphs), the same loop eager (the CPU default), and the per-utterance loop
    give the same transcripts; each says in the provenance which it ran, and its NeMo decoding
    config carries the keys."""
    takes = _takes()
    out = {}
    for decoding in ("label_looping", "cuda_graphs", "cuda_graphs_host_loop", "greedy"):
        s = parakeet.ParakeetScorer(
            model_path=str(tiny_nemo), decoding=decoding, hash_weights=False, batch_size=8
        )
        strategy, loop_labels, graphs, _ = parakeet.DECODINGS[decoding]
        cfg = s.model.cfg.decoding
        assert (cfg.strategy, cfg.greedy.loop_labels, cfg.greedy.use_cuda_graph_decoder) == (
            strategy, loop_labels, graphs
        )  # fmt: skip
        assert s.provenance()["decoding"] == decoding
        out[decoding] = s.transcribe(takes, 16000)
    assert out["cuda_graphs"] == out["label_looping"] == out["greedy"]
    assert out["cuda_graphs_host_loop"] == out["greedy"]
    assert any(out["greedy"])


def test_host_loop_holds_nemo_to_graphs_without_conditional_nodes(tiny_nemo):
    """cuda_graphs_host_loop holds NeMo's label-looping computer to its no_while_loops mode
    (the loop bodies as graphs, the loops on the host), with no fallback; cuda_graphs leaves
    the mode to NeMo. On a CPU both run NeMo's eager loop (checked above: same transcripts)."""
    host = parakeet.ParakeetScorer(
        model_path=str(tiny_nemo), decoding="cuda_graphs_host_loop", hash_weights=False
    )
    computer = host.model.decoding.decoding.decoding_computer
    assert computer.cuda_graphs_mode == computer.CudaGraphsMode.NO_WHILE_LOOPS
    assert computer.cuda_graphs_allow_fallback is False
    plain = parakeet.ParakeetScorer(
        model_path=str(tiny_nemo), decoding="cuda_graphs", hash_weights=False
    )
    assert plain.model.decoding.decoding.decoding_computer.cuda_graphs_allow_fallback is True


def test_decoding_default_and_bad_value(tiny_nemo):
    s = parakeet.ParakeetScorer(model_path=str(tiny_nemo), hash_weights=False)
    assert s.decoding == "label_looping"  # the CPU default: what the CPU always ran
    with pytest.raises(ValueError, match="decoding must be auto, cuda_graphs"):
        parakeet.ParakeetScorer(model_path=str(tiny_nemo), decoding="beam", hash_weights=False)


needs_data_filter = pytest.mark.skipif(
    not hasattr(__import__("tarfile"), "data_filter"),
    reason="tarfile's data filter (Python 3.11.4+): without it the archive is not cached",
)


def _tensors(model):
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _same_model(a, b) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    import torch

    return ta.keys() == tb.keys() and all(torch.equal(t, tb[name]) for name, t in ta.items())


@pytest.fixture
def worker_cache(tmp_path, monkeypatch):
    from bestofn.util import caches

    monkeypatch.setattr(caches, "_root", tmp_path / "cache")
    return tmp_path / "cache/nemo-extracted"


@pytest.fixture(scope="module")
def plain_model(tiny_nemo):
    return parakeet.load_nemo_asr(tiny_nemo, "cpu")  # no digest: NeMo unpacks the archive


@needs_data_filter
def test_a_worker_cache_keeps_the_archive_extracted_and_restores_the_same_model(
    tiny_nemo, plain_model, worker_cache, monkeypatch
):
    """The .nemo's members are extracted once into ``nemo-extracted/SHA256`` (with a manifest
    written last); the next build restores from there without unpacking the archive, and
    every tensor is the one of a restore from the archive."""
    import hashlib

    from nemo.core.connectors.save_restore_connector import SaveRestoreConnector

    from bestofn.backends import nemo_cache

    digest = hashlib.sha256(tiny_nemo.read_bytes()).hexdigest()
    first = parakeet.ParakeetScorer(model_path=str(tiny_nemo), batch_size=2)
    assert [p.name for p in worker_cache.iterdir() if p.is_dir()] == [digest]
    assert (worker_cache / digest / "model_weights.ckpt").is_file()
    assert nemo_cache.is_complete(worker_cache / digest)

    def no_unpack(*args, **kwargs):
        raise AssertionError("the archive was unpacked again")

    monkeypatch.setattr(SaveRestoreConnector, "_unpack_nemo_file", staticmethod(no_unpack))
    second = parakeet.ParakeetScorer(model_path=str(tiny_nemo), batch_size=2)
    assert _same_model(first.model, plain_model) and _same_model(second.model, plain_model)
    audio = _takes()
    assert second.transcribe(audio, 16000) == first.transcribe(audio, 16000)


@needs_data_filter
def test_from_the_cache_the_vocabulary_lists_are_left_to_the_tokenizer(
    tiny_nemo, plain_model, worker_cache, monkeypatch
):
    """From the extracted members, the config goes in with ``labels`` and ``joint.vocabulary``
    emptied (EncDecRNNTBPEModel rebuilds both from its tokenizer), and the model is the one
    NeMo restores from the archive with its own config: the same config, tensors and text."""
    import hashlib

    from omegaconf import OmegaConf

    seen = []
    strip = parakeet._config_without_vocabulary
    monkeypatch.setattr(
        parakeet, "_config_without_vocabulary", lambda m: seen.append(strip(m)) or seen[-1]
    )
    digest = hashlib.sha256(tiny_nemo.read_bytes()).hexdigest()
    model = parakeet.load_nemo_asr(tiny_nemo, "cpu", digest)
    (override,) = seen
    assert override is not None and list(override.labels) == []
    assert list(override.joint.vocabulary) == []
    assert len(model.cfg.labels) == model.tokenizer.vocab_size > 0
    assert OmegaConf.to_yaml(model.cfg) == OmegaConf.to_yaml(plain_model.cfg)
    assert _same_model(model, plain_model)
    cached = parakeet.ParakeetScorer(model_path=str(tiny_nemo), batch_size=2)
    assert len(seen) == 2  # the scorer's build took the same path
    uncached = parakeet.ParakeetScorer(model_path=str(tiny_nemo), batch_size=2, hash_weights=False)
    assert len(seen) == 2  # no digest: no cache, NeMo read its own config
    audio = _takes()
    assert cached.transcribe(audio, 16000) == uncached.transcribe(audio, 16000)


def test_a_config_of_another_class_keeps_its_vocabulary(tmp_path):
    """Only the class known to rebuild the lists gets them emptied; another is left to NeMo."""
    (tmp_path / "model_config.yaml").write_text(
        "target: nemo.collections.asr.models.EncDecHybridRNNTCTCBPEModel\n"
        "labels: [a, b]\njoint: {vocabulary: [a, b]}\n"
    )
    assert parakeet._config_without_vocabulary(tmp_path) is None


_YAML_CASES = """\
target: x.Y
small_float: 1e-5
big_float: 1.5E+3
underscored: 1_000
plain_int: 12
octal_like: 0o17
neg_inf: -.inf
not_a_number: .nan
date_text: 2001-12-14
on_off: [yes, no, on, off, true, false, ~, null]
interpolation: ${model.sample_rate}
quoted: '1e-5'
unicode: "\\u00e9t\\u00e9 — ♪"
path: !!python/object/apply:pathlib.Path [/a, b]
nested: {list: [[1, 2], {k: v}], empty: [], none: }
"""


@pytest.mark.parametrize("libyaml", [True, False])
def test_the_config_parses_as_omegaconf_parses_it(tmp_path, monkeypatch, libyaml):
    """The config reader (libyaml's parser under OmegaConf's loader, or OmegaConf's own where
    there is no libyaml) gives what ``OmegaConf.load`` gives, value for value and type for
    type: its floats without a dot, its dates left as text, its path tag; a duplicate key
    fails as it does in OmegaConf."""
    from omegaconf import OmegaConf

    if not libyaml:
        monkeypatch.setattr(parakeet, "_omegaconf_yaml_with_libyaml", lambda: None)
    elif parakeet._omegaconf_yaml_with_libyaml() is None:
        pytest.skip("PyYAML here was built without libyaml")
    path = tmp_path / "model_config.yaml"
    path.write_text(_YAML_CASES, encoding="utf-8")
    got = parakeet._load_config_dict(path)
    want = OmegaConf.to_container(OmegaConf.load(path))
    assert got == want
    assert [type(v) for v in got.values()] == [type(v) for v in want.values()]
    assert isinstance(got["small_float"], float) and got["date_text"] == "2001-12-14"
    path.write_text("a: 1\nb: 2\na: 3\n")
    with pytest.raises(Exception, match="duplicate key a"):
        OmegaConf.load(path)
    with pytest.raises(Exception, match="duplicate key a"):
        parakeet._load_config_dict(path)


@needs_data_filter
def test_an_incomplete_extraction_is_extracted_again(tiny_nemo, plain_model, worker_cache):
    """A cached directory whose files no longer match its manifest (a crash after the rename,
    a file cut short), or one cut short before its rename (a hidden sibling), is not used:
    the archive is extracted again and the leftovers are removed."""
    import hashlib

    from bestofn.backends import nemo_cache

    digest = hashlib.sha256(tiny_nemo.read_bytes()).hexdigest()
    parakeet.ParakeetScorer(model_path=str(tiny_nemo), batch_size=2)
    weights = worker_cache / digest / "model_weights.ckpt"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])  # cut short
    (worker_cache / f".{digest[:16]}-cut").mkdir()  # an extraction killed before its rename
    assert not nemo_cache.is_complete(worker_cache / digest)
    again = parakeet.ParakeetScorer(model_path=str(tiny_nemo), batch_size=2)
    assert weights.stat().st_size == size and nemo_cache.is_complete(worker_cache / digest)
    assert [p.name for p in worker_cache.iterdir() if p.is_dir()] == [digest]
    assert _same_model(again.model, plain_model)


def test_a_failing_cache_falls_back_to_nemos_unpack(tiny_nemo, plain_model, tmp_path,
                                                    monkeypatch, caplog):  # fmt: skip
    """The cache's own failure (here its root is a file, so nothing can be made under it) is
    a warning naming runtime.cache_dir, and the model loads as without a cache."""
    from bestofn.util import caches

    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setattr(caches, "_root", tmp_path / "not-a-dir")
    with caplog.at_level("WARNING"):
        scorer = parakeet.ParakeetScorer(model_path=str(tiny_nemo), batch_size=2)
    assert _same_model(scorer.model, plain_model)
    if hasattr(__import__("tarfile"), "data_filter"):
        assert "runtime.cache_dir" in caplog.text


def test_a_corrupt_archive_with_a_cache_is_still_the_archives_error(tmp_path, worker_cache):
    bad = tmp_path / "corrupt.nemo"
    bad.write_bytes(b"this is not a tar archive" * 100)
    with pytest.raises(parakeet.ParakeetLoadError, match=r"corrupt\.nemo.*model_path"):
        parakeet.ParakeetScorer(model_path=str(bad))


@needs_data_filter
def test_workers_starting_together_extract_once(tiny_nemo, worker_cache, monkeypatch):
    """Two loads at once (workers of one box, SLURM jobs on one results directory): one
    extracts under the digest's lock, the other waits and reads the same directory."""
    import hashlib
    import tarfile
    import threading
    import time

    from bestofn.backends import nemo_cache

    digest = hashlib.sha256(tiny_nemo.read_bytes()).hexdigest()
    calls, extract = [], tarfile.TarFile.extractall

    def slow_extract(self, *args, **kwargs):
        calls.append(threading.get_ident())
        time.sleep(0.5)  # long enough for the other thread to reach the lock
        return extract(self, *args, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "extractall", slow_extract)
    out = []
    threads = [threading.Thread(target=lambda: out.append(nemo_cache.extracted(tiny_nemo, digest)))
               for _ in range(2)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and out == [worker_cache / digest] * 2
