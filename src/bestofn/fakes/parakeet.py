"""Parakeet-TDT with random weights: a complete NeMo ``EncDecRNNTBPEModel`` (FastConformer
encoder, LSTM prediction net, TDT joint) built from a config, with a SentencePiece tokenizer
trained on the spot, so ``save_to()``/``restore_from()`` work on it exactly as on the real .nemo.

On disk (``write``): ``parakeet-tdt-0.6b-v3/parakeet-tdt-0.6b-v3.nemo``, the archive NeMo writes.
Random weights transcribe nothing right: WER is near 1 whatever the audio.

Next to it, ``parakeet-tdt-0.6b-v3-CALIBRATED/``: the same random model with its joint's output
biases set so that NeMo's own greedy TDT decoding emits about ``TARGET_TOKENS_PER_S`` tokens per
second of audio, as real speech does (plain random weights emit near ``max_symbols`` tokens per
frame, and time a loop the real model never runs). A CALIBRATION for speed figures, not a model:
its note file (``CALIBRATION.md``) and ``calibration.json`` say what was set and what it emits.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from bestofn.backends.parakeet import SAMPLE_RATE, ParakeetScorer
from bestofn.fakes import check_size

# `bestofn fake-weights` writes this backend's published checkpoint with ``write`` below
# (bestofn.fakes.weights finds this line)
FAKE_WEIGHTS = "parakeet"
TDT_DURATIONS = [0, 1, 2, 3, 4]

# Parakeet-TDT-0.6b-v3: FastConformer XL (24 layers, d_model 1024, 8x dw-striding
# subsampling, 128 mels), 2-layer LSTM prediction net (640), joint 640, 8192 BPE tokens,
# TDT durations 0..4. Sources in .ref/notes/sidon-parakeet-facts.md.
REAL_SIZE = dict(
    features=128,
    d_model=1024,
    n_layers=24,
    n_heads=8,
    ff_expansion=4,
    sub_channels=256,
    conv_kernel=9,
    pred_hidden=640,
    pred_layers=2,
    joint_hidden=640,
    vocab_size=8192,
)
TINY_SIZE = dict(
    features=16,
    d_model=32,
    n_layers=1,
    n_heads=2,
    ff_expansion=2,
    sub_channels=16,
    conv_kernel=9,
    pred_hidden=32,
    pred_layers=1,
    joint_hidden=32,
    vocab_size=32,
)


def train_tokenizer(directory: Path, vocab_size: int, seed: int = 0) -> Path:
    """Train a BPE SentencePiece tokenizer in ``directory`` the way NeMo lays one out
    (tokenizer.model + vocab.txt). The corpus is random words over a-z, big enough to reach
    ``vocab_size`` pieces."""
    import sentencepiece as spm

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    n_words = max(2000, vocab_size * 6)
    words = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(n_words)]
    lines = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
    (directory / "corpus.txt").write_text("\n".join(lines) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(directory / "corpus.txt"),
        model_prefix=str(directory / "tokenizer"),
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        bos_id=-1,
        eos_id=-1,
        minloglevel=2,
        num_threads=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(directory / "tokenizer.model"))
    vocab = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return directory


def tdt_config(tokenizer_dir: Path, size: dict) -> dict:
    """A FastConformer-TDT model config (the layout of NeMo's fastconformer_tdt_bpe.yaml)."""
    s = size
    return {
        "sample_rate": SAMPLE_RATE,
        "labels": [],
        "model_defaults": {
            "enc_hidden": s["d_model"],
            "pred_hidden": s["pred_hidden"],
            "joint_hidden": s["joint_hidden"],
            "tdt_durations": TDT_DURATIONS,
            "num_tdt_durations": len(TDT_DURATIONS),
        },
        "tokenizer": {"dir": str(tokenizer_dir), "type": "bpe"},
        "preprocessor": {
            "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
            "sample_rate": SAMPLE_RATE,
            "normalize": "per_feature",
            "window_size": 0.025,
            "window_stride": 0.01,
            "window": "hann",
            "features": s["features"],
            "n_fft": 512,
            "log": True,
            "frame_splicing": 1,
            "dither": 1e-5,
            "pad_to": 0,
            "pad_value": 0.0,
        },
        "encoder": {
            "_target_": "nemo.collections.asr.modules.ConformerEncoder",
            "feat_in": s["features"],
            "feat_out": -1,
            "n_layers": s["n_layers"],
            "d_model": s["d_model"],
            "subsampling": "dw_striding",
            "subsampling_factor": 8,
            "subsampling_conv_channels": s["sub_channels"],
            "causal_downsampling": False,
            "ff_expansion_factor": s["ff_expansion"],
            "self_attention_model": "rel_pos",
            "n_heads": s["n_heads"],
            "att_context_size": [-1, -1],
            "xscaling": True,
            "untie_biases": True,
            "pos_emb_max_len": 5000,
            "conv_kernel_size": s["conv_kernel"],
            "conv_norm_type": "batch_norm",
            "dropout": 0.0,
            "dropout_pre_encoder": 0.0,
            "dropout_emb": 0.0,
            "dropout_att": 0.0,
        },
        "decoder": {
            "_target_": "nemo.collections.asr.modules.RNNTDecoder",
            "normalization_mode": None,
            "random_state_sampling": False,
            "blank_as_pad": True,
            "prednet": {
                "pred_hidden": s["pred_hidden"],
                "pred_rnn_layers": s["pred_layers"],
                "dropout": 0.0,
            },
        },
        "joint": {
            "_target_": "nemo.collections.asr.modules.RNNTJoint",
            "log_softmax": None,
            "preserve_memory": False,
            "fuse_loss_wer": False,
            "num_extra_outputs": len(TDT_DURATIONS),
            "jointnet": {"joint_hidden": s["joint_hidden"], "activation": "relu", "dropout": 0.0},
        },
        "decoding": {
            "strategy": "greedy_batch",
            "model_type": "tdt",
            "durations": TDT_DURATIONS,
            "greedy": {"max_symbols": 10},
        },
        "loss": {
            "loss_name": "tdt",
            "tdt_kwargs": {
                "fastemit_lambda": 0.0,
                "clamp": -1.0,
                "durations": TDT_DURATIONS,
                "sigma": 0.02,
                "omega": 0.1,
            },
        },
    }


def build_tdt_model(workdir: Path, size: dict = TINY_SIZE, seed: int = 0):
    """An EncDecRNNTBPEModel (TDT) with random weights, built offline from a config."""
    import torch
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from omegaconf import OmegaConf

    tok = train_tokenizer(Path(workdir) / "tokenizer", size["vocab_size"], seed=seed)
    torch.manual_seed(seed)
    return EncDecRNNTBPEModel(cfg=OmegaConf.create(tdt_config(tok, size))).eval()


SIZE = {"tiny": TINY_SIZE, "real": REAL_SIZE}


def build(
    device: str, size: str = "real", workdir: str | None = None, calibrated: bool = False, **kw
):
    """A ParakeetScorer with random weights in memory: the real v3 size (~0.6B parameters), or
    a tiny one. Random weights emit more tokens per frame than the real model, so greedy
    decoding here is a pessimistic bound on the decoder's share of the time; ``calibrated``:
    the joint calibrated to speech's token rate first (``calibrate``, on the CPU)."""
    check_size(size)
    workdir = workdir or tempfile.mkdtemp(prefix=f"parakeet-{size}-")
    os.makedirs(workdir, exist_ok=True)
    model = build_tdt_model(Path(workdir), SIZE[size])
    if calibrated:
        calibrate(model)
    return ParakeetScorer.from_modules(model, device=device, **kw)


def write(out_dir, size: str = "tiny", seed: int = 0) -> dict:
    """``out_dir/parakeet-tdt-0.6b-v3/parakeet-tdt-0.6b-v3.nemo`` and, from the same model,
    ``out_dir/parakeet-tdt-0.6b-v3-CALIBRATED/`` (``write_calibrated``). Returns the scorer
    options (``model_path``) and ``calibrated_model_path``."""
    check_size(size)
    out = Path(out_dir) / "parakeet-tdt-0.6b-v3"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "parakeet-tdt-0.6b-v3.nemo"
    with tempfile.TemporaryDirectory(prefix="parakeet-tokenizer-") as tmp:
        model = build_tdt_model(Path(tmp), SIZE[size], seed=seed)
        model.save_to(str(path))
        calibrated = write_calibrated(Path(out_dir), model, size, seed)
    return {"model_path": str(path.resolve()), "calibrated_model_path": str(calibrated)}


# ---- the calibrated fake ------------------------------------------------------------------------
#
# Target: tokens per second of audio that Parakeet-TDT-0.6b-v3 emits on read English speech.
# - Audiobook narration runs at about 150 words per minute, 2.5 words/s: "150-160 WPM is the
#   target speed for audio books" (LibriVox forum, forum.librivox.org/viewtopic.php?t=87551;
#   LibriSpeech, Parakeet's English test set, is read LibriVox audiobooks).
# - A 32k-100k BPE vocabulary splits English into about 1.3 tokens per word
#   (ai.towerofrecords.com/ai/tokenization: "1,000 English words ~ 1,300 tokens"). v3's
#   SentencePiece vocabulary is 8,192 pieces shared by 25 languages, so it splits finer, and v3
#   also emits punctuation and casing: we take 1.6 tokens per word (an estimate, not measured:
#   no real checkpoint or tokenizer is available here).
# - 2.5 words/s x 1.6 tokens/word = 4.0 tokens/s (60 tokens per 15-s clip; the earlier profile's
#   declared range, docs/bench/parakeet_profile.py, was 40-70).
TARGET_TOKENS_PER_S = 4.0
# Every decoding step advances this many encoder frames (80 ms each): the duration head's
# weights are zeroed and its bias picks this duration. 2 frames gives 6.25 joint steps per second
# of audio, 4.0 of them emitting; the real model's steps (its tokens plus the blank jumps between
# them, up to 4 frames each) are of that order. A duration >= 1 on every step also rules out the
# random joint's loop of up to max_symbols tokens on one frame.
CALIBRATED_DURATION_FRAMES = 2
ENCODER_FRAME_S = 0.08  # FastConformer, 8x subsampling of 10-ms mel frames
CALIBRATED_DIR = "parakeet-tdt-0.6b-v3-CALIBRATED"
CALIBRATION_TOLERANCE = 0.03  # bisection stops within 3 % of the target on the calibration clips
# On other audio the rate moves (the random encoder's output depends on it): the tests hold the
# tiny calibrated fake to this band on held-out synthetic audio, the GPU bench prints its own.
CALIBRATION_BAND = (0.7, 1.3)


def synthetic_clips(seed: int = 0, seconds=(4.0, 9.0, 15.0)) -> list[np.ndarray]:
    """16 kHz clips of three kinds for each duration: white noise, a voiced-speech-like harmonic
    tone with a syllable envelope, and noise under that envelope."""
    rng = np.random.default_rng(seed)
    out = []
    for k, sec in enumerate(seconds):
        t = np.arange(int(sec * SAMPLE_RATE)) / SAMPLE_RATE
        f0 = 110 + 40 * rng.random() + 20 * np.sin(2 * np.pi * 0.4 * t)
        phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
        voiced = sum(np.sin(h * phase) / h for h in range(1, 8))
        envelope = np.clip(np.sin(2 * np.pi * (2.5 + rng.random()) * t + k), 0, None)
        noise = rng.standard_normal(len(t))
        for clip in (0.1 * noise, 0.2 * voiced * envelope, 0.2 * noise * envelope):
            out.append(clip.astype(np.float32))
    return out


def _output_layer(model):
    return model.joint.joint_net[-1]  # Linear(joint_hidden, vocab + blank + durations)


def emitted_tokens_per_s(scorer: ParakeetScorer, encoded, encoded_lens) -> tuple[float, list]:
    """Tokens per second of audio that the scorer's NeMo decoding emits on this encoder output
    (hypothesis token ids, blanks excluded), and the tokens per clip."""
    import torch

    with torch.inference_mode(), scorer._autocast():
        hyps = scorer.model.decoding.rnnt_decoder_predictions_tensor(
            encoder_output=encoded, encoded_lengths=encoded_lens, return_hypotheses=True
        )
    if isinstance(hyps, tuple):
        hyps = hyps[0]
    per_clip = [len(h.y_sequence) for h in hyps]
    seconds = float(encoded_lens.sum()) * ENCODER_FRAME_S
    return sum(per_clip) / max(seconds, 1e-9), per_clip


def calibrate(model, target: float = TARGET_TOKENS_PER_S, clips=None, device: str = "cpu"):
    """Set the joint's output biases of ``model`` (in place) so that greedy TDT decoding emits
    ``target`` tokens per second of ``clips`` (default ``synthetic_clips()``):

    - duration head: weights zeroed, bias +1 for ``CALIBRATED_DURATION_FRAMES``, -1 elsewhere
      (every step advances that many frames);
    - blank: its bias raised by a constant found by bisection (the emitted rate falls as it
      rises), until the rate is within ``CALIBRATION_TOLERANCE`` of the target.

    Every other weight stays random. Returns the calibration record (``calibration.json``)."""
    import torch

    clips = synthetic_clips() if clips is None else clips
    scorer = ParakeetScorer.from_modules(model, device=device, batch_size=len(clips))
    layer = _output_layer(model)
    vocab = model.tokenizer.vocab_size
    blank, first_duration = vocab, vocab + 1
    durations = list(model.cfg.model_defaults.tdt_durations)
    with torch.no_grad():
        layer.weight[first_duration:] = 0.0
        layer.bias[first_duration:] = -1.0
        layer.bias[first_duration + durations.index(CALIBRATED_DURATION_FRAMES)] = 1.0
    encoded, lens = scorer.encode_batch(clips)
    base = float(layer.bias[blank])
    trace = []

    def rate_at(offset: float) -> float:
        with torch.no_grad():
            layer.bias[blank] = base + offset
        rate, _ = emitted_tokens_per_s(scorer, encoded, lens)
        trace.append((round(offset, 6), round(rate, 4)))
        return rate

    # bracket: lo emits more than the target, hi less
    lo, hi, step = 0.0, 0.0, 0.25
    while rate_at(lo) < target:
        lo -= step
        step *= 2
        if step > 1e4:
            raise RuntimeError(f"parakeet calibration: no blank bias emits {target} tokens/s")
    step = 0.25
    while rate_at(hi) > target:
        hi += step
        step *= 2
        if step > 1e4:
            raise RuntimeError(f"parakeet calibration: no blank bias emits {target} tokens/s")
    best = min(trace, key=lambda t: abs(t[1] - target))
    for _ in range(40):
        if abs(best[1] - target) <= CALIBRATION_TOLERANCE * target:
            break
        mid = (lo + hi) / 2
        rate = rate_at(mid)
        lo, hi = (mid, hi) if rate > target else (lo, mid)
        best = min(trace, key=lambda t: abs(t[1] - target))
    rate = rate_at(best[0])
    _, per_clip = emitted_tokens_per_s(scorer, encoded, lens)
    return {
        "what": "a calibration of random weights, not a model",
        "target_tokens_per_s": target,
        "emitted_tokens_per_s": round(rate, 4),
        "tokens_per_clip": per_clip,
        "clip_seconds": [round(len(c) / SAMPLE_RATE, 3) for c in clips],
        "blank_bias_offset": best[0],
        "duration_frames_every_step": CALIBRATED_DURATION_FRAMES,
        "joint_steps_per_s": round(1 / (ENCODER_FRAME_S * CALIBRATED_DURATION_FRAMES), 4),
        "calibration_audio": "bestofn.fakes.parakeet.synthetic_clips(seed=0)",
        "decoding": "NeMo greedy_batch (label-looping TDT), as ParakeetScorer runs it",
        "bisection_trace": trace,
    }


CALIBRATION_NOTE = """# CALIBRATION, not a model (`bestofn fake-weights`, size {size}, seed {seed})

`parakeet-tdt-0.6b-v3.nemo` here is the random-weight Parakeet-TDT of `../parakeet-tdt-0.6b-v3/`
(same seed, same weights) with two changes to the joint's output layer, so that NeMo's own greedy
TDT decoding, unchanged, emits about {target} tokens per second of audio, as real read speech
does (the plain random joint emits up to `max_symbols` tokens per frame):

- the duration head's weights are zero and its bias picks {duration} frames: every decoding step
  advances {duration} encoder frames ({steps} joint steps per second of audio);
- the blank's bias is raised by {offset}, found by bisection on synthetic clips
  (`bestofn.fakes.parakeet.synthetic_clips`): they emit {rate} tokens/s.

Source of the target: about 150 words per minute for audiobook narration (LibriVox), times an
estimated 1.6 SentencePiece tokens per word for v3's 8,192-piece vocabulary (about 1.3 is usual
for 32k-100k BPE vocabularies); see `bestofn/fakes/parakeet.py`.

Use it for speed figures only (point `scorers: parakeet: model_path` here, or write the config
with `bestofn fake-weights --parakeet calibrated`). Its transcripts are random tokens; on other
audio its rate moves (the tests hold it within {band} of the target on held-out synthetic
clips). `calibration.json` has the numbers and the bisection trace.
"""


def write_calibrated(out_dir: Path, model, size: str, seed: int) -> Path:
    """Calibrate ``model`` in place (``calibrate``) and write it with its note to
    ``out_dir/parakeet-tdt-0.6b-v3-CALIBRATED/``; returns the .nemo path. The decoding config
    is saved as it was (the scorer sets its own when it loads the file)."""
    import copy

    from omegaconf import open_dict

    out = Path(out_dir) / CALIBRATED_DIR
    out.mkdir(parents=True, exist_ok=True)
    published = copy.deepcopy(model.cfg.decoding)
    record = calibrate(model)
    with open_dict(model.cfg):
        model.cfg.decoding = published
    path = out / "parakeet-tdt-0.6b-v3.nemo"
    model.save_to(str(path))
    record.update(size=size, seed=seed)
    (out / "calibration.json").write_text(json.dumps(record, indent=1) + "\n")
    lo, hi = CALIBRATION_BAND
    (out / "CALIBRATION.md").write_text(
        CALIBRATION_NOTE.format(
            size=size,
            seed=seed,
            target=record["target_tokens_per_s"],
            duration=CALIBRATED_DURATION_FRAMES,
            steps=record["joint_steps_per_s"],
            offset=f"{record['blank_bias_offset']:+.4f}",
            rate=record["emitted_tokens_per_s"],
            band=f"{lo:g}-{hi:g}x",
        )
    )
    return path.resolve()
