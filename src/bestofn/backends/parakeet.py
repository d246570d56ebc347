"""Production ASR: NVIDIA Parakeet-TDT-0.6b-v3 through nemo_toolkit. Columns: transcript, wer, cer.

The model is read from a local ``.nemo`` file (``model_path``) or, offline, from the Hugging
Face cache (``model_name``); nothing is downloaded. Takes are transcribed in memory, in
batches: resample to 16 kHz mono, pad to the longest take, then preprocessor -> encoder ->
greedy TDT decoding called directly (no manifest, no temp files, no dataloader). On CUDA the
encoder and decoder run under bf16 autocast (the single biggest scoring win); the mel
preprocessor always runs in float32, as NeMo recommends. A device that cannot run an op of the
model in the asked dtype (a CPU without AVX512-BF16 has no bf16 LSTM under autocast) runs
float32 instead, with a warning (``bestofn.util.dtypes``).

v3 emits punctuation and casing, so WER/CER are computed after English normalisation
(``bestofn.util.textnorm``) of both the prompt text and the transcript. That text work runs in a
thread of the scorer while the next batch is on the GPU; ``score_deferred`` returns after the
last batch's GPU work and leaves the text work of the group to finish there (the fused worker
collects it while the next group runs). Takes are sorted by duration before batching
(``batch_size``, default 128), so each batch pads little. ``compile`` (on CUDA) runs the
encoder through ``torch.compile`` under bf16 autocast. ``decoding`` picks NeMo's own greedy TDT
decoder (``DECODINGS``): label-looping with CUDA graphs, either one full graph whose loops are
conditional nodes or the loop bodies as graphs with the loops on the host (the CUDA default),
the same loop without graphs (the CPU default: graphs need CUDA), or the per-utterance loop.
``attention`` picks the encoder's self-attention: NeMo's SDPA path (the CUDA default) or its
manual float32 softmax (the CPU default, as the checkpoint ships).
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bestofn.backends import nemo_cache
from bestofn.backends.base import Scorer
from bestofn.util.audio import resample, to_mono
from bestofn.util.dtypes import resolve_dtype
from bestofn.util.hashing import file_sha256
from bestofn.util.spec import GroupSpec
from bestofn.util.textnorm import asr_columns

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {
    "parakeet": {
        "role": "scorer",
        "class": "ParakeetScorer",
        "preload": ("omegaconf", "nemo.collections.asr.models:ASRModel"),
        "preload_rank": 20,
    }
}
# one .nemo archive (docs/notes/sidon-parakeet-facts.md); the revision is a public pin
# (docs/notes/weights-revisions.md)
PUBLISHED_WEIGHTS = (
    {
        "name": "parakeet",
        "repo_id": "nvidia/parakeet-tdt-0.6b-v3",
        "revision": "6d590f77001d318fb17a0b5bf7ee329a91b52598",
        "allow_patterns": ("parakeet-tdt-0.6b-v3.nemo",),
        "folder": "parakeet-tdt-0.6b-v3",
    },
)

log = logging.getLogger(__name__)

DEFAULT_MODEL = "nvidia/parakeet-tdt-0.6b-v3"
SAMPLE_RATE = 16000  # what the model's preprocessor expects
_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}
_DTYPES.update({"float32": "float32", "fp32": "float32"})
# runtime.decoding -> NeMo's decoding config (strategy, greedy.loop_labels,
# greedy.use_cuda_graph_decoder), keys as NeMo 3.0.0 reads them (GreedyBatchedTDTInfer: for
# TDT, greedy_batch is always label-looping; use_cuda_graph_decoder asks its computer for CUDA
# graphs), and the graphs mode the label-looping computer is held to (its CudaGraphsMode value;
# None: NeMo picks, a full graph whose loops are CUDA conditional nodes where the driver has
# them). NeMo's graph path runs the joint outside our autocast, the eager path inside it: on
# CUDA the two can give other transcripts, so the choice is in the provenance.
DECODINGS = {
    "cuda_graphs": ("greedy_batch", True, True, None),
    # the loop's bodies as graphs, the two loops run on the host, reading their conditions
    # back once per step
    "cuda_graphs_host_loop": ("greedy_batch", True, True, "no_while_loops"),
    "label_looping": ("greedy_batch", True, False, None),
    "greedy": ("greedy", False, False, None),  # one utterance at a time (GreedyTDTInfer)
}
# 'auto' on CUDA. Why the host loop: on an H200 an ab side run in a process's main program
# faulted (illegal memory access, seen at the full graph's decode) every time, and passed
# with the loops on the host, at the same speed and with the same transcripts; the cause is not
# found (ledger figure workflow.parakeet_host_loop.s_per_clip). The CPU keeps the eager label
# loop it always ran (NeMo has no CUDA graphs there).
CUDA_DEFAULT_DECODING = "cuda_graphs_host_loop"
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


# The class whose constructor sets the config's ``labels`` and ``joint.vocabulary`` from its
# tokenizer (NeMo 3.0.0, EncDecRNNTBPEModel.__init__), overwriting what the archive's config
# holds: Parakeet-TDT's. OmegaConf wraps the two 8,192-piece lists node by node at every copy
# of the config (about six in a build, the first ones before the constructor replaces the
# lists), which was most of the build (cProfile; ledger figure
# worker_start.parakeet_config_yaml).
_VOCABULARY_FROM_TOKENIZER = "nemo.collections.asr.models.rnnt_bpe_models.EncDecRNNTBPEModel"


def _omegaconf_yaml_with_libyaml():
    """OmegaConf's own YAML loader class (its float and duplicate-key rules, its constructors)
    with libyaml's C parser in place of PyYAML's Python one; None without libyaml (or without
    that private function of OmegaConf's).

    Why: ``OmegaConf.load`` parses with the pure-Python parser, and a Parakeet-TDT config
    holds two 8,192-piece lists, about 1 s of the 2-core VM's build, held under the GIL while
    the other backends load. The C parser makes the same nodes; the constructor and the
    implicit resolvers (Python, OmegaConf's) turn them into the same values (tested against
    ``OmegaConf.load``). ``omegaconf._utils.get_yaml_loader``: tested with omegaconf 2.3.0."""
    import yaml

    try:  # a private function: where an omegaconf lacks it, OmegaConf.load reads the config
        from omegaconf._utils import get_yaml_loader
    except ImportError:
        return None
    if not getattr(yaml, "__with_libyaml__", False):
        return None
    from yaml.cyaml import CParser

    loader = get_yaml_loader()

    class Loader(CParser, loader):  # the C parser first: it replaces the Python stages
        def __init__(self, stream):
            CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

    return Loader


def _load_config_dict(path: Path):
    """``path`` parsed as ``OmegaConf.load`` parses it, as plain Python (dicts, lists)."""
    import yaml
    from omegaconf import OmegaConf

    loader = _omegaconf_yaml_with_libyaml()
    if loader is None:
        return OmegaConf.to_container(OmegaConf.load(path))
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=loader)


def _config_without_vocabulary(members: Path):
    """The archive's model config with ``labels`` and ``joint.vocabulary`` emptied when its
    class rebuilds them from its tokenizer; else None (NeMo reads the config itself). The
    lists are emptied before OmegaConf wraps the config, so it never wraps them."""
    from omegaconf import OmegaConf

    config = _load_config_dict(members / "model_config.yaml")
    if not isinstance(config, dict) or config.get("target") != _VOCABULARY_FROM_TOKENIZER:
        return None
    if not isinstance(config.get("joint"), dict):
        return None
    config["labels"] = []
    config["joint"]["vocabulary"] = []
    return OmegaConf.create(config)


def load_nemo_asr(path: Path, device: str = "cpu", digest: str | None = None):
    """Restore a NeMo ASR model from a ``.nemo`` archive; a clear error when it is not one.

    The model is constructed without its random initialisation (``skip_init``): the strict
    load of the archive's weights that follows overwrites every parameter and fails on any it
    lacks, so the weights are the same bits, a third of the build sooner. With the archive's
    ``digest`` and a worker cache (``bestofn.util.caches``), it is restored from its members
    extracted there (``nemo_cache``): the same files, so the same model. From there a
    Parakeet-TDT config goes in without the vocabulary lists its class rebuilds from the
    tokenizer anyway (``_config_without_vocabulary``): the same model, a third of the build
    sooner on the 2-core VM, less on the H200 (14.6 -> 13.4 s: the constructor's own copies
    of the rebuilt lists remain)."""
    import torch
    from nemo.collections.asr.models import ASRModel
    from nemo.core.connectors.save_restore_connector import SaveRestoreConnector

    from bestofn.backends.skip_init import random_init_skipped

    connector = SaveRestoreConnector()
    members = nemo_cache.extracted(path, digest)  # None: NeMo unpacks the archive itself
    override = None
    try:
        if members is not None:
            connector.model_extracted_dir = str(members)
            override = _config_without_vocabulary(members)
        with random_init_skipped():
            model = ASRModel.restore_from(
                str(path), map_location=torch.device(device), strict=True,
                save_restore_connector=connector, override_config_path=override,
            )  # fmt: skip
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
    if override is not None and not (model.cfg.labels and model.cfg.joint.vocabulary):
        raise ParakeetLoadError(  # this NeMo no longer rebuilds them: not the pinned 3.0.0
            f"parakeet: {path} restored without its vocabulary lists, and this NeMo's "
            f"{type(model).__name__} did not rebuild them from the tokenizer (tested: NeMo 3.0.0)"
        )
    return model.eval()


class ParakeetScorer(Scorer):
    name = "parakeet"
    table_weights = "local Parakeet-TDT-0.6b-v3 `.nemo`"
    table_options = "`model_path`, `model_name`, `dtype` (below)"
    columns = {"transcript": "VARCHAR", "wer": "DOUBLE", "cer": "DOUBLE", "finished": "BOOLEAN"}
    better = {"wer": "lower", "cer": "lower"}
    input_sample_rate = SAMPLE_RATE

    def __init__(
        self,
        device: str = "cpu",
        model_path: str | None = None,
        model_name: str = DEFAULT_MODEL,
        batch_size: int = 128,
        dtype: str = "auto",  # auto: bfloat16 on CUDA, float32 on CPU
        pad_min_duration: float = 1.0,  # seconds; as NeMo's transcribe() (centred zero padding)
        compile: bool | str = False,  # torch.compile the encoder (CUDA only; "auto": on CUDA)
        attention: str = "auto",  # encoder self-attention: sdpa | manual | auto (sdpa on CUDA)
        decoding: str = "auto",  # a DECODINGS key, or auto (graphs on CUDA)
        hf_cache_dir: str | None = None,  # default: the Hugging Face cache (HF_HUB_CACHE)
        hash_weights: bool = True,
        hash_memo_dir: str | None = None,  # where file hashes are memoised across workers
    ):
        self._configure(device, batch_size, dtype, pad_min_duration, compile, attention, decoding)
        self.source = "model_path" if model_path else f"hf-cache:{model_name}"
        self.nemo_path = resolve_nemo_file(model_path, model_name, hf_cache_dir)
        # hashed first: the digest names the archive's extracted copy in the worker's cache
        self._sha256 = _sha256(self.nemo_path, hash_memo_dir) if hash_weights else None
        model = load_nemo_asr(self.nemo_path, device, digest=self._sha256)
        self._attach(model)

    @classmethod
    def from_modules(cls, model, device: str = "cpu", **options) -> ParakeetScorer:
        """A scorer around a NeMo transducer model already in memory (``bestofn.fakes.parakeet``,
        tests). ``options``: the constructor's batch_size, dtype, pad_min_duration, compile,
        attention, decoding."""
        self = cls.__new__(cls)
        self._configure(device, **options)
        self.source, self.nemo_path, self._sha256 = "in-memory model", None, None
        self._attach(model.eval().to(device))
        return self

    def _configure(
        self,
        device: str,
        batch_size: int = 128,
        dtype: str = "auto",
        pad_min_duration: float = 1.0,
        compile: bool | str = False,
        attention: str = "auto",
        decoding: str = "auto",
    ) -> None:
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
        self._torch_dtype = getattr(torch, self.dtype)
        if compile not in (True, False, "auto"):
            raise ValueError(f"parakeet: compile must be true, false or auto; got {compile!r}")
        # compiled code on CPU differs in the last bits from eager: only where it pays
        self.compile = is_cuda and compile in (True, "auto")
        if attention not in ("auto", "sdpa", "manual"):
            raise ValueError(f"parakeet: attention must be auto, sdpa or manual; got {attention!r}")
        # NeMo's own switch (use_pytorch_sdpa): the relative-position scores still come from its
        # matmul, the softmax and P.V from one fused SDPA kernel instead of float32 [B, H, T, T]
        # passes: a faster encoder (ledger figure scorers.parakeet_encoder.s_per_clip); outputs
        # move by bf16 rounding, as a change of batch size does.
        self.attention = ("sdpa" if is_cuda else "manual") if attention == "auto" else attention
        if decoding != "auto" and decoding not in DECODINGS:
            raise ValueError(
                f"parakeet: decoding must be auto, {', '.join(DECODINGS)}; got {decoding!r}"
            )
        if decoding == "auto":
            decoding = CUDA_DEFAULT_DECODING if is_cuda else "label_looping"
        self.decoding = decoding
        self._encoder = None  # the (compiled) encoder forward, set in _attach
        self._text_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parakeet-text")

    def _attach(self, model) -> None:
        self.model = model
        self._prepare_for_inference()
        self._set_attention(self.attention)
        self.set_speed(compile=self.compile)

    def set_speed(self, batch_size: int | None = None, compile: bool | None = None) -> None:
        """Change the speed-only knobs of a loaded scorer (benchmarks compare them in one
        process): the batch size, and whether the encoder runs compiled (CUDA only)."""
        if batch_size is not None:
            if int(batch_size) <= 0:
                raise ValueError(f"parakeet: batch_size must be positive, got {batch_size}")
            self.batch_size = int(batch_size)
        if compile is not None:
            self.compile = bool(compile) and str(self.device).startswith("cuda")
            self._encoder = self.model.encoder
            if self.compile:
                import torch

                # dynamic: the padded length changes with every batch
                self._encoder = torch.compile(self.model.encoder, dynamic=True)

    def _set_attention(self, attention: str) -> None:
        """sdpa or manual self-attention in every attention module of the encoder."""
        modules = [m for m in self.model.encoder.modules() if hasattr(m, "use_pytorch_sdpa")]
        if attention == "sdpa" and not modules:
            raise ParakeetLoadError(
                "parakeet: attention 'sdpa' asked for, but this NeMo's encoder has no "
                "use_pytorch_sdpa switch (config field: scorers.parakeet.runtime.attention)"
            )
        for m in modules:
            m.use_pytorch_sdpa = attention == "sdpa"
            m.use_pytorch_sdpa_backends = []  # any SDPA backend torch picks
        self.attention = attention

    def _prepare_for_inference(self) -> None:
        """What NeMo's transcribe() does around each call, done once: no dither, no pad_to,
        NeMo's greedy TDT decoding as ``self.decoding`` names it (``DECODINGS``)."""
        from omegaconf import open_dict

        featurizer = getattr(self.model.preprocessor, "featurizer", None)
        if featurizer is not None:
            if hasattr(featurizer, "dither"):
                featurizer.dither = 0.0
            if hasattr(featurizer, "pad_to"):
                featurizer.pad_to = 0
        # Set the decoder explicitly rather than trusting the checkpoint's saved decoding
        # config: on an H200 greedy transcription with the CUDA-graph label loop was several
        # times faster than without (ledger figure scorers.parakeet_decoding.host_loop).
        strategy, loop_labels, graphs, graphs_mode = DECODINGS[self.decoding]
        decoding_cfg = self.model.cfg.decoding
        with open_dict(decoding_cfg):
            decoding_cfg.strategy = strategy
            if decoding_cfg.get("greedy") is None:
                decoding_cfg.greedy = {}
            decoding_cfg.greedy.loop_labels = loop_labels
            decoding_cfg.greedy.use_cuda_graph_decoder = graphs
        self.model.change_decoding_strategy(decoding_cfg, verbose=False)
        if graphs_mode is not None:
            self._force_graphs_mode(graphs_mode)
        for p in self.model.parameters():
            p.requires_grad_(False)

    def _force_graphs_mode(self, mode: str) -> None:
        """Hold NeMo's label-looping computer (model.decoding.decoding.decoding_computer, NeMo
        3.0.0) to one CUDA-graphs mode; no fallback to another (NeMo's force_cuda_graphs_mode).
        On the CPU the computer runs its eager loop whatever the mode."""
        greedy = getattr(self.model.decoding, "decoding", None)
        computer = getattr(greedy, "decoding_computer", None)
        if computer is None or not hasattr(computer, "force_cuda_graphs_mode"):
            raise ParakeetLoadError(
                f"parakeet: decoding {self.decoding!r} needs NeMo's label-looping computer "
                "(model.decoding.decoding.decoding_computer.force_cuda_graphs_mode, NeMo 3.0.0); "
                "this NeMo has none (config field: scorers.parakeet.runtime.decoding)"
            )
        computer.force_cuda_graphs_mode(mode)

    # ------------------------------------------------------------------------------------------

    def _autocast(self):
        import torch

        if self.dtype == "float32":
            return contextlib.nullcontext()
        kind = "cuda" if str(self.device).startswith("cuda") else "cpu"
        return torch.autocast(device_type=kind, dtype=self._torch_dtype)

    def encode_batch(self, audios16k: list[np.ndarray]):
        """Preprocessor + encoder of 16 kHz mono float32 arrays (one padded batch): (encoded,
        encoded_lengths), the encoder output in the joint's weight dtype."""
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
                encoded, encoded_lens = self._encoder(audio_signal=feats, length=feat_lens)
            # NeMo's graph decoder runs the joint on the encoder output as it comes (no
            # autocast there): give it the joint's weight dtype
            joint_dtype = self.model.joint.joint_net[-1].weight.dtype
            if encoded.dtype != joint_dtype:
                encoded = encoded.to(joint_dtype)
        return encoded, encoded_lens

    def decode(self, encoded, encoded_lens) -> list[str]:
        """Greedy transcripts of a batch's encoder output (``encode_batch``)."""
        import torch

        with torch.inference_mode(), self._autocast():
            hyps = self.model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=encoded, encoded_lengths=encoded_lens, return_hypotheses=False
            )
        # NeMo < 2.x returned (best, all); newer returns the list of best hypotheses.
        if isinstance(hyps, tuple):
            hyps = hyps[0]
        return [(h.text if hasattr(h, "text") else str(h)).strip() for h in hyps]

    def transcribe_batch(self, audios16k: list[np.ndarray]) -> list[str]:
        """Greedy transcripts of 16 kHz mono float32 arrays (one padded batch)."""
        return self.decode(*self.encode_batch(audios16k))

    def _pad_short(self, audio: np.ndarray) -> np.ndarray:
        """Centre very short takes in zeros up to ``pad_min_duration``, as NeMo's own
        transcribe() does (the model was tuned with that), so results match it exactly."""
        missing = self.pad_min_samples - len(audio)
        if missing <= 0:
            return audio
        return np.pad(audio, (missing // 2, missing - missing // 2))

    def _batches(self, audios: list[np.ndarray], sample_rate: int):
        """(input indices, transcripts) per batch, takes sorted by duration."""
        audios16k = [
            self._pad_short(resample(to_mono(a), sample_rate, SAMPLE_RATE)) for a in audios
        ]
        # Sort by duration so each batch pads little; results go back in the input order.
        order = sorted(range(len(audios16k)), key=lambda i: len(audios16k[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            yield idx, self.transcribe_batch([audios16k[i] for i in idx])

    def transcribe(self, audios: list[np.ndarray], sample_rate: int) -> list[str]:
        out: list[str] = [""] * len(audios)
        for idx, texts in self._batches(audios, sample_rate):
            for i, text in zip(idx, texts, strict=True):
                out[i] = text
        return out

    def score_deferred(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec):
        """Transcribe on the device; each batch's normalisation + WER/CER runs in the text
        thread while the next batch decodes. Returns a callable that waits for the text work
        and gives the columns (the same as ``score``'s)."""
        n = len(audios)
        parts = [
            (idx, self._text_pool.submit(asr_columns, spec.text, texts, spec.language))
            for idx, texts in self._batches(audios, sample_rate)
        ]

        def finish() -> dict[str, list]:
            cols: dict[str, list] = {c: [None] * n for c in self.columns}
            for idx, future in parts:
                part = future.result()
                for c in self.columns:
                    for i, v in zip(idx, part[c], strict=True):
                        cols[c][i] = v
            return cols

        return finish

    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec):
        return self.score_deferred(audios, sample_rate, spec)()

    def provenance(self) -> dict:
        return {
            "backend": self.name,
            "source": self.source,
            "model_path": str(self.nemo_path) if self.nemo_path else None,
            "model_sha256": self._sha256,
            "model_class": type(self.model).__name__,
            "decoding": self.decoding,
            "dtype": self.dtype,
            "batch_size": self.batch_size,
            "compiled_encoder": self.compile,
            "attention": self.attention,
            "pad_min_samples": self.pad_min_samples,
            "normalizer": "whisper_normalizer EnglishTextNormalizer",
        }

    def close(self) -> None:
        import torch

        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
