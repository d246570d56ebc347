"""Parakeet's GPU time split into the encoder and the decoder, at random weights and
at a declared speech-rate emission. Random weights at the real size (``bestofn.fakes.parakeet``),
one model and one set of clips for every row, 15-s clips (14.5-15 s, noise), batch 128.

Why: with random weights the TDT joint emits close to ``max_symbols`` (10) tokens per encoder
frame (thousands of characters per 15-s clip), so NeMo's label-looping greedy decoder loops far
more than it does on speech with the real weights (~40-70 BPE tokens per 15 s). A
random-weight ``transcribe`` figure mostly times that pathological loop. Here:

- ``encoder``: preprocessor + encoder only, as ``ParakeetScorer.transcribe_batch`` runs them
  (same duration sort and batches, padding, bf16 autocast on CUDA, output cast to the joint's
  weight dtype), no decoding.
- ``transcribe`` / ``random weights``: the scorer's ``transcribe`` as it is; mean emitted
  tokens (hypothesis token ids below the blank id) and characters per clip.
- ``decoder`` / ``random weights``: NeMo's decoding call alone, as the scorer makes it
  (``rnnt_decoder_predictions_tensor`` under the same autocast), on the encoder output computed
  beforehand; ``label_loop_s_per_clip`` is the greedy label-looping call alone (without turning
  tokens into text). encoder + decoder should come close to transcribe (``sum`` row).
- ``bisection``: the blank logit's bias in the joint's output layer is raised by a constant,
  found by bisection so that the mean tokens per clip on these clips lands in the declared range
  (default 40-70 per 15 s, target 55; scaled with ``--seconds``). Trace of (offset, tokens).
- ``transcribe`` / ``decoder`` at ``speech-rate emission (declared)``: the same model with that
  bias. This is a declared benchmark workload, not a real model: only the blank's bias changes,
  the TDT duration head stays random (how far a blank jumps is whatever its argmax says), so
  the loop's iteration count is only roughly that of real weights. The bias is restored after
  (``bias_restored`` in the ``sum`` row).
- ``--compile``: the encoder again through the scorer's ``set_speed(compile=True)``
  (torch.compile, dynamic=True), and ``transcribe`` with it at the speech-rate emission. A first
  compile of this encoder took minutes before: the warm-up call pays it; off by default.

Every time is the median of 3 calls (``--repeats``) after a warm-up call, with
``torch.cuda.synchronize`` around each, in seconds per clip. Rows are JSON lines, printed and
written to ``OUT/parakeet_profile.json``.

    PYTHONPATH=src python3 -m lab.probes.parakeet_profile --out OUT [--clips 256]
        [--batch 128]
        [--seconds 15] [--tokens-range 40 70] [--tokens-target 55] [--repeats 3] [--compile]
    # CPU smoke test of this script on the tiny fake (2-s clips, a few of them):
    PYTHONPATH=src python3 -m lab.probes.parakeet_profile --device cpu --size tiny --out OUT
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

SR16 = 16000
SPEECH_TOKENS_PER_15S = (40.0, 70.0, 55.0)  # declared: low, high, target BPE tokens per 15 s


def clips(n: int, seconds: float, seed: int = 1) -> list[np.ndarray]:
    """Noise clips of ``seconds - 0.5`` to ``seconds - 1/16`` s (14.5-15 s for 15), as the
    other stage benches use."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(SR16 * (seconds - 0.5 + (i % 8) / 16))
        out.append((0.1 * rng.standard_normal(length)).astype(np.float32))
    return out


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device: str, repeats: int = 3) -> tuple[float, object]:
    """Median seconds of ``repeats`` calls after one warm-up call (graphs, plans, compiles)."""
    fn()
    times, result = [], None
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        result = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


# --- the blank logit's bias: a benchmark knob of the fake model, never used by the scorer ---


def blank_index(model) -> int:
    """Where the blank logit sits in the TDT joint's output: NeMo's RNNTJoint outputs
    ``vocab + 1 (blank) + num_extra_outputs (TDT durations)``; the greedy TDT decoder takes
    labels from ``logits[:, :-num_durations]`` and ``blank_id == vocab size``."""
    out = model.joint.joint_net[-1]
    blank = int(model.decoding.blank_id)
    extra = int(model.joint.num_extra_outputs)
    if out.out_features != blank + 1 + extra:
        raise RuntimeError(
            f"parakeet_profile: joint output has {out.out_features} logits, expected "
            f"vocab {blank} + blank + {extra} durations; not the TDT layout this script knows"
        )
    return blank


def set_blank_bias(model, value: float) -> float:
    """Set the joint output layer's bias for the blank logit to ``value``; returns the old value.
    In place, so NeMo's captured CUDA graphs see it. A benchmark workload knob only."""
    bias = model.joint.joint_net[-1].bias
    i = blank_index(model)
    with torch.no_grad():
        old = float(bias[i])
        bias[i] = value
    return old


@contextlib.contextmanager
def blank_bias_raised(model, offset: float):
    """The blank logit's bias raised by ``offset`` inside the block, restored exactly after."""
    bias = model.joint.joint_net[-1].bias
    i = blank_index(model)
    original = bias[i].detach().clone()
    set_blank_bias(model, float(original) + offset)
    try:
        yield float(original)
    finally:
        with torch.no_grad():
            bias[i] = original


# --- the scorer's path, cut in two --------------------------------------------------------------


def encode_all(scorer, audios: list[np.ndarray]) -> list[tuple[list[int], object, object]]:
    """Preprocessor + encoder for every batch, as ``transcribe`` batches them (short takes
    padded, sorted by duration) through the scorer's own ``encode_batch`` (bf16 autocast on
    CUDA, the output cast to the joint's weight dtype); returns (indices, encoded,
    encoded_lens) per batch.
    tests/lab/test_parakeet_profile.py checks that decoding these gives transcribe's transcripts."""
    audios = [scorer._pad_short(a) for a in audios]
    order = sorted(range(len(audios)), key=lambda i: len(audios[i]))
    out = []
    for start in range(0, len(order), scorer.batch_size):
        idx = order[start : start + scorer.batch_size]
        out.append((idx, *scorer.encode_batch([audios[i] for i in idx])))
    return out


def decode_all(scorer, encoded_batches, loop_only: bool = False) -> list:
    """NeMo's decoding of precomputed encoder output, as ``transcribe_batch`` calls it; per clip
    in input order, the hypothesis. ``loop_only``: the greedy label-looping call alone (token
    ids, no text)."""
    n = sum(len(idx) for idx, _, _ in encoded_batches)
    out: list = [None] * n
    for idx, encoded, encoded_lens in encoded_batches:
        with torch.inference_mode(), scorer._autocast():
            if loop_only:
                hyps = scorer.model.decoding.decoding(
                    encoder_output=encoded, encoded_lengths=encoded_lens
                )[0]
            else:
                hyps = scorer.model.decoding.rnnt_decoder_predictions_tensor(
                    encoder_output=encoded, encoded_lengths=encoded_lens, return_hypotheses=False
                )
        if isinstance(hyps, tuple):  # NeMo < 2.x: (best, all)
            hyps = hyps[0]
        for i, h in zip(idx, hyps, strict=True):
            out[i] = h
    return out


def n_tokens(hyp, blank: int) -> int:
    """Emitted tokens of a hypothesis: its token ids below the blank id (what NeMo detokenizes)."""
    seq = hyp.y_sequence
    seq = seq.tolist() if hasattr(seq, "tolist") else list(seq)
    return sum(1 for t in seq if t < blank)


def mean_tokens(hyps, blank: int) -> float:
    return statistics.mean(n_tokens(h, blank) for h in hyps)


def bisect_blank_offset(
    count, low: float, high: float, target: float, max_evals: int = 40
) -> tuple[float, float, list]:
    """The blank-bias offset whose mean tokens per clip (``count(offset)``, falling as the offset
    rises) lands in [low, high], as near ``target`` as the bisection gets. Returns (offset,
    tokens, trace of (offset, tokens)); raises when no offset tried lands in the range."""
    trace: list[tuple[float, float]] = []

    def ev(offset: float) -> float:
        tokens = count(offset)
        trace.append((round(offset, 6), round(tokens, 3)))
        return tokens

    lo, t_lo = 0.0, ev(0.0)
    if t_lo <= target:
        raise RuntimeError(
            f"parakeet_profile: without a blank offset the model already emits {t_lo:.1f} "
            f"tokens per clip, not above the target {target}"
        )
    hi = 1.0
    while ev(hi) > target:  # bracket: the offset that brings the count below the target
        lo, hi = hi, hi * 2
        if hi > 1e4 or len(trace) >= max_evals:
            raise RuntimeError(f"parakeet_profile: no blank offset up to {hi} reaches {target}")
    tolerance = (high - low) / 6
    while len(trace) < max_evals:
        mid = (lo + hi) / 2
        tokens = ev(mid)
        if low <= tokens <= high and abs(tokens - target) <= tolerance:
            break
        if tokens > target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-5:
            break
    inside = [(o, t) for o, t in trace if low <= t <= high]
    if not inside:
        raise RuntimeError(
            f"parakeet_profile: no blank offset gave {low}-{high} tokens per clip: {trace}"
        )
    offset, tokens = min(inside, key=lambda ot: abs(ot[1] - target))
    return offset, tokens, trace


# --- the profile --------------------------------------------------------------------------------


def _emit(rows: list[dict], row: dict) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


def profile(
    scorer, audios, tokens_range, tokens_target, compile_encoder=False, repeats=3
) -> list[dict]:
    """The rows above for one scorer and one set of clips (16 kHz); the bias is restored."""
    device, n, model = scorer.device, len(audios), scorer.model

    def timed(fn):
        return _timed(fn, device, repeats)

    blank = blank_index(model)
    base = {"batch": scorer.batch_size, "clips": n, "dtype": scorer.dtype}
    rows: list[dict] = []
    original_bias = model.joint.joint_net[-1].bias[blank].detach().clone()

    enc_s, encoded = timed(lambda: encode_all(scorer, audios))
    _emit(rows, {"row": "encoder", "variant": "preprocessor + encoder (eager)",
                 "s_per_clip": enc_s / n, **base})  # fmt: skip

    def emission_rows(label: str, offset: float) -> dict:
        tr_s, texts = timed(lambda: scorer.transcribe(audios, SR16))
        dec_s, hyps = timed(lambda: decode_all(scorer, encoded))
        loop_s, _ = timed(lambda: decode_all(scorer, encoded, loop_only=True))
        tokens = mean_tokens(hyps, blank)
        same = sum(h.text.strip() == t for h, t in zip(hyps, texts, strict=True)) / n
        common = {"emission": label, "blank_offset": offset,
                  "blank_bias": float(model.joint.joint_net[-1].bias[blank])}  # fmt: skip
        _emit(rows, {"row": "transcribe", **common, "s_per_clip": tr_s / n,
                     "tokens_per_clip": tokens,
                     "chars_per_clip": statistics.mean(len(t) for t in texts), **base})  # fmt: skip
        _emit(rows, {"row": "decoder", **common, "s_per_clip": dec_s / n,
                     "label_loop_s_per_clip": loop_s / n, "tokens_per_clip": tokens,
                     "same_text_as_transcribe": same, **base})  # fmt: skip
        return {"transcribe": tr_s / n, "decoder": dec_s / n, "same": same}

    random_fig = emission_rows("random weights", 0.0)

    def count(offset: float) -> float:
        with blank_bias_raised(model, offset):
            return mean_tokens(decode_all(scorer, encoded, loop_only=True), blank)

    low, high = tokens_range
    offset, tokens, trace = bisect_blank_offset(count, low, high, tokens_target)
    _emit(rows, {"row": "bisection", "tokens_range": [low, high], "tokens_target": tokens_target,
                 "blank_offset": offset, "tokens_per_clip": tokens,
                 "original_blank_bias": float(original_bias), "trace": trace})  # fmt: skip
    with blank_bias_raised(model, offset):
        speech_fig = emission_rows("speech-rate emission (declared)", offset)
        if compile_encoder:
            scorer.set_speed(compile=True)
            try:
                c_s, c_encoded = timed(lambda: encode_all(scorer, audios))
                diff = max(
                    float((a[1].float() - b[1].float()).abs().max())
                    for a, b in zip(c_encoded, encoded, strict=True)
                )
                _emit(rows, {"row": "encoder", "variant": "preprocessor + encoder (compiled)",
                             "s_per_clip": c_s / n, "max_abs_diff_vs_eager": diff,
                             **base})  # fmt: skip
                c_tr, _ = timed(lambda: scorer.transcribe(audios, SR16))
                _emit(rows, {"row": "transcribe", "variant": "compiled encoder",
                             "emission": "speech-rate emission (declared)", "blank_offset": offset,
                             "s_per_clip": c_tr / n, **base})  # fmt: skip
            finally:
                scorer.set_speed(compile=False)
    restored = bool(torch.equal(model.joint.joint_net[-1].bias[blank], original_bias))
    _emit(rows, {"row": "sum", "bias_restored": restored,
                 "random: encoder + decoder": (enc_s / n) + random_fig["decoder"],
                 "random: transcribe": random_fig["transcribe"],
                 "speech-rate: encoder + decoder": (enc_s / n) + speech_fig["decoder"],
                 "speech-rate: transcribe": speech_fig["transcribe"]})  # fmt: skip
    return rows


def _environment(args) -> dict:
    import nemo

    env = {"row": "environment", "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "argv": sys.argv, "python": platform.python_version(), "torch": torch.__version__,
           "nemo": nemo.__version__, "device": args.device, "size": args.size,
           "seconds": args.seconds}  # fmt: skip
    if args.device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    return env


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="real", choices=["real", "tiny"])
    ap.add_argument("--clips", type=int, default=None, help="default 256 (8 on cpu)")
    ap.add_argument("--batch", type=int, default=None, help="default 128 (4 on cpu)")
    ap.add_argument("--seconds", type=float, default=None, help="default 15 (2 on cpu)")
    range_help = "declared emission, tokens per clip; default 40 70 x seconds/15"
    ap.add_argument("--tokens-range", type=float, nargs=2, metavar=("LO", "HI"), help=range_help)
    ap.add_argument("--tokens-target", type=float, default=None, help="default 55 x seconds/15")
    ap.add_argument("--compile", action="store_true", help="also the compiled encoder (slow)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls after the warm-up")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    cpu = not args.device.startswith("cuda")
    if not cpu and not torch.cuda.is_available():
        ap.error("--device cuda but CUDA is not available (use --device cpu --size tiny)")
    args.clips = args.clips or (8 if cpu else 256)
    args.batch = args.batch or (4 if cpu else 128)
    args.seconds = args.seconds or (2.0 if cpu else 15.0)
    scale = args.seconds / 15.0
    low, high, target = (v * scale for v in SPEECH_TOKENS_PER_15S)
    tokens_range = tuple(args.tokens_range) if args.tokens_range else (low, high)
    if args.tokens_target is not None:
        target = args.tokens_target
    elif args.tokens_range:
        target = sum(tokens_range) / 2
    if not tokens_range[0] <= target <= tokens_range[1]:
        ap.error(f"--tokens-target {target} is outside --tokens-range {tokens_range}")

    from bestofn.fakes import parakeet

    rows: list[dict] = []
    _emit(rows, _environment(args))
    scorer = parakeet.build(args.device, args.size, batch_size=args.batch)
    audios = clips(args.clips, args.seconds)
    rows += profile(
        scorer, audios, tokens_range, target, compile_encoder=args.compile, repeats=args.repeats
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "parakeet_profile.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return rows


if __name__ == "__main__":
    main()
