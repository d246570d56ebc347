"""The wavlm-speaker scorer's speed dials (runtime precision, batch_size, max_seconds) against
the model card's usage: each take alone, float32, its whole length.

The tolerance test runs the real-shaped random checkpoint (WavLM-Base-Plus' layer sizes: 12
layers of width 768, the 512-channel front end, the x-vector TDNN), on short clips (0.5-1.2 s, not
15 s) to keep the CPU time small; random weights, so the figure bounds rounding, not what
trained weights do on speech (``bestofn ab`` on the GPU says that)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from bestofn.backends.speaker import (  # noqa: E402
    SpeakerScorer,
    ValidFrameGroupNorm,
    runtime_defaults,
)
from bestofn.fakes import speaker as fake  # noqa: E402
from bestofn.util.spec import GroupSpec  # noqa: E402

SR = 16000
# |spk_sim(dial) - spk_sim(float32, alone, whole)|: a tenth of the 0.86 same-speaker margin's
# resolution a selection floor needs, and half of bestofn ab's speaker_sim threshold (0.01)
BF16_TOLERANCE = 0.005


def clips(lengths_s, seed=0) -> list[np.ndarray]:
    """Voiced-ish test signals: a pitch per clip, harmonics and noise."""
    rng = np.random.default_rng(seed)
    out = []
    for k, seconds in enumerate(lengths_s):
        t = np.arange(int(seconds * SR)) / SR
        f0 = 110 + 15 * k
        x = sum(0.2 / h * np.sin(2 * np.pi * f0 * h * t) for h in (1, 2, 3))
        out.append((x + 0.03 * rng.standard_normal(t.size)).astype(np.float32))
    return out


def sims(scorer: SpeakerScorer, takes: list[np.ndarray], reference: np.ndarray) -> np.ndarray:
    emb = scorer.embed(takes)
    return (emb @ scorer.embed([reference])[0]).numpy()


def alone(scorer: SpeakerScorer, takes, reference) -> np.ndarray:
    """The model card's usage: each take embedded by itself."""
    return np.array([sims(scorer, [t], reference)[0] for t in takes])


@pytest.mark.slow  # the real-shaped checkpoint: ~95 M parameters on the CPU
def test_bf16_and_batches_stay_within_tolerance_on_the_real_shape():
    model = fake.build_model(tiny=False, seed=7)
    fe = fake.feature_extractor()
    # a pair of one length (batched together) and two lengths of their own
    takes = clips([0.8, 1.2, 0.8, 0.5])
    reference = clips([1.0], seed=1)[0]
    exact = SpeakerScorer.from_modules(copy.deepcopy(model), fe, precision="float32")
    want = alone(exact, takes, reference)
    assert np.ptp(want) > 1e-3  # the takes differ: a dial that mixed them up would show

    # float32, the takes of three lengths padded into one batch: the values alone
    batched32 = SpeakerScorer.from_modules(copy.deepcopy(model), fe, precision="float32")
    np.testing.assert_allclose(sims(batched32, takes, reference), want, atol=1e-5)

    # the CUDA default (bfloat16 body, float32 head), padded batches
    bf16 = SpeakerScorer.from_modules(copy.deepcopy(model), fe, precision="bfloat16")
    assert bf16.model.wavlm.encoder.layers[0].attention.k_proj.weight.dtype == torch.bfloat16
    assert bf16.model.tdnn[0].kernel.weight.dtype == torch.float32
    got = sims(bf16, takes, reference)
    assert np.abs(got - want).max() <= BF16_TOLERANCE, (got, want)
    assert not np.array_equal(got, want)  # bf16 ran: not the float32 path under another name


@pytest.fixture(scope="module")
def tiny():
    return fake.build_model(tiny=True, seed=7), fake.feature_extractor()


@pytest.mark.parametrize("batching", ["padded", "one_length"])
def test_a_takes_score_does_not_depend_on_its_group(tiny, batching):
    """The fakes' front end normalises over time (group norm, transformers' default). Padded:
    takes of other lengths share a batch, the group norm over each take's own frames; one
    length: they never share one. Either way a take scores the same alone and in any group."""
    model, fe = tiny
    scorer = SpeakerScorer.from_modules(
        copy.deepcopy(model), fe, precision="float32", batch_size=4, batching=batching
    )
    takes = clips([1.0, 1.7, 1.0, 0.6, 1.7, 1.3])
    reference = clips([1.2], seed=1)[0]
    want = alone(scorer, takes, reference)
    assert np.ptp(want) > 1e-3
    calls = []
    hook = scorer.model.register_forward_pre_hook(lambda m, a: calls.append(a[0].shape[0]))
    np.testing.assert_allclose(sims(scorer, takes, reference), want, atol=1e-6)
    hook.remove()
    # padded: 6 takes in batches of 4 and 2 (+ the reference); one length: 4 lengths, 4 passes
    assert calls == ([4, 2, 1] if batching == "padded" else [1, 2, 1, 2, 1])
    # the order of the takes in the group is the order of the scores
    np.testing.assert_allclose(sims(scorer, takes[::-1], reference), want[::-1], atol=1e-6)


def test_the_group_norm_over_the_padded_axis_would_move_the_score(tiny):
    """The reason for ValidFrameGroupNorm: the same padded batch through the plain group norm
    (over the whole padded time axis) moves the short take's x-vector."""
    model, fe = tiny
    scorer = SpeakerScorer.from_modules(copy.deepcopy(model), fe, precision="float32")
    takes = clips([0.6, 1.7])
    norm = scorer.model.wavlm.feature_extractor.conv_layers[0].layer_norm
    assert isinstance(norm, ValidFrameGroupNorm)
    with_mask = scorer.embed(takes)
    norm.__class__, scorer._norm = torch.nn.GroupNorm, None  # the plain norm sees the padding
    without = scorer.embed(takes)
    assert float((with_mask[0] - without[0]).abs().max()) > 1e-3  # the short take moved
    np.testing.assert_allclose(with_mask[1].numpy(), without[1].numpy(), atol=1e-6)  # longest


def test_max_seconds_embeds_the_central_seconds(tiny):
    model, fe = tiny
    takes = clips([1.0, 2.0, 0.5])
    reference = clips([1.5], seed=1)[0]
    whole = SpeakerScorer.from_modules(model, fe, precision="float32")
    longer = SpeakerScorer.from_modules(model, fe, precision="float32", max_seconds=3.0)
    # a crop longer than every take changes nothing
    np.testing.assert_array_equal(sims(longer, takes, reference), sims(whole, takes, reference))
    cropped = SpeakerScorer.from_modules(model, fe, precision="float32", max_seconds=0.75)
    central = [t[(t.size - 12000) // 2 :][:12000] if t.size > 12000 else t for t in takes]
    ref_central = reference[(reference.size - 12000) // 2 :][:12000]
    np.testing.assert_allclose(
        sims(cropped, takes, reference), alone(whole, central, ref_central), atol=1e-6
    )
    assert [c.size for c in map(cropped.crop, takes)] == [12000, 12000, 8000]


def test_dials_default_from_the_schema_and_name_themselves(tiny):
    model, fe = tiny
    defaults = runtime_defaults()
    assert defaults == {
        "precision": "auto", "max_seconds": None, "batch_size": 64, "batching": "padded"
    }  # fmt: skip
    scorer = SpeakerScorer.from_modules(model, fe)
    assert scorer.dtype == "float32"  # auto on the CPU
    assert scorer.batch_size == 64 and scorer.max_seconds is None
    path = scorer.provenance()["kernel_path"]
    assert path == {"precision": "float32", "head": "float32", "batching": "padded",
                    "batch_size": 64, "max_seconds": None}  # fmt: skip
    # the option dtype (part of the identity) wins over runtime.precision
    fixed = SpeakerScorer.from_modules(model, fe, dtype="float32", precision="bfloat16")
    assert fixed.dtype == "float32"
    with pytest.raises(ValueError, match="runtime.precision"):
        SpeakerScorer.from_modules(model, fe, precision="int4")
    with pytest.raises(ValueError, match="max_seconds"):
        SpeakerScorer.from_modules(model, fe, max_seconds=-1)
    with pytest.raises(ValueError, match="runtime.batching"):
        SpeakerScorer.from_modules(model, fe, batching="ragged")


def test_score_keeps_the_group_order_with_a_reference(tiny, tmp_path):
    import soundfile as sf

    model, fe = tiny
    scorer = SpeakerScorer.from_modules(model, fe, precision="float32", batch_size=2)
    takes = clips([0.8, 1.2, 0.8])
    ref = tmp_path / "ref.wav"
    sf.write(ref, takes[1], SR)
    spec = GroupSpec(emotion="calm", prompt_id="p1", text="hi", n_takes=3, reference_audio=str(ref))
    out = scorer.score(takes, SR, spec)
    assert out["spk_sim"][1] == pytest.approx(1.0, abs=1e-5)  # the reference's own take
    assert max(out["spk_sim"][0], out["spk_sim"][2]) < out["spk_sim"][1]


def test_a_take_shorter_than_the_model_takes_is_padded_alone(tiny):
    """The TDNN needs its receptive field of frames and the pooling's standard deviation two
    of them: a shorter take (an empty take's silence, a cut word) is padded with silence to the
    minimum, alone, and embeds to a finite x-vector there; one frame (320 samples) less gives
    NaN, and less than the receptive field fails."""
    model, fe = tiny
    scorer = SpeakerScorer.from_modules(model, fe, precision="float32")
    n = scorer.min_samples
    short, ok = clips([0.1, 1.0])
    padded = np.pad(short, (0, n - short.size))
    got = scorer.embed([short, ok])
    assert torch.isfinite(got).all()
    np.testing.assert_allclose(got[0].numpy(), scorer.embed([padded])[0].numpy(), atol=1e-6)
    with torch.inference_mode():
        assert torch.isfinite(scorer._forward([padded])).all()
        assert torch.isnan(scorer._forward([padded[: n - 320]])).all()
        with pytest.raises(RuntimeError):
            scorer._forward([padded[: n - 321]])
