"""bestofn.util.dtypes: reduced precision is decided by running the op, and backends fall back to
float32 with a log line where the device cannot run it.

Every test here passes whatever the CPU: the fallback tests force the probe to say
"unsupported", and the probe test only checks that the probe agrees with running the op."""

from __future__ import annotations

import logging

import pytest
import torch

from bestofn.util import dtypes


@pytest.fixture
def no_reduced_precision(monkeypatch):
    """Every bf16/fp16 probe fails, as on a CPU without AVX512-BF16 for an LSTM."""
    calls = []

    def probe(device, dtype, op, mode):
        calls.append((device, dtype, op, mode))
        return "RuntimeError: forced by the test (no kernel for this dtype)"

    monkeypatch.setattr(dtypes, "probe", probe)
    return calls


def test_canonical_names():
    assert dtypes.canonical("bf16") == "bfloat16"
    assert dtypes.canonical(torch.float16) == "float16"
    assert dtypes.canonical("fp32") == "float32"
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        dtypes.canonical("int3")


def test_float32_is_never_probed(no_reduced_precision):
    assert dtypes.resolve_dtype("x", "cpu", "float32", ["lstm"]) == "float32"
    assert no_reduced_precision == []


def test_unknown_op_and_mode_are_refused():
    with pytest.raises(ValueError, match="no dtype probe for op 'warp'"):
        dtypes.probe("cpu", "bfloat16", "warp", "autocast")
    with pytest.raises(ValueError, match="mode"):
        dtypes.probe("cpu", "bfloat16", "linear", "sideways")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("mode", dtypes.MODES)
def test_lstm_probe_agrees_with_running_an_lstm(dtype, mode):
    """Whatever this CPU can do, the probe's answer is what running the op gives."""
    lstm = torch.nn.LSTM(4, 4, batch_first=True)
    x = torch.randn(1, 3, 4)
    tdt = getattr(torch, dtype)
    try:
        with torch.inference_mode():
            if mode == "autocast":
                with torch.autocast("cpu", dtype=tdt):
                    lstm(x)
            else:
                lstm.to(tdt)(x.to(tdt))
        runs = True
    except RuntimeError:
        runs = False
    assert (dtypes.probe("cpu", dtype, "lstm", mode) is None) == runs


def test_resolve_falls_back_and_says_why(no_reduced_precision, caplog):
    with caplog.at_level(logging.WARNING, logger="bestofn.util.dtypes"):
        got = dtypes.resolve_dtype("parakeet", "cpu", "bf16", ["linear", "lstm"])
    assert got == "float32"
    assert no_reduced_precision == [("cpu", "bfloat16", "linear", "autocast")]  # first failure
    msg = caplog.text
    assert "parakeet" in msg and "bfloat16" in msg and "float32" in msg and "forced" in msg


def test_resolve_keeps_a_supported_dtype(monkeypatch):
    monkeypatch.setattr(dtypes, "probe", lambda *a: None)
    assert dtypes.resolve_dtype("sidon", "cpu", "float16", ["conv1d"]) == "float16"


# --- every backend that runs bf16/fp16 on a CPU takes the fallback ---------------------------


def _warned(caplog, backend: str, dtype: str) -> bool:
    return any(
        r.name == "bestofn.util.dtypes" and f"{backend}: {dtype} is not supported" in r.getMessage()
        for r in caplog.records
    )


def test_sidon_fp16_falls_back_to_fp32(no_reduced_precision, caplog):
    import numpy as np

    from bestofn.fakes import sidon

    with caplog.at_level(logging.WARNING):
        r = sidon.build("cpu", "tiny", dtype="float16")
    assert r.dtype == "float32" == r.provenance()["dtype"]
    assert _warned(caplog, "sidon", "float16")
    ref = sidon.build("cpu", "tiny", dtype="float32")
    take = [np.sin(np.arange(4000) / 9).astype(np.float32) * 0.3]
    np.testing.assert_array_equal(r.restore(take, 16000)[0][0], ref.restore(take, 16000)[0][0])


def test_voiceclap_bf16_falls_back_to_fp32(no_reduced_precision, caplog):
    from bestofn.fakes import voiceclap

    with caplog.at_level(logging.WARNING):
        s = voiceclap.build("cpu", "tiny", dtype="bfloat16")
    assert s.dtype == "float32"
    assert _warned(caplog, "voiceclap", "bfloat16")
    assert not torch.is_autocast_enabled("cpu")
    with s._autocast():
        assert not torch.is_autocast_enabled("cpu")


def test_empathic_bf16_falls_back_to_fp32(no_reduced_precision, caplog):
    from bestofn.fakes import empathic

    with caplog.at_level(logging.WARNING):
        s = empathic.build("cpu", "tiny", n_emotion_heads=2, n_quality_heads=1, dtype="bfloat16")
    assert s.dtype == "float32" and s.encoder.dtype == torch.float32
    assert _warned(caplog, "empathic-insight", "bfloat16")
