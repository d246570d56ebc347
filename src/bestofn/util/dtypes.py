"""Which reduced precision a device can really run, decided by running the ops, not by CPU flags.

A CPU without AVX512-BF16 runs most bf16 work, but oneDNN has no bf16/fp16 LSTM kernel for it
under autocast ("could not create a primitive descriptor for the LSTM forward propagation
primitive"). So a backend names the ops it uses; :func:`resolve_dtype` runs each op once, tiny,
in the asked precision on the device (``mode="autocast"`` as the backend runs under
``torch.autocast``, ``mode="cast"`` with weights and inputs converted), caches the answer per
process, and falls back to float32 with a log line saying why when any op fails.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

ALIASES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}
MODES = ("autocast", "cast")


def canonical(dtype) -> str:
    """``bf16`` / ``torch.bfloat16`` / ``"bfloat16"`` -> ``"bfloat16"`` (likewise fp16, fp32)."""
    name = str(dtype).removeprefix("torch.")
    if name not in ALIASES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(ALIASES)}")
    return ALIASES[name]


def _run(device: str, dtype: str, op: str, mode: str) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 16, generator=g)  # (batch, time, channels)
    modules = {
        "linear": lambda: nn.Linear(16, 16),
        "conv1d": lambda: nn.Conv1d(16, 16, 3, padding=1),
        "depthwise_conv1d": lambda: nn.Conv1d(16, 16, 3, padding=1, groups=16),
        "conv_transpose1d": lambda: nn.ConvTranspose1d(16, 16, 4, stride=2, padding=1),
        "conv2d": lambda: nn.Conv2d(1, 4, 3, stride=2, padding=1),
        "lstm": lambda: nn.LSTM(16, 16, num_layers=2, batch_first=True),
        "layer_norm": lambda: nn.LayerNorm(16),
        "attention": None,
        "embedding": lambda: nn.Embedding(32, 16),
    }
    if op not in modules:
        raise ValueError(f"no dtype probe for op {op!r}; known: {sorted(modules)}")
    dev = torch.device(device)
    tdt = getattr(torch, dtype)
    m = modules[op]() if modules[op] else None
    if m is not None:
        m = m.to(dev).eval()
    x = x.to(dev)
    if mode == "cast":
        x = x.to(tdt)
        if m is not None:
            m = m.to(tdt)

    def forward():
        if op in ("conv1d", "depthwise_conv1d", "conv_transpose1d"):
            return m(x.transpose(1, 2))
        if op == "conv2d":
            return m(x.unsqueeze(1))
        if op == "attention":
            q = x.view(2, 8, 2, 8).transpose(1, 2)
            return F.scaled_dot_product_attention(q, q, q)
        if op == "embedding":
            return m(torch.arange(8, device=dev).unsqueeze(0))
        out = m(x)
        return out[0] if isinstance(out, tuple) else out

    with torch.inference_mode():
        if mode == "autocast":
            with torch.autocast(device_type=dev.type, dtype=tdt):
                y = forward()
        else:
            y = forward()
        y.float().sum().item()  # make lazy devices finish the work


@functools.cache
def probe(device: str, dtype: str, op: str, mode: str) -> str | None:
    """None when ``op`` runs on ``device`` in ``dtype`` (``mode``: autocast or cast), else the
    error it raised. Cached per process: each probe costs milliseconds, once."""
    if mode not in MODES:
        raise ValueError(f"dtype probe mode must be one of {MODES}, got {mode!r}")
    try:
        _run(device, dtype, op, mode)
    except ValueError:
        raise
    except Exception as e:  # oneDNN / cuDNN "no kernel for this dtype" and the like
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def unsupported(device: str, dtype, ops, mode: str = "autocast") -> tuple[str, str] | None:
    """The first of ``ops`` that does not run in ``dtype`` on ``device``, with its error; None
    when all run. float32 always runs."""
    dtype = canonical(dtype)
    if dtype == "float32":
        return None
    for op in ops:
        err = probe(str(device), dtype, op, mode)
        if err is not None:
            return op, err
    return None


def resolve_dtype(backend: str, device: str, dtype, ops, mode: str = "autocast") -> str:
    """``dtype`` (canonical name) when every op of ``ops`` runs in it on ``device``; otherwise
    ``"float32"``, with a warning naming the backend, the op and the error."""
    dtype = canonical(dtype)
    bad = unsupported(device, dtype, ops, mode)
    if bad is None:
        return dtype
    op, err = bad
    log.warning(
        "%s: %s is not supported on %s for %s under %s (%s); running in float32 instead",
        backend,
        dtype,
        device,
        op,
        mode,
        err,
    )
    return "float32"
