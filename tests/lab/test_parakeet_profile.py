"""lab.probes.parakeet_profile and parakeet_encoder_probe on the tiny random-weight
Parakeet-TDT, on the CPU: the blank-bias knob, the bisection to a declared emission rate, the
encoder/decoder split of the scorer's path, the encoder knobs undone, and the CLIs' smoke modes.
(The figures themselves come from the H200, not from here.)"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

# Whether NeMo is installed, not imported: importing nemo.collections.asr takes ~8 s, which every
# pytest-xdist worker paid while collecting (this file's tests import it where they run).
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("nemo") is None, reason="nemo_toolkit[asr] not installed"
)


@pytest.fixture(scope="module")
def pp():
    from lab.probes import parakeet_profile

    return parakeet_profile


@pytest.fixture(scope="module")
def scorer(tmp_path_factory):
    from bestofn.fakes import parakeet

    return parakeet.build("cpu", "tiny", workdir=str(tmp_path_factory.mktemp("pk")), batch_size=2)


def _blank_bias(scorer, pp):
    return scorer.model.joint.joint_net[-1].bias[pp.blank_index(scorer.model)].clone()


def test_blank_index_is_after_the_vocabulary(scorer, pp):
    from bestofn.fakes.parakeet import TDT_DURATIONS, TINY_SIZE

    blank = pp.blank_index(scorer.model)
    assert blank == TINY_SIZE["vocab_size"] == scorer.model.tokenizer.vocab_size
    assert scorer.model.joint.joint_net[-1].out_features == blank + 1 + len(TDT_DURATIONS)


def test_blank_bias_knob_cuts_emission_and_is_restored(scorer, pp):
    audios = pp.clips(4, 2.0)
    encoded = pp.encode_all(scorer, audios)
    blank = pp.blank_index(scorer.model)
    before = _blank_bias(scorer, pp)
    base = pp.mean_tokens(pp.decode_all(scorer, encoded), blank)
    assert base > 0
    with pp.blank_bias_raised(scorer.model, 0.4) as original:
        assert original == float(before)
        assert float(_blank_bias(scorer, pp)) == pytest.approx(float(before) + 0.4)
        fewer = pp.mean_tokens(pp.decode_all(scorer, encoded), blank)
    with pp.blank_bias_raised(scorer.model, 100.0):  # blank always wins
        assert pp.mean_tokens(pp.decode_all(scorer, encoded), blank) == 0
    assert fewer < base
    assert torch.equal(_blank_bias(scorer, pp), before)
    with pytest.raises(ZeroDivisionError), pp.blank_bias_raised(scorer.model, 5.0):
        1 / 0  # noqa: B018
    assert torch.equal(_blank_bias(scorer, pp), before)
    old = pp.set_blank_bias(scorer.model, 3.0)
    assert old == float(before) and float(_blank_bias(scorer, pp)) == 3.0
    pp.set_blank_bias(scorer.model, old)
    assert torch.equal(_blank_bias(scorer, pp), before)


def test_profile_lands_in_the_declared_range(scorer, pp):
    audios = pp.clips(4, 2.0)
    before = _blank_bias(scorer, pp)
    low, high, target = 5.0, 9.0, 7.0  # ~3.5 tokens/s, as 40-70 per 15 s
    rows = pp.profile(scorer, audios, (low, high), target, repeats=1)
    by = {(r["row"], r.get("emission", r.get("variant"))): r for r in rows}
    random = by["transcribe", "random weights"]
    speech = by["transcribe", "speech-rate emission (declared)"]
    bisection = by["bisection", None]
    assert random["tokens_per_clip"] > high  # random weights emit more than speech would
    assert low <= speech["tokens_per_clip"] <= high
    assert speech["tokens_per_clip"] < random["tokens_per_clip"]
    assert speech["blank_offset"] == bisection["blank_offset"] > 0
    assert speech["blank_bias"] == pytest.approx(float(before) + speech["blank_offset"])
    # the script's encoder half + NeMo's decoding give exactly transcribe's transcripts
    for emission in ("random weights", "speech-rate emission (declared)"):
        assert by["decoder", emission]["same_text_as_transcribe"] == 1.0
        assert (
            by["decoder", emission]["tokens_per_clip"]
            == by["transcribe", emission]["tokens_per_clip"]
        )
    assert by["encoder", "preprocessor + encoder (eager)"]["s_per_clip"] > 0
    assert by["sum", None]["bias_restored"] is True
    assert torch.equal(_blank_bias(scorer, pp), before)


def test_bisection_raises_when_the_range_is_missed(pp):
    # a count that jumps from 100 to 0: no offset lands in 40-70
    with pytest.raises(RuntimeError, match="no blank offset gave"):
        pp.bisect_blank_offset(lambda o: 100.0 if o < 0.3 else 0.0, 40, 70, 55)
    offset, tokens, trace = pp.bisect_blank_offset(lambda o: 100.0 / (1 + o), 40, 70, 55)
    assert 40 <= tokens <= 70 and trace[0] == (0.0, 100.0)
    assert tokens == pytest.approx(100.0 / (1 + offset), abs=1e-3)


def test_cli_smoke_writes_rows(pp, tmp_path):
    rows = pp.main(["--device", "cpu", "--size", "tiny", "--clips", "2", "--batch", "2",
                    "--repeats", "1", "--out", str(tmp_path)])  # fmt: skip
    written = [
        json.loads(line)
        for line in (tmp_path / "parakeet_profile.json").read_text().split("\n")
        if line
    ]
    assert written == json.loads(json.dumps(rows))
    assert [r["row"] for r in rows][:2] == ["environment", "encoder"]
    assert rows[-1]["row"] == "sum" and rows[-1]["bias_restored"] is True


@pytest.fixture(scope="module")
def pep():
    from lab.probes import parakeet_encoder_probe

    return parakeet_encoder_probe


def test_encoder_probe_knobs_are_undone(scorer, pep):
    # each variant changes the loaded scorer for its rows only: the next row must see the base
    enc = scorer.model.encoder
    mods = [m for m in enc.modules() if hasattr(m, "use_pytorch_sdpa")]
    before = [m.use_pytorch_sdpa for m in mods]
    dtype, encoder_fn = next(enc.parameters()).dtype, scorer._encoder
    with pep.knob(scorer, "sdpa"):
        assert all(m.use_pytorch_sdpa for m in mods)
    with pep.knob(scorer, "bf16-weights"):
        assert next(enc.parameters()).dtype == torch.bfloat16
    with pep.knob(scorer, "cudnn-benchmark"):
        assert torch.backends.cudnn.benchmark
    assert [m.use_pytorch_sdpa for m in mods] == before
    assert next(enc.parameters()).dtype == dtype and scorer._encoder is encoder_fn
    assert not torch.backends.cudnn.benchmark


def test_encoder_probe_cli_smoke(pep, tmp_path):
    rows = pep.main(["--device", "cpu", "--size", "tiny", "--clips", "4", "--seconds", "2",
                     "--batch", "2", "--other-batches", "4", "--repeats", "1",
                     "--out", str(tmp_path)])  # fmt: skip
    variants = {r["variant"]: r for r in rows if r["row"] == "variant"}
    assert list(variants) == [
        "base", "cudnn-benchmark", "sdpa", "bf16-weights", "batch-4", "base-again"
    ]  # fmt: skip
    assert variants["cudnn-benchmark"]["max_abs_diff"] == 0.0  # a CPU ignores it
    assert variants["sdpa"]["max_abs_diff"] < 1e-4  # float32 here: the same attention
    written = (tmp_path / "parakeet_encoder_probe.json").read_text().splitlines()
    assert [json.loads(line) for line in written] == json.loads(json.dumps(rows))
