"""Where Parakeet's encoder time goes, and which cheap knobs move it. Random weights
at the real size (``bestofn.fakes.parakeet``), 15-s noise clips, one model for every row.

Rows (JSON lines, also written to ``OUT/parakeet_encoder_probe.json``), each the median of 3
passes over all clips after a warm-up pass, ``torch.cuda.synchronize`` around each:

- ``variant``: preprocessor + encoder through the scorer's ``encode_batch`` (bf16 autocast, as
  in production) with one knob changed; ``max_abs_diff`` is against the ``base`` output of the
  same clips (autocast rounding moves it; a broken variant moves it by O(1)):
  - ``base``: as the scorer runs it (the scorer's CUDA default is SDPA, so on CUDA the
    ``sdpa`` row repeats the base);
  - ``cudnn-benchmark``: ``torch.backends.cudnn.benchmark = True`` (cuDNN times its conv
    algorithms per shape);
  - ``sdpa``: every attention module with NeMo's own ``use_pytorch_sdpa`` switch on;
  - ``bf16-weights``: the encoder's weights cast to bf16 and run without autocast (no
    per-call weight casts, no float32 round trips at NeMo's autocast boundaries);
  - ``batch-N``: the base at another batch size.
- ``kernels``: the top CUDA kernels of one base batch (torch.profiler), with their share.

    PYTHONPATH=src python3 -m lab.probes.parakeet_encoder_probe --out OUT [--clips 256]
    # CPU smoke test on the tiny fake:
    PYTHONPATH=src python3 -m lab.probes.parakeet_encoder_probe --device cpu --size tiny \
        --clips 4 --seconds 2 --batch 2 --out OUT
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from pathlib import Path

import torch

# the same clips, batches and timing as the decoder profile
from lab.probes.parakeet_profile import _emit, _sync, _timed, clips, encode_all


def encoded_clips(scorer, audios):
    """The encoder output of every clip, trimmed to its length, in input order (the scorer's
    own batches, through ``parakeet_profile.encode_all``)."""
    out = [None] * len(audios)
    for idx, enc, lens in encode_all(scorer, audios):
        for j, i in enumerate(idx):
            out[i] = enc[j, :, : int(lens[j])]
    return out


def timed(scorer, audios, device: str, repeats: int):
    """(seconds per clip, encoder outputs): the median of ``repeats`` passes after a warm-up."""
    seconds, result = _timed(lambda: encoded_clips(scorer, audios), device, repeats)
    return seconds / len(audios), result


def max_diff(a, b) -> float:
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))


@contextlib.contextmanager
def knob(scorer, name: str):
    """Set one knob on the loaded scorer; undo it after."""
    enc = scorer.model.encoder
    if name == "cudnn-benchmark":
        old = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            yield
        finally:
            torch.backends.cudnn.benchmark = old
    elif name == "sdpa":
        mods = [m for m in enc.modules() if hasattr(m, "use_pytorch_sdpa")]
        old = [(m.use_pytorch_sdpa, m.use_pytorch_sdpa_backends) for m in mods]
        for m in mods:
            m.use_pytorch_sdpa, m.use_pytorch_sdpa_backends = True, []
        try:
            yield
        finally:
            for m, (a, b) in zip(mods, old, strict=True):
                m.use_pytorch_sdpa, m.use_pytorch_sdpa_backends = a, b
    elif name == "bf16-weights":
        dtype, autocast = enc.parameters().__next__().dtype, scorer._autocast
        enc.to(torch.bfloat16)
        inner = scorer._encoder

        def encoder_bf16(audio_signal, length):
            return inner(audio_signal=audio_signal.to(torch.bfloat16), length=length)

        scorer._encoder, scorer._autocast = encoder_bf16, contextlib.nullcontext
        try:
            yield
        finally:
            enc.to(dtype)
            scorer._encoder, scorer._autocast = inner, autocast
    else:
        raise ValueError(name)


def kernel_rows(scorer, audios, device: str, top: int = 30) -> dict:
    from torch.profiler import ProfilerActivity, profile

    batch = audios[: scorer.batch_size]
    scorer.encode_batch(batch)
    _sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        scorer.encode_batch(batch)
        _sync(device)
    kernels = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            t = getattr(e, "device_time", 0.0) or 0.0
            k = kernels.setdefault(e.name[:90], [0.0, 0])
            k[0] += t
            k[1] += 1
    total = sum(v[0] for v in kernels.values())
    rows = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "row": "kernels",
        "batch": len(batch),
        "gpu_ms_per_batch": total / 1000,
        "top": [
            {"name": n, "ms": round(v[0] / 1000, 3), "share": round(v[0] / total, 4), "calls": v[1]}
            for n, v in rows
        ],
    }


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="real")
    ap.add_argument("--clips", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--other-batches", default="64,256")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    from bestofn.fakes import parakeet

    rows = []
    emit = functools.partial(_emit, rows)  # print a row and keep it
    emit({"row": "environment", "argv": sys.argv, "torch": torch.__version__, "size": args.size})
    scorer = parakeet.build(args.device, args.size, batch_size=args.batch)
    audios = clips(args.clips, args.seconds)
    base_s, base = timed(scorer, audios, args.device, args.repeats)
    emit({"row": "variant", "variant": "base", "s_per_clip": base_s, "batch": args.batch})
    if args.device.startswith("cuda"):
        emit(kernel_rows(scorer, audios, args.device))
    for name in ("cudnn-benchmark", "sdpa", "bf16-weights"):
        try:
            with knob(scorer, name):
                s, out = timed(scorer, audios, args.device, args.repeats)
            emit({"row": "variant", "variant": name, "s_per_clip": s, "batch": args.batch,
                  "max_abs_diff": max_diff(out, base)})  # fmt: skip
        except Exception as e:  # a knob this NeMo does not take: say so, go on
            emit({"row": "variant", "variant": name, "error": f"{type(e).__name__}: {e}"})
    for b in [int(x) for x in args.other_batches.split(",") if x]:
        scorer.set_speed(batch_size=b)
        s, out = timed(scorer, audios, args.device, args.repeats)
        emit({"row": "variant", "variant": f"batch-{b}", "s_per_clip": s, "batch": b,
              "max_abs_diff": max_diff(out, base)})  # fmt: skip
    scorer.set_speed(batch_size=args.batch)
    s, _ = timed(scorer, audios, args.device, args.repeats)
    emit({"row": "variant", "variant": "base-again", "s_per_clip": s, "batch": args.batch})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "parakeet_encoder_probe.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return rows


if __name__ == "__main__":
    main()
