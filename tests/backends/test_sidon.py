"""Sidon restorer on tiny random models written to disk in the real release layout:

w2v_bert_dir/  config.json + model.safetensors     (a 3-layer w2v-BERT; Sidon keeps 2 here)
adapter_dir/   adapter_config.json + adapter_model.safetensors (peft LoRA on output_dense)
               decoder_state_dict.pt (DAC Decoder, weight-norm g/v pairs)
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed")

from bestofn.backends import sidon  # noqa: E402
from bestofn.backends.registry import build  # noqa: E402
from bestofn.fakes import sidon as fake_sidon  # noqa: E402

N_LAYERS = 2
R, ALPHA = 4, 16


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from safetensors.torch import save_file
    from transformers import Wav2Vec2BertModel

    root = tmp_path_factory.mktemp("sidon")
    torch.manual_seed(0)
    base = Wav2Vec2BertModel(fake_sidon.w2v_bert_config(tiny=True, num_layers=3)).eval()
    base.save_pretrained(root / "w2v-bert-2.0")

    adapter = root / "sidon_raw_weight"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": R,
                "lora_alpha": ALPHA,
                "lora_dropout": 0.1,
                "bias": "lora_only",
                "target_modules": ["output_dense"],
                "use_rslora": False,
                "use_dora": False,
                "fan_in_fan_out": False,
                "task_type": None,
            }
        )
    )
    g = torch.Generator().manual_seed(2)
    lora = {}
    for i in range(N_LAYERS):
        for ffn in ("ffn1", "ffn2"):
            lin = getattr(base.encoder.layers[i], ffn).output_dense
            key = f"base_model.model.encoder.layers.{i}.{ffn}.output_dense"
            lora[f"{key}.lora_A.weight"] = torch.randn(R, lin.in_features, generator=g) * 0.1
            lora[f"{key}.lora_B.weight"] = torch.randn(lin.out_features, R, generator=g) * 0.1
    save_file(lora, str(adapter / "adapter_model.safetensors"))

    decoder = fake_sidon.weight_normed_decoder(32, 32, seed=1)
    torch.save(decoder.state_dict(), adapter / "decoder_state_dict.pt")
    return {
        "root": root,
        "base": base,
        "lora": lora,
        "decoder": decoder,
        "options": {
            "w2v_bert_dir": str(root / "w2v-bert-2.0"),
            "adapter_dir": str(adapter),
            "num_layers": N_LAYERS,
            "batch_size": 3,
            "tail_pad_s": 0.3,
        },
    }  # > the decoder's ~0.2 s reach past a take's end


@pytest.fixture(scope="module")
def restorer(release):
    return build("restorer", "sidon", release["options"])  # as the fused worker builds it


def _takes(sr=16000, seconds=(0.3, 0.55, 0.42, 0.12), seed=0):
    rng = np.random.default_rng(seed)
    return [
        (
            0.2 * np.sin(2 * np.pi * 220 * (i + 1) * np.arange(int(s * sr)) / sr)
            + 0.02 * rng.standard_normal(int(s * sr))
        ).astype(np.float32)
        for i, s in enumerate(seconds)
    ]


def test_fbank_matches_transformers_extractor():
    from transformers import SeamlessM4TFeatureExtractor

    takes = _takes(seconds=(0.4, 0.6666, 0.2))
    ref = SeamlessM4TFeatureExtractor()(takes, sampling_rate=16000, return_tensors="np")
    wav = np.zeros((3, max(map(len, takes))), np.float32)
    for i, a in enumerate(takes):
        wav[i, : len(a)] = a
    feats, mask = sidon.SeamlessFbank()(torch.from_numpy(wav), torch.tensor(list(map(len, takes))))
    assert feats.shape == ref["input_features"].shape
    np.testing.assert_array_equal(mask.numpy(), ref["attention_mask"])
    np.testing.assert_allclose(feats.numpy(), ref["input_features"], atol=2e-3)


def test_lora_is_merged_into_the_loaded_weights(restorer, release):
    scale = ALPHA / R
    for i in range(N_LAYERS):
        for ffn in ("ffn1", "ffn2"):
            key = f"base_model.model.encoder.layers.{i}.{ffn}.output_dense"
            base_w = getattr(release["base"].encoder.layers[i], ffn).output_dense.weight
            want = (
                base_w
                + scale
                * release["lora"][f"{key}.lora_B.weight"]
                @ release["lora"][f"{key}.lora_A.weight"]
            )
            got = getattr(restorer.encoder.encoder.layers[i], ffn).output_dense.weight
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert len(restorer.encoder.encoder.layers) == N_LAYERS  # truncated from 3


def test_merged_encoder_matches_peft(restorer, release):
    """peft's own unmerged LoRA forward gives the same features as our merged weights."""
    peft = pytest.importorskip("peft")
    from transformers import Wav2Vec2BertModel

    base = Wav2Vec2BertModel.from_pretrained(
        release["options"]["w2v_bert_dir"], num_hidden_layers=N_LAYERS, layerdrop=0.0
    )
    model = peft.PeftModel.from_pretrained(base, release["options"]["adapter_dir"]).eval()
    feats, mask = sidon.SeamlessFbank()(
        torch.from_numpy(_takes(seconds=(0.5,))[0])[None], torch.tensor([8000])
    )
    with torch.no_grad():
        want = model(input_features=feats, attention_mask=mask).last_hidden_state
        got = restorer.encoder(input_features=feats, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_decoder_weight_norm_folding(restorer, release):
    x = torch.randn(2, 32, 7)
    with torch.no_grad():
        torch.testing.assert_close(restorer.decoder(x), release["decoder"](x), atol=1e-5, rtol=1e-4)
    # hop 960; each odd-stride transposed conv (5, 3) drops one sample at its own rate
    assert restorer.decoder(x).shape[-1] == 7 * 960 - (4 * 3 * 2 + 2)


@pytest.mark.parametrize("sr", [16000, 24000])
def test_restore_lengths_rate_and_range(restorer, sr):
    takes = _takes(sr=sr)
    takes[1] = np.stack([takes[1], takes[1]], axis=1)  # a stereo take is mixed down
    out, sr_out = restorer.restore(takes, sr)
    assert sr_out == 48000 and len(out) == len(takes)
    for a, y in zip(takes, out, strict=True):
        assert y.dtype == np.float32 and y.ndim == 1
        assert len(y) == round(a.shape[0] * 48000 / sr)  # exact length per take
        assert np.isfinite(y).all() and np.abs(y).max() <= 1.0
        assert np.abs(y).max() > 0


def test_batching_does_not_change_a_take(release):
    takes = _takes()
    batched = sidon.SidonRestorer(**{**release["options"], "batch_size": 4}).restore(takes, 16000)
    single = sidon.SidonRestorer(**{**release["options"], "batch_size": 1}).restore(takes, 16000)
    for a, b in zip(batched[0], single[0], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_merged_cache_is_written_and_reused(release, tmp_path):
    opts = {**release["options"], "cache_dir": str(tmp_path / "cache")}
    first = sidon.SidonRestorer(**opts)
    assert not first.merged_from_cache
    assert len(list((tmp_path / "cache").glob("sidon-cleanser-*.safetensors"))) == 1
    second = sidon.SidonRestorer(**opts)
    assert second.merged_from_cache
    for k, v in first.encoder.state_dict().items():
        torch.testing.assert_close(second.encoder.state_dict()[k], v)
    takes = _takes(seconds=(0.2,))
    np.testing.assert_array_equal(
        first.restore(takes, 16000)[0][0], second.restore(takes, 16000)[0][0]
    )


def test_provenance_has_hashes(restorer):
    p = restorer.provenance()
    assert set(p["sha256"]) >= {"w2v_bert", "adapter", "decoder"}
    assert all(len(h) == 64 for h in p["sha256"].values())
    assert p["decoder_kernels"] == "eager"  # the fused kernels are CUDA only


def test_decoder_kernels_names_the_fused_layout():
    from bestofn.backends import sidon as backend

    kernels = backend.DecoderKernels("auto", "channels_last")  # one restorer's own state
    kernels.kernel = {"snake": None, "residual": None}  # "Triton imported"
    assert kernels.describe("cuda:0") == "fused snake + conv bias, channels_last"
    assert kernels.describe("cpu") == "eager"
    kernels.set_layout("nchw")
    assert kernels.describe("cuda") == "fused snake + conv bias, nchw"
    with pytest.raises(ValueError, match="layout must be one of nchw, channels_last"):
        kernels.set_layout("nhwc")
    kernels.kernel = False  # Triton absent or failed here
    assert kernels.describe("cuda") == "eager"


def test_decoder_path_is_each_restorers_own(release):
    """runtime snake and layout are read when a restorer is built and belong to it: two
    restorers in one process (as `bestofn ab` builds A and B) each keep their own."""
    nchw = build("restorer", "sidon", {**release["options"], "layout": "nchw", "snake": "eager"})
    default = fake_sidon.build("cpu", "tiny")
    assert (nchw.kernels.layout, nchw.kernels.mode) == ("nchw", "eager")
    assert (default.kernels.layout, default.kernels.mode) == ("channels_last", "auto")
    assert nchw.decoder.kernels is nchw.kernels and default.decoder.kernels is default.kernels
    snakes = [m for m in nchw.decoder.modules() if isinstance(m, sidon.Snake1d)]
    assert snakes and all(m.kernels is nchw.kernels for m in snakes)
    default.set_speed(layout="nchw")
    assert nchw.kernels is not default.kernels and nchw.kernels.mode == "eager"
    with pytest.raises(ValueError, match="layout must be one of nchw, channels_last"):
        fake_sidon.build("cpu", "tiny", layout="nhwc")
    with pytest.raises(ValueError, match="snake must be auto, fused or eager"):
        build("restorer", "sidon", {**release["options"], "snake": "fast"})


def test_random_tiny_variant():
    r = fake_sidon.build("cpu", "tiny")
    out, sr = r.restore(_takes(seconds=(0.2,)), 16000)
    assert sr == 48000 and len(out[0]) == 0.2 * 48000


# --- clear errors for missing / corrupt / foreign weights ------------------------------------


def test_missing_dirs_name_path_and_field(release, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere.*w2v_bert_dir"):
        sidon.SidonRestorer(**{**release["options"], "w2v_bert_dir": str(tmp_path / "nowhere")})
    with pytest.raises(ValueError, match="adapter_dir is required"):
        sidon.SidonRestorer(w2v_bert_dir=release["options"]["w2v_bert_dir"])


def test_corrupt_decoder_is_a_clear_error(release, tmp_path):
    bad = tmp_path / "decoder_state_dict.pt"
    bad.write_bytes(b"\x00garbage" * 64)
    with pytest.raises(sidon.SidonLoadError, match=r"decoder_state_dict\.pt.*corrupt"):
        sidon.SidonRestorer(**{**release["options"], "decoder_path": str(bad)})


def test_foreign_decoder_layout_is_refused(release, tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"conv.weight": torch.zeros(3)}, other)
    with pytest.raises(sidon.SidonLoadError, match="not a DAC Decoder state dict"):
        sidon.SidonRestorer(**{**release["options"], "decoder_path": str(other)})


def test_adapter_with_wrong_layout_is_refused(release, tmp_path):
    import shutil

    from safetensors.torch import save_file

    adapter = tmp_path / "adapter"
    shutil.copytree(release["options"]["adapter_dir"], adapter)
    partial = {k: v for k, v in release["lora"].items() if ".layers.1." not in k}
    save_file(partial, str(adapter / "adapter_model.safetensors"))
    with pytest.raises(sidon.SidonLoadError, match="does not have the Sidon layout"):
        sidon.SidonRestorer(**{**release["options"], "adapter_dir": str(adapter)})


def test_corrupt_base_weights_are_a_clear_error(release, tmp_path):
    import shutil

    base = tmp_path / "base"
    shutil.copytree(release["options"]["w2v_bert_dir"], base)
    (base / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(sidon.SidonLoadError, match=r"base.*w2v_bert_dir"):
        sidon.SidonRestorer(**{**release["options"], "w2v_bert_dir": str(base)})


class CudaLike(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the fused (CUDA-only) branches, taken here."""

    @property
    def is_cuda(self):
        return True


def test_fused_snake_failure_falls_back_to_eager(caplog):
    """On a GPU where the Triton Snake cannot run, auto falls back to the eager ops (with a
    warning) and stays there; snake=fused raises instead."""
    from bestofn.backends import sidon as backend

    def broken(x, alpha):
        raise RuntimeError("no kernel for this GPU")

    snake = backend.Snake1d(3)
    with torch.no_grad():
        snake.alpha.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 7)
    want = x + (snake.alpha + 1e-9).reciprocal() * torch.sin(snake.alpha * x).pow(2)
    kernels = snake.kernels = backend.DecoderKernels("auto")
    kernels.snake = broken
    kernels.kernel = broken  # "Triton imported"
    with torch.no_grad():
        got = snake(x.as_subclass(CudaLike)).as_subclass(torch.Tensor)
    assert torch.equal(got, want)
    assert kernels.kernel is False and "fused Snake failed" in caplog.text
    kernels.set_snake("fused")
    kernels.kernel = broken
    with pytest.raises(RuntimeError, match="no kernel"), torch.no_grad():
        snake(x.as_subclass(CudaLike))


def _per_channel(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-channel vector shaped to broadcast over [B, C, T] or [B, C, 1, T]."""
    return v.reshape(1, -1, *([1] * (like.dim() - 2)))


def _snake_as_the_kernel(x, alpha, bias=None):
    """What the Triton snake kernel computes, in torch ops (CPU stand-in)."""
    if bias is not None:
        x = x + _per_channel(bias, x).to(x.dtype)
    a = _per_channel(alpha, x)
    return x + (a + 1e-9).reciprocal() * torch.sin(a * x).pow(2)


def _residual_as_the_kernel(x, x_bias, conv_out, conv_bias):
    if x_bias is not None:
        x = x + _per_channel(x_bias, x).to(x.dtype)
    return x + (conv_out + _per_channel(conv_bias, conv_out).to(conv_out.dtype))


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_fused_decoder_adds_every_bias_once(layout):
    """The fused decoder path (convolutions without bias, each bias added by the kernel that
    reads the output next; optionally channels last) gives the plain decoder's output. The
    kernels are replaced by their arithmetic in torch ops, so this checks the plumbing: which
    bias goes where, the input conv, the transposed convs, the residual sums, the tail."""
    from bestofn.backends import sidon as backend

    dec = backend.DACDecoder(16, 32, backend.DECODER_RATES)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in dec.named_parameters():  # biases and alphas far from 0 and 1
            (p.uniform_(0.5, 1.5) if name.endswith("alpha") else p.normal_(0, 0.3))
    dec = dec.double().eval()  # float64: conv-then-add and mkldnn's fused bias agree closely
    x = torch.randn(2, 9, 16, dtype=torch.float64).transpose(1, 2)  # [B, C, T], as handed over
    with torch.no_grad():
        want = dec.model(x)
        kernels = backend.DecoderKernels("fused", layout)
        kernels.snake, kernels.residual = _snake_as_the_kernel, _residual_as_the_kernel
        kernels.kernel = {"snake": None, "residual": None}
        dec.use_kernels(kernels)
        got = dec(x.as_subclass(CudaLike)).as_subclass(torch.Tensor)
    assert got.shape == want.shape and want.shape[:2] == (2, 1)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    kernels.fuse_bias = False  # Snake alone fused: the old path
    with torch.no_grad():
        again = dec(x.as_subclass(CudaLike)).as_subclass(torch.Tensor)
    torch.testing.assert_close(again, want, rtol=1e-9, atol=1e-9)
