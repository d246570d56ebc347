"""MOSS-Audio-Tokenizer (bestofn.moss.codec.tokenizer) on a tiny random checkpoint in the
published layout (bestofn.fakes.moss_audio_tokenizer): parity with the published code when its
copy is in .ref/moss_audio_tokenizer, and batching / precision / bad-checkpoint behaviour."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO
from safetensors.torch import load_file, save_file

from bestofn.fakes import moss_audio_tokenizer as fake
from bestofn.moss.codec.tokenizer import AudioTokenizerError, MossAudioTokenizer

REF = REPO / ".ref" / "moss_audio_tokenizer"
REF_FILES = (
    "__init__.py",
    "configuration_moss_audio_tokenizer.py",
    "modeling_moss_audio_tokenizer.py",
)
CODEBOOK = 64


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return fake.write(tmp_path_factory.mktemp("mat") / "MOSS-Audio-Tokenizer", "tiny", seed=3)


@pytest.fixture(scope="module")
def codec(ckpt) -> MossAudioTokenizer:
    return MossAudioTokenizer(ckpt, compute_dtype="fp32", decode_batch_size=8)


def _clips(lengths, seed=0, n_vq=32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, CODEBOOK, (n, n_vq), generator=g) for n in lengths]


def _snr_db(ref: np.ndarray, x: np.ndarray) -> float:
    return float(10 * np.log10((ref**2).sum() / max(((ref - x) ** 2).sum(), 1e-30)))


# ---- parity with the published code -------------------------------------------------------


def _reference(ckpt: Path, tmp_path: Path):
    if not all((REF / f).is_file() for f in REF_FILES):
        pytest.skip(
            f"published code not in {REF} (copy OpenMOSS/MOSS-Audio-Tokenizer's "
            "configuration/modeling files there to run the parity tests)"
        )
    from transformers import AutoModel

    d = tmp_path / "with-code"
    shutil.copytree(ckpt, d)
    for f in REF_FILES:
        shutil.copyfile(REF / f, d / f)
    model, info = AutoModel.from_pretrained(
        str(d), trust_remote_code=True, local_files_only=True, output_loading_info=True
    )
    # our random checkpoint has exactly the published key layout
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def test_decode_matches_the_published_code(ckpt, codec, tmp_path):
    ref = _reference(ckpt, tmp_path)
    lengths = [40, 25, 7, 33]  # window of the first decoder stage: 12 frames
    clips = _clips(lengths, seed=1)
    T = max(lengths)
    grid = torch.zeros(32, len(clips), T, dtype=torch.long)
    mask = torch.zeros(len(clips), T, dtype=torch.bool)
    for i, c in enumerate(clips):
        grid[:, i, : len(c)] = c.T
        mask[i, : len(c)] = True
    with torch.no_grad():
        out = ref.decode(grid, padding_mask=mask, return_dict=True)
    ours = codec.decode(clips)
    for i, n in enumerate(lengths):
        theirs = out.audio[i, 0, : int(out.audio_lengths[i])].numpy()
        assert ours[i].shape == (n * codec.hop, 1) == (theirs.shape[0], 1)
        np.testing.assert_allclose(ours[i][:, 0], theirs, rtol=0, atol=1e-4 * np.abs(theirs).max())


def test_one_clip_path_of_the_published_processor(ckpt, codec, tmp_path):
    # The processor decodes one clip at a time with chunk_duration (streaming, ring KV caches
    # of `context` entries). A chunk's first steps then see fewer past steps than the
    # model's window (the cache holds `context` entries after the chunk was written), so only
    # the first chunk equals the one-shot decode that `decode()` without chunks (and ours) is.
    # Tiny: the longest chunk allowed is the context, 0.004 s = 6 frames = 96 samples.
    ref = _reference(ckpt, tmp_path)
    clip = _clips([29], seed=2)[0]
    with torch.no_grad():
        chunked = ref.decode(clip.T[:, None, :], return_dict=True, chunk_duration=0.004)
        whole = ref.decode(clip.T[:, None, :], return_dict=True)
    chunked, whole = chunked.audio[0, 0].numpy(), whole.audio[0, 0].numpy()
    ours = codec.decode([clip])[0][:, 0]
    tol = 1e-4 * np.abs(whole).max()
    np.testing.assert_allclose(ours, whole, rtol=0, atol=tol)
    np.testing.assert_allclose(ours[:96], chunked[:96], rtol=0, atol=tol)
    assert np.abs(ours[96:] - chunked[96:]).max() > 100 * tol


def test_encode_matches_the_published_code(ckpt, codec, tmp_path):
    ref = _reference(ckpt, tmp_path)
    g = torch.Generator().manual_seed(4)
    wavs = [0.1 * torch.randn(n, generator=g) for n in (480, 300, 37)]
    with torch.no_grad():
        out = ref.batch_encode(wavs)
    S = max(len(w) for w in wavs)
    padded = torch.stack([torch.nn.functional.pad(w, (0, S - len(w))) for w in wavs])
    codes, lengths = codec.encode_padded(padded, torch.tensor([len(w) for w in wavs]))
    assert lengths.tolist() == out.audio_codes_lengths.tolist()
    for i, n in enumerate(lengths.tolist()):
        assert torch.equal(codes[i, :n], out.audio_codes[:, i, :n].T)


def test_real_size_config_is_the_published_one():
    published = REF / "config.json"
    if not published.is_file():
        pytest.skip(f"{published} absent (copy of OpenMOSS/MOSS-Audio-Tokenizer's config.json)")
    ref = json.loads(published.read_text())
    ours = fake.config("real")
    for key in ("encoder_kwargs", "decoder_kwargs", "quantizer_kwargs", "downsample_rate"):
        assert ours[key] == ref[key], key
    assert ours["sampling_rate"] == ref["sampling_rate"] == 24000


# ---- batching, precision, loading ---------------------------------------------------------


def test_batched_decode_equals_one_clip_at_a_time(codec):
    lengths = [40, 1, 25, 7, 33, 0, 18]
    clips = _clips(lengths, seed=5)
    batched = codec.decode(clips)
    for clip, audio in zip(clips, batched, strict=True):
        alone = codec.decode([clip])[0]
        assert audio.shape == alone.shape == (len(clip) * codec.hop, 1)
        np.testing.assert_allclose(
            audio, alone, rtol=0, atol=1e-5 * max(np.abs(alone).max(initial=0), 1)
        )


def test_padding_does_not_leak(codec):
    # the same clip padded with different codes: its samples do not change
    clip = _clips([20], seed=6)[0]
    a = torch.zeros(1, 40, 32, dtype=torch.long)
    b = torch.randint(0, CODEBOOK, (1, 40, 32))
    a[0, :20] = b[0, :20] = clip
    ya, yb = (
        codec.decode_padded(a)[0, : 20 * codec.hop],
        codec.decode_padded(b)[0, : 20 * codec.hop],
    )
    torch.testing.assert_close(ya, yb, rtol=0, atol=1e-6 * float(ya.abs().max()))
    assert not torch.allclose(codec.decode_padded(a)[0], codec.decode_padded(b)[0])


def test_bf16_is_close_to_fp32(ckpt, codec):
    bf16 = MossAudioTokenizer(ckpt, compute_dtype="bf16")
    if bf16.dtype != torch.bfloat16:
        pytest.skip("bf16 ops do not run on this CPU (bestofn.util.dtypes fell back to float32)")
    clips = _clips([40, 12], seed=7)
    for ref, x in zip(codec.decode(clips), bf16.decode(clips), strict=True):
        assert 30 < _snr_db(ref, x) < 80  # close, and really computed in another precision


def test_fp8_stored_weights_upcast_per_layer_are_close_to_fp32(ckpt, codec):
    fp8 = MossAudioTokenizer(ckpt, compute_dtype="fp32", weight_dtype="fp8")
    assert fp8.mode == "fp8-upcast"
    assert fp8.weight_bytes() < codec.weight_bytes()
    clips = _clips([40, 12], seed=8)
    for ref, x in zip(codec.decode(clips), fp8.decode(clips), strict=True):
        assert 35 < _snr_db(ref, x) < 80


def test_fp8_matmuls_are_refused_on_a_cpu_naming_the_option(ckpt):
    with pytest.raises(AudioTokenizerError, match=r"codec_compute_dtype: fp8 .*'cpu'.*bf16"):
        MossAudioTokenizer(ckpt, device="cpu", compute_dtype="fp8")
    with pytest.raises(AudioTokenizerError, match="codec_compute_dtype is 'fp16'"):
        MossAudioTokenizer(ckpt, compute_dtype="fp16")


def test_missing_tensor_names_the_file(ckpt, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    sd = load_file(bad / "model.safetensors")
    del sd["decoder.2.transformer.layers.1.linear2.weight"]
    save_file(sd, bad / "model.safetensors")
    with pytest.raises(AudioTokenizerError, match=r"model\.safetensors.*decoder\.2\.transformer"):
        MossAudioTokenizer(bad, compute_dtype="fp32")


def test_wrong_shape_and_wrong_n_vq_name_the_file(ckpt, tmp_path):
    with pytest.raises(AudioTokenizerError, match=r"n_vq = 33.*config\.json.*num_quantizers = 32"):
        MossAudioTokenizer(ckpt, compute_dtype="fp32", n_vq=33)
    # config.json says 48 quantizers, the weights hold 32
    bad = tmp_path / "more"
    shutil.copytree(ckpt, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantizer_kwargs"]["num_quantizers"] = 48
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(AudioTokenizerError, match=r"model\.safetensors.*quantizers\.32\.codebook"):
        MossAudioTokenizer(bad, compute_dtype="fp32")
    # codebook size disagrees with the weights
    cfg["quantizer_kwargs"].update(num_quantizers=32, codebook_size=128)
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        AudioTokenizerError, match=r"model\.safetensors.*shape \(64, 4\).*\(128, 4\)"
    ):
        MossAudioTokenizer(bad, compute_dtype="fp32")


def test_old_weight_norm_names_load_the_same(ckpt, codec, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(ckpt, old)
    sd = load_file(old / "model.safetensors")
    renamed = {}
    for k, v in sd.items():
        k = k.replace(".parametrizations.weight.original0", ".weight_g")
        renamed[k.replace(".parametrizations.weight.original1", ".weight_v")] = v
    save_file(renamed, old / "model.safetensors")
    clips = _clips([9], seed=9)
    np.testing.assert_array_equal(
        MossAudioTokenizer(old, compute_dtype="fp32").decode(clips)[0], codec.decode(clips)[0]
    )


def test_fewer_codebooks_decode_the_prefix(ckpt, codec):
    # n_vq 12 (as a model with fewer codebooks uses it) ignores codebooks 12..31
    c12 = MossAudioTokenizer(ckpt, compute_dtype="fp32", n_vq=12)
    clip = _clips([15], seed=10)[0]
    other = clip.clone()
    other[:, 12:] = (other[:, 12:] + 1) % CODEBOOK
    np.testing.assert_array_equal(c12.decode([clip])[0], c12.decode([other[:, :12]])[0])
    assert not np.allclose(codec.decode([clip])[0], codec.decode([other])[0])


def test_encode_a_stereo_48k_voice(codec):
    t = np.arange(48000 // 10) / 48000
    stereo = np.stack([np.sin(2 * np.pi * 220 * t), np.sin(2 * np.pi * 330 * t)], 1) * 0.3
    codes = codec.encode(stereo.astype(np.float32), 48000)
    assert codes.dtype == torch.long and codes.shape == (2400 // codec.hop, 32)
    assert int(codes.min()) >= 0 and int(codes.max()) < CODEBOOK


def test_load_codec_picks_the_implementation_from_config_json(ckpt, tmp_path):
    from bestofn.fakes import moss_codec
    from bestofn.moss.codec.load import load_codec

    c = load_codec(ckpt, compute_dtype="fp32", n_vq=32, decode_batch_size=4)
    assert isinstance(c, MossAudioTokenizer) and c.sample_rate == 24000 and c.n_vq == 32
    assert (c.version, c.channels) == ("v1", 1)
    v2 = load_codec(moss_codec.write(tmp_path / "v2", "tiny"), compute_dtype="fp32", n_vq=12)
    assert isinstance(v2, MossAudioTokenizer) and (v2.version, v2.channels) == ("v2", 2)
    assert (v2.sample_rate, v2.hop, v2.n_vq) == (48000, 3840, 12)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"sampling_rate": 48000, "n_vq": 12}))
    with pytest.raises(ValueError, match=r"other/config.json: not a MOSS-Audio-Tokenizer"):
        load_codec(other)
    with pytest.raises(FileNotFoundError, match="codec_dir"):
        load_codec(tmp_path / "nowhere")


def test_fp8_matmul_path_where_scaled_mm_runs(ckpt, codec, monkeypatch):
    # The path an H100/H200 runs (fp8 weights and activations through torch._scaled_mm),
    # run here on the CPU where this torch build has the kernel, by lifting the GPU check.
    from bestofn.moss.codec import tokenizer as mat

    try:
        mat.Linear(torch.randn(16, 32), "fp8", torch.bfloat16)(torch.randn(3, 32))
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch._scaled_mm does not run on this CPU build: {e}")
    monkeypatch.setattr(mat, "fp8_matmul_problem", lambda device: None)
    fp8 = MossAudioTokenizer(ckpt, compute_dtype="fp8")
    assert fp8.mode == "fp8" and fp8.dtype == torch.bfloat16
    assert any(
        lin.mode == "fp8" for s in fp8.decoder if hasattr(s, "linears") for lin in s.linears()
    )
    clips = _clips([40, 13], seed=11)
    for ref, x in zip(codec.decode(clips), fp8.decode(clips), strict=True):
        assert 30 < _snr_db(ref, x) < 80
    batched = fp8.decode(clips)
    np.testing.assert_allclose(
        batched[1], fp8.decode([clips[1]])[0], rtol=0, atol=1e-2 * np.abs(batched[1]).max()
    )


def test_codec_bench_runs_every_row_on_a_cpu(tmp_path):
    from lab.bench.codec import main

    out = tmp_path / "codec.json"
    args = ["--size", "tiny", "--device", "cpu", "--batch", "3", "--seconds", "0.01"]
    args += ["--dtypes", "fp32,bf16,fp8", "--one-clip-n", "2", "--repeats", "1"]
    assert main([*args, "--work", str(tmp_path), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {(r["path"], r["dtype"]): r for r in result["rows"]}
    assert result["meta"]["frames_per_clip"] == 15 and result["meta"]["random_weights"]
    assert rows[("ours batched (eager)", "fp32")]["s_per_clip"] > 0
    assert "codec_compute_dtype: fp8" in rows[("ours batched (eager)", "fp8")]["status"]
    assert "codec_kernels: compiled" in rows[("ours batched (compiled)", "bf16")]["status"]
    assert rows[("ours one clip at a time", "fp32")]["snr_db"] > 60  # same as batched
    if rows[("ours batched (eager)", "bf16")].get("snr_db") is not None:
        assert rows[("ours batched (eager)", "bf16")]["snr_db"] > 20
