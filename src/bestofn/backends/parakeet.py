"""Production ASR: NVIDIA Parakeet-TDT-0.6b-v3 through nemo_toolkit. Columns: transcript, wer, cer.

The model is read from a local ``.nemo`` file (``model_path``) or, offline, from the Hugging
Face cache (``model_name``); nothing is downloaded. Takes are transcribed in memory, in
batches: resample to 16 kHz mono, pad to the longest take, then preprocessor -> encoder ->
greedy TDT decoding called directly (no manifest, no temp files, no dataloader). On CUDA the
encoder and decoder run under bf16 autocast (the single biggest scoring win); the mel
preprocessor always runs in float32, as NeMo recommends. A device that cannot run an op of the
model in the asked dtype (a CPU without AVX512-BF16 has no bf16 LSTM under autocast) runs
float32 instead, with a warning (``bestofn.dtypes``).

v3 emits punctuation and casing, so WER/CER are computed after English normalisation
(``bestofn.textnorm``) of both the prompt text and the transcript.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import numpy as np

from bestofn.audio import resample, to_mono
from bestofn.backends.base import Scorer
from bestofn.dtypes import resolve_dtype
from bestofn.hashing import file_sha256
from bestofn.spec import GroupSpec
from bestofn.textnorm import asr_columns

log = logging.getLogger(__name__)

DEFAULT_MODEL = "nvidia/parakeet-tdt-0.6b-v3"
SAMPLE_RATE = 16000  # what the model's preprocessor expects
_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}
_DTYPES.update({"float32": "float32", "fp32": "float32"})
# What runs under autocast: FastConformer (conv2d subsampling, depthwise conv, attention,
# layer norm), the LSTM prediction net, the joint.
AUTOCAST_OPS = ("conv2d", "depthwise_conv1d", "conv1d", "linear", "layer_norm", "lstm", "embedding")


class ParakeetLoadError(RuntimeError):
    pass


def _sha256(path: Path, memo_dir: str | None = None) -> str:
    return file_sha256(path, Path(memo_dir) if memo_dir else None)


def resolve_nemo_file(
    model_path: str | None, model_name: str, hf_cache_dir: str | None = None
) -> Path:
    """The local ``.nemo`` file to restore: ``model_path`` if given, else ``model_name``
    looked up in the local Hugging Face cache (offline; a hub repo holds ``<name>.nemo``)."""
    if model_path:
        path = Path(model_path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"parakeet: model_path {path} does not exist or is not a file "
                "(config field: scorers.parakeet.model_path; expected a .nemo archive)"
            )
        return path
    from huggingface_hub import snapshot_download

    try:
        snap = Path(snapshot_download(model_name, cache_dir=hf_cache_dir, local_files_only=True))
    except Exception as e:  # LocalEntryNotFoundError, offline mode, bad repo id...
        raise FileNotFoundError(
            f"parakeet: model_name {model_name!r} is not in the local Hugging Face cache and "
            "nothing is downloaded at run time (config fields: scorers.parakeet.model_name / "
            f"model_path; set model_path to a local .nemo file): {e}"
        ) from None
    found = sorted(snap.glob("*.nemo"))
    if not found:
        raise FileNotFoundError(
            f"parakeet: cached snapshot {snap} of {model_name!r} holds no .nemo file "
            "(config field: scorers.parakeet.model_name)"
        )
    return found[0]


def load_nemo_asr(path: Path, device: str = "cpu"):
    """Restore a NeMo ASR model from a ``.nemo`` archive; a clear error when it is not one."""
    import torch
    from nemo.collections.asr.models import ASRModel

    try:
        model = ASRModel.restore_from(str(path), map_location=torch.device(device))
    except Exception as e:
        raise ParakeetLoadError(
            f"parakeet: could not restore a NeMo ASR model from {path} "
            f"(config field: scorers.parakeet.model_path; corrupt or not a .nemo archive?): "
            f"{type(e).__name__}: {e}"
        ) from e
    if not hasattr(model, "decoding") or not hasattr(model, "joint"):
        raise ParakeetLoadError(
            f"parakeet: {path} restored as {type(model).__name__}, not a transducer "
            "(RNNT/TDT) model (config field: scorers.parakeet.model_path)"
        )
    return model.eval()


class ParakeetScorer(Scorer):
    name = "parakeet"
    columns = {"transcript": "VARCHAR", "wer": "DOUBLE", "cer": "DOUBLE"}
    input_sample_rate = SAMPLE_RATE

    def __init__(
        self,
        device: str = "cpu",
        model_path: str | None = None,
        model_name: str = DEFAULT_MODEL,
        batch_size: int = 64,
        dtype: str = "auto",  # auto: bfloat16 on CUDA, float32 on CPU
        pad_min_duration: float = 1.0,  # seconds; as NeMo's transcribe() (centred zero padding)
        hf_cache_dir: str | None = None,  # default: the Hugging Face cache (HF_HUB_CACHE)
        hash_weights: bool = True,
        hash_memo_dir: str | None = None,  # where file hashes are memoised across workers
        _model=None,  # an already built NeMo model (random_for_bench, tests)
    ):
        import torch

        self.device = device
        self.batch_size = int(batch_size)
        if self.batch_size <= 0:
            raise ValueError(f"parakeet: batch_size must be positive, got {batch_size}")
        is_cuda = str(device).startswith("cuda")
        dtype = ("bfloat16" if is_cuda else "float32") if dtype == "auto" else dtype
        if dtype not in _DTYPES:
            raise ValueError(
                f"parakeet: dtype must be one of auto, {', '.join(_DTYPES)}; got {dtype!r}"
            )
        # bf16/fp16 only where this device runs every op of the model under autocast (a CPU
        # without AVX512-BF16 has no reduced-precision LSTM); else float32, logged.
        self.dtype = resolve_dtype("parakeet", device, _DTYPES[dtype], AUTOCAST_OPS)
        self.pad_min_samples = int(float(pad_min_duration) * SAMPLE_RATE)
        if _model is not None:
            self.source, self.nemo_path = "random-weights", None
            self.model = _model.eval().to(device)
        else:
            self.source = "model_path" if model_path else f"hf-cache:{model_name}"
            self.nemo_path = resolve_nemo_file(model_path, model_name, hf_cache_dir)
            self.model = load_nemo_asr(self.nemo_path, device)
        self._sha256 = (
            _sha256(self.nemo_path, hash_memo_dir) if (self.nemo_path and hash_weights) else None
        )
        self._prepare_for_inference()
        self._torch_dtype = getattr(torch, self.dtype)

    def _prepare_for_inference(self) -> None:
        """What NeMo's transcribe() does around each call, done once: no dither, no pad_to,
        greedy batched decoding (label-looping, CUDA graphs where available)."""
        from omegaconf import open_dict

        featurizer = getattr(self.model.preprocessor, "featurizer", None)
        if featurizer is not None:
            if hasattr(featurizer, "dither"):
                featurizer.dither = 0.0
            if hasattr(featurizer, "pad_to"):
                featurizer.pad_to = 0
        # Ask for the CUDA-graph label-looping decoder explicitly rather than trusting the
        # checkpoint's saved decoding config: on an H200 (random weights, 64 x 15 s clips) greedy
        # transcription took 0.0081 s/clip with it and 0.0437 without. On CPU NeMo falls back.
        decoding_cfg = self.model.cfg.decoding
        with open_dict(decoding_cfg):
            decoding_cfg.strategy = "greedy_batch"
            if decoding_cfg.get("greedy") is None:
                decoding_cfg.greedy = {}
            decoding_cfg.greedy.loop_labels = True
            decoding_cfg.greedy.use_cuda_graph_decoder = True
        self.model.change_decoding_strategy(decoding_cfg, verbose=False)
        for p in self.model.parameters():
            p.requires_grad_(False)

    # ------------------------------------------------------------------------------------------

    def _autocast(self):
        import torch

        if self.dtype == "float32":
            return contextlib.nullcontext()
        kind = "cuda" if str(self.device).startswith("cuda") else "cpu"
        return torch.autocast(device_type=kind, dtype=self._torch_dtype)

    def transcribe_batch(self, audios16k: list[np.ndarray]) -> list[str]:
        """Greedy transcripts of 16 kHz mono float32 arrays (one padded batch)."""
        import torch

        lengths = [len(a) for a in audios16k]
        signal = np.zeros((len(audios16k), max(max(lengths), 1)), dtype=np.float32)
        for i, a in enumerate(audios16k):
            signal[i, : len(a)] = a
        signal_t = torch.from_numpy(signal).to(self.device)
        lengths_t = torch.tensor(lengths, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            feats, feat_lens = self.model.preprocessor(input_signal=signal_t, length=lengths_t)
            with self._autocast():
                encoded, encoded_lens = self.model.encoder(audio_signal=feats, length=feat_lens)
                hyps = self.model.decoding.rnnt_decoder_predictions_tensor(
                    encoder_output=encoded, encoded_lengths=encoded_lens, return_hypotheses=False
                )
        # NeMo < 2.x returned (best, all); newer returns the list of best hypotheses.
        if isinstance(hyps, tuple):
            hyps = hyps[0]
        return [(h.text if hasattr(h, "text") else str(h)).strip() for h in hyps]

    def _pad_short(self, audio: np.ndarray) -> np.ndarray:
        """Centre very short takes in zeros up to ``pad_min_duration``, as NeMo's own
        transcribe() does (the model was tuned with that), so results match it exactly."""
        missing = self.pad_min_samples - len(audio)
        if missing <= 0:
            return audio
        return np.pad(audio, (missing // 2, missing - missing // 2))

    def transcribe(self, audios: list[np.ndarray], sample_rate: int) -> list[str]:
        audios16k = [
            self._pad_short(resample(to_mono(a), sample_rate, SAMPLE_RATE)) for a in audios
        ]
        # Sort by length so each batch pads little; results go back in the input order.
        order = sorted(range(len(audios16k)), key=lambda i: len(audios16k[i]))
        out: list[str] = [""] * len(audios16k)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            for i, text in zip(
                idx, self.transcribe_batch([audios16k[i] for i in idx]), strict=True
            ):
                out[i] = text
        return out

    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec):
        transcripts = self.transcribe(audios, sample_rate)
        return asr_columns(spec.text, transcripts)

    def provenance(self) -> dict:
        return {
            "backend": self.name,
            "source": self.source,
            "model_path": str(self.nemo_path) if self.nemo_path else None,
            "model_sha256": self._sha256,
            "model_class": type(self.model).__name__,
            "decoding": "greedy_batch",
            "dtype": self.dtype,
            "batch_size": self.batch_size,
            "pad_min_samples": self.pad_min_samples,
            "normalizer": "whisper_normalizer EnglishTextNormalizer",
        }

    def close(self) -> None:
        import torch

        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# models built from a config (random weights): the tiny one for tests, the real size for the
# GPU benchmark. Both are complete EncDecRNNTBPEModel instances with a SentencePiece tokenizer
# trained on the spot, so save_to()/restore_from() work on them exactly as on the real .nemo.

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


def random_for_bench(device: str, workdir: str | None = None, **kw) -> ParakeetScorer:
    """Parakeet at the real v3 size (~0.6B parameters) with random weights, for speed runs.
    Random weights emit more tokens per frame than the real model, so greedy decoding here is
    a pessimistic bound on the decoder's share of the time."""
    import tempfile

    workdir = workdir or tempfile.mkdtemp(prefix="parakeet-bench-")
    os.makedirs(workdir, exist_ok=True)
    model = build_tdt_model(Path(workdir), REAL_SIZE)
    return ParakeetScorer(device=device, _model=model, **kw)


def tiny_for_tests(device: str = "cpu", workdir: str | None = None, **kw) -> ParakeetScorer:
    import tempfile

    workdir = workdir or tempfile.mkdtemp(prefix="parakeet-tiny-")
    return ParakeetScorer(device=device, _model=build_tdt_model(Path(workdir), TINY_SIZE), **kw)
