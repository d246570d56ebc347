"""Parakeet-TDT with random weights: a complete NeMo ``EncDecRNNTBPEModel`` (FastConformer
encoder, LSTM prediction net, TDT joint) built from a config, with a SentencePiece tokenizer
trained on the spot, so ``save_to()``/``restore_from()`` work on it exactly as on the real .nemo.

On disk (``write``): ``parakeet-tdt-0.6b-v3/parakeet-tdt-0.6b-v3.nemo``, the archive NeMo writes.
Random weights transcribe nothing right: WER is near 1 whatever the audio.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from bestofn.backends.parakeet import SAMPLE_RATE
from bestofn.fakes import check_size

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


def build(device: str, size: str = "real", workdir: str | None = None, **kw):
    """A ParakeetScorer with random weights in memory: the real v3 size (~0.6B parameters), or
    a tiny one. Random weights emit more tokens per frame than the real model, so greedy
    decoding here is a pessimistic bound on the decoder's share of the time."""
    from bestofn.backends.parakeet import ParakeetScorer

    check_size(size)
    workdir = workdir or tempfile.mkdtemp(prefix=f"parakeet-{size}-")
    os.makedirs(workdir, exist_ok=True)
    model = build_tdt_model(Path(workdir), SIZE[size])
    return ParakeetScorer.from_modules(model, device=device, **kw)


def write(out_dir, size: str = "tiny", seed: int = 0) -> dict:
    """``out_dir/parakeet-tdt-0.6b-v3/parakeet-tdt-0.6b-v3.nemo``; returns the scorer options."""
    check_size(size)
    out = Path(out_dir) / "parakeet-tdt-0.6b-v3"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "parakeet-tdt-0.6b-v3.nemo"
    with tempfile.TemporaryDirectory(prefix="parakeet-tokenizer-") as tmp:
        build_tdt_model(Path(tmp), SIZE[size], seed=seed).save_to(str(path))
    return {"model_path": str(path.resolve())}
