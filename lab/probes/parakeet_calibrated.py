"""The whole ASR with the calibrated Parakeet fake, both NeMo decoders, and the
scorers' resampler (torch on the device against soxr on the host). Called by
docs/bench/parakeet_calibrated_gpu.sh; every row is the product's code:

- ``bestofn.fakes.parakeet.write`` writes the plain random .nemo and its CALIBRATION (the joint
  calibrated to ``TARGET_TOKENS_PER_S``, on the CPU); each scorer is built from the file through
  the registry, as the worker builds it from config (``model_path``, ``batch_size``,
  ``decoding``).
- ``asr``: ``ParakeetScorer.transcribe`` of ``--clips`` 16-kHz noise clips (``--seconds`` - 0.5
  to ``--seconds`` long) in batches of ``--batch``: preprocessor, encoder, NeMo's greedy TDT
  decoding, text. Median of ``--repeats`` calls after a warm-up call (graph captures), with a
  device sync around each; s/clip. ``tokens_per_s``: what the decoder emitted on these clips.
  Rows: calibrated x (cuda_graphs_host_loop, the CUDA default; cuda_graphs; label_looping),
  and the plain random fake x cuda_graphs_host_loop (the random fake's artefact figure, for
  reference). ``encoder``: preprocessor + encoder alone.
- ``resample``: ``bestofn.backends.scorer_input.scorer_input`` of the same number of 48-kHz stereo
takes
  to 16 kHz, soxr (host, 8 threads) and torch (the device), as the pipeline's score stage
  calls it; ``snr_db``: torch against soxr on these takes (white noise: the transition band
  above 0.8 of 8 kHz, where the two filters differ, is included; tones:
  tests/backends/test_audio_gpu.py).

    PYTHONPATH=src python3 -m lab.probes.parakeet_calibrated --out OUT [--size real]
        [--device cuda] [--clips 64] [--batch 64] [--seconds 15] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

GOAL_S_PER_CLIP = 0.003  # the goal: whole ASR with the calibrated fake, one H200


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device, repeats):
    fn()  # warm-up: graph captures, plans
    times, out = [], None
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def noise_clips(n, seconds, sr, seed=1, channels=1):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(sr * (seconds - 0.5 + (i % 8) / 16))
        shape = (length,) if channels == 1 else (length, channels)
        out.append((0.1 * rng.standard_normal(shape)).astype(np.float32))
    return out


def emit(rows, row):
    print(json.dumps(row), flush=True)
    rows.append(row)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--size", choices=["tiny", "real"], default="real")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--clips", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--rows", default="asr,resample", help="which parts: asr (the fakes' ASR), resample"
    )
    a = p.parse_args(argv)
    parts = set(a.rows.split(","))
    if not parts or parts - {"asr", "resample"}:
        p.error(f"--rows {a.rows!r}: give asr, resample or both")

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    dev = a.device
    head = {
        "row": "setup", "device": dev, "size": a.size, "clips": a.clips, "batch": a.batch,
        "seconds": a.seconds, "repeats": a.repeats, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if dev.startswith("cuda") else platform.processor(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
    }  # fmt: skip
    emit(rows, head)

    clips16 = noise_clips(a.clips, a.seconds, 16000)
    with tempfile.TemporaryDirectory(prefix="parakeet-calibrated-") as tmp:
        if "asr" in parts:
            asr_rows(a, tmp, clips16, rows)
    if "resample" in parts:
        resample_rows(a, rows)
    (out / "parakeet_calibrated.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {out / 'parakeet_calibrated.json'}")
    return 0


def asr_rows(a, tmp: str, clips16: list, rows: list) -> None:
    """The calibration, then the ASR of the calibrated and plain fakes, NeMo's decoders."""
    from bestofn.backends.parakeet import CUDA_DEFAULT_DECODING
    from bestofn.backends.registry import build
    from bestofn.fakes import parakeet as fake

    dev = a.device
    t0 = time.perf_counter()
    paths = fake.write(tmp, a.size, seed=0)
    record = json.loads(Path(paths["calibrated_model_path"]).with_name("calibration.json")
                        .read_text())  # fmt: skip
    record.pop("bisection_trace", None)
    emit(rows, {"row": "calibration", "write_s": round(time.perf_counter() - t0, 1), **record})
    runs = [("calibrated", CUDA_DEFAULT_DECODING), ("calibrated", "cuda_graphs"),
            ("calibrated", "label_looping"), ("plain", CUDA_DEFAULT_DECODING)]  # fmt: skip
    for which, decoding in runs:
        path = paths["calibrated_model_path" if which == "calibrated" else "model_path"]
        opts = {"model_path": path, "batch_size": a.batch, "decoding": decoding,
                "hash_weights": False}  # fmt: skip
        scorer = build("scorer", "parakeet", opts, device=dev)
        seconds, _ = timed(lambda s=scorer: s.transcribe(clips16, 16000), dev, a.repeats)
        per_clip = []
        for start in range(0, len(clips16), a.batch):
            enc, lens = scorer.encode_batch(clips16[start : start + a.batch])
            per_clip += fake.emitted_tokens_per_s(scorer, enc, lens)[1]
        audio_s = sum(len(c) for c in clips16) / 16000
        row = {"row": "asr", "fake": which, "decoding": decoding,
               "s_per_clip": seconds / len(clips16),
               "tokens_per_s": round(sum(per_clip) / audio_s, 3),
               "tokens_per_clip_min_max": [min(per_clip), max(per_clip)],
               "provenance_decoding": scorer.provenance()["decoding"]}  # fmt: skip
        if which == "calibrated":
            row["goal_s_per_clip"] = GOAL_S_PER_CLIP
            row["meets_goal"] = row["s_per_clip"] <= GOAL_S_PER_CLIP
        emit(rows, row)
        if which == "calibrated" and decoding == CUDA_DEFAULT_DECODING:
            enc_s, _ = timed(
                lambda s=scorer: [s.encode_batch(clips16[i : i + a.batch])
                                  for i in range(0, len(clips16), a.batch)],
                dev, a.repeats,
            )  # fmt: skip
            emit(rows, {"row": "encoder", "fake": which, "s_per_clip": enc_s / len(clips16)})
        scorer.close()
        del scorer


def resample_rows(a, rows: list) -> None:
    """The scorers' resampler, soxr on the host against torch on the device, and their SNR."""
    from bestofn.backends.scorer_input import scorer_input

    dev = a.device
    takes48 = noise_clips(a.clips, a.seconds, 48000, seed=2, channels=2)
    got = {}
    for resampler in ("soxr", "torch"):
        seconds, got[resampler] = timed(
            lambda r=resampler: scorer_input(takes48, 48000, 16000, r, dev), dev, a.repeats
        )
        emit(rows, {"row": "resample", "resampler": resampler, "s_per_clip": seconds / a.clips})
    num = sum(float(np.sum(r.astype(np.float64) ** 2)) for r in got["soxr"])
    err = sum(float(np.sum((t.astype(np.float64) - r) ** 2))
              for t, r in zip(got["torch"], got["soxr"], strict=True))  # fmt: skip
    emit(rows, {"row": "resample", "resampler": "torch vs soxr",
                "snr_db": round(10 * np.log10(num / max(err, 1e-30)), 1)})  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
