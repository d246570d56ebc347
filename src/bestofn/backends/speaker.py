"""Speaker similarity against the group's reference voice: WavLM-Base-Plus x-vectors.

``spk_sim``: cosine between a take's x-vector and the reference voice's (``spec.reference_audio``);
without a reference, the take is compared with the centroid of its group's x-vectors (a
consistency score), and ``spk_ref`` says which was used, as the embedded default's
``resemblyzer`` backend does (``speaker_sim`` / ``speaker_ref``).

Why WavLM x-vectors (``microsoft/wavlm-base-plus-sv``) and not ECAPA through speechbrain
(``speechbrain/spkrec-ecapa-voxceleb``, the field's choice):

- speechbrain 1.1.2 (the newest on the package index) requires ``torchaudio>=2.7.1``; the newest
  torchaudio wheel (2.11.0) is built for torch 2.11, while this project's environments run torch
  2.13 (CPU) and 2.11 (the H200 image): an untested pairing, and a second audio stack beside
  transformers';
- speechbrain loads a model by running its ``hyperparams.yaml`` through hyperpyyaml (the file
  names the classes to construct) and fetching files through its own fetcher; a wrong folder
  fails inside that machinery, and the ckpt files are read into modules that the yaml built;
- ``WavLMForXVector`` ships with transformers (already pinned for production), loads the
  published folder (``config.json``, ``preprocessor_config.json``, weights) with
  ``from_pretrained``, and random weights in exactly that layout come from ``save_pretrained``
  (``bestofn.fakes.speaker``): the real loading code runs in the tests.

Its cosine scale is not ECAPA's: the model card of microsoft/wavlm-base-plus-sv puts the
same-speaker threshold at 0.86, where LAION's voice-consistency notes (ECAPA) resample below 0.58
and reject below 0.40. A selection floor must be set on this scale.

Usage as the model card gives it: 16 kHz mono through ``Wav2Vec2FeatureExtractor``, the model's
``embeddings`` output, L2-normalised, cosine. The feature extractor runs on each take alone (its
normalisation is the take's own), then takes of a batch are padded to the longest and masked
(``runtime.batching: padded``), where padding cannot reach a take's x-vector: the front end's
convolutions have no padding of their own (a valid frame reads valid samples only), the
transformer masks padded frames (and zeroes them before its positional convolution, as a lone
take's zero padding), and the x-vector pools over each take's own frames. One piece would see
the padding: with ``feat_extract_norm: group`` (transformers' default, and the random fakes')
the first convolution's group norm normalises each channel over the whole time axis. It is
swapped for the same norm over each take's own frames (``ValidFrameGroupNorm``: the group norm
of the take's valid slice, the op a lone take runs). And transformers' pooling length ignores
the TDNN's dilation (``tdnn_lengths``), which we count. ``batching: one_length`` batches only
takes of one length (no padding at all: a take of its own length runs alone).

Speed dials (``runtime``, the config schema's ``$defs.wavlm_speaker_runtime``; each changes
spk_sim's last bits, so each is named in the provenance and is a ``bestofn ab`` dial):

- ``precision``: the WavLM body (convolutional front end and transformer) in bfloat16 on CUDA
  (auto). The x-vector head stays float32: the layer-weighted sum of the hidden states, the
  TDNN and the mean/std pooling, where bfloat16's 8-bit mantissa would round the statistics
  the cosine is made of, for a few per cent of the model's work.
- ``batch_size``: takes per forward pass (in order of length), which bounds the front end's
  activations (the largest tensors: 512 channels at 3.2 kHz).
- ``batching``: ``padded`` (above) or ``one_length``.
- ``max_seconds``: the central seconds of each take and of the reference. The model card says
  16 kHz and nothing about input length (docs/notes/scorers-facts.md); the x-vector's pooling
  averages over frames, so a crop keeps the voice's statistics while the cost stays fixed, and
  every take longer than the crop has one length: they batch without padding. Off by default:
  a crop sees less of a take that drifts away from the voice.
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bestofn.backends.base import Scorer, hash_memo_dir
from bestofn.util.audio import load_audio, resample, to_mono
from bestofn.util.dtypes import resolve_dtype
from bestofn.util.spec import GroupSpec

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {
    "wavlm-speaker": {
        "role": "scorer",
        "class": "SpeakerScorer",
        "preload": ("transformers:WavLMForXVector,Wav2Vec2FeatureExtractor",),
        "preload_rank": 50,
    }
}
# microsoft/wavlm-base-plus-sv (config.json, preprocessor_config.json, weights); the revision
# is a public pin (docs/notes/weights-revisions.md)
PUBLISHED_WEIGHTS = (
    {
        "name": "wavlm-speaker",
        "repo_id": "microsoft/wavlm-base-plus-sv",
        "revision": "feb593a6c23c1cc3d9510425c29b0a14d2b07b1e",
        "allow_patterns": (
            "config.json",
            "preprocessor_config.json",
            "*.safetensors",
            "pytorch_model.bin",
        ),
        "folder": "wavlm-base-plus-sv",
        "note": (
            "WavLMForXVector; the published folder may hold pytorch_model.bin (the loader reads it)"
        ),
    },
)

SAMPLE_RATE = 16000
# the x-vector head (kept in float32 whatever the body's precision)
HEAD_MODULES = ("projector", "tdnn", "feature_extractor", "classifier")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
CAST_OPS = ("conv1d", "linear", "layer_norm", "attention")
BATCHING = ("padded", "one_length")


class WeightsError(ValueError):
    """A weights path named in config is missing, unreadable, or not in the expected layout."""


def check_folder(path: str | None, field: str = "model_path") -> Path:
    """The published folder's files, each named when missing: config.json,
    preprocessor_config.json and the weights (model.safetensors or pytorch_model.bin)."""
    if not path:
        raise WeightsError(f"wavlm-speaker: config option {field!r} is not set")
    p = Path(path).expanduser()
    if not p.is_dir():
        raise WeightsError(
            f"wavlm-speaker: {field} {str(p)!r} is not a directory (config option {field!r})"
        )
    for name in ("config.json", "preprocessor_config.json"):
        if not (p / name).is_file():
            raise WeightsError(f"wavlm-speaker: {str(p / name)!r} is missing ({field})")
    if not any((p / name).is_file() for name in WEIGHT_FILES):
        raise WeightsError(
            f"wavlm-speaker: no weights in {str(p)!r} ({field}): expected "
            f"{' or '.join(WEIGHT_FILES)}"
        )
    return p


def load_model(path: str | None, field: str = "model_path"):
    """(model, feature extractor, folder) from a microsoft/wavlm-base-plus-sv folder."""
    from transformers import Wav2Vec2FeatureExtractor, WavLMConfig, WavLMForXVector

    p = check_folder(path, field)
    try:
        config = WavLMConfig.from_pretrained(p)
    except Exception as e:
        raise WeightsError(f"wavlm-speaker: cannot read {str(p / 'config.json')!r}: {e}") from e
    if "WavLMForXVector" not in (config.architectures or []):
        raise WeightsError(
            f"wavlm-speaker: {str(p / 'config.json')!r} is not an x-vector checkpoint "
            f"(architectures {config.architectures}, expected WavLMForXVector)"
        )
    try:
        fe = Wav2Vec2FeatureExtractor.from_pretrained(p)
    except Exception as e:
        raise WeightsError(
            f"wavlm-speaker: cannot read {str(p / 'preprocessor_config.json')!r}: {e}"
        ) from e
    if fe.sampling_rate != SAMPLE_RATE:
        raise WeightsError(
            f"wavlm-speaker: {str(p / 'preprocessor_config.json')!r} says sampling_rate "
            f"{fe.sampling_rate}, expected {SAMPLE_RATE}"
        )
    weights = next(p / n for n in WEIGHT_FILES if (p / n).is_file())
    try:
        model, info = WavLMForXVector.from_pretrained(
            p, dtype=torch.float32, output_loading_info=True
        )
    except Exception as e:
        raise WeightsError(f"wavlm-speaker: cannot load {str(weights)!r}: {e}") from e
    missing = list(info.get("missing_keys") or [])
    if missing:  # from_pretrained would fill these with random values
        raise WeightsError(
            f"wavlm-speaker: {str(weights)!r} lacks {len(missing)} weights of the x-vector "
            f"model, e.g. {sorted(missing)[:4]}"
        )
    return model, fe, p


def min_samples(config) -> int:
    """The shortest input the x-vector model embeds: the TDNN needs its receptive field of
    frames, plus one, since the pooling's standard deviation (unbiased) needs two output frames
    (at one it is NaN); the convolutional front end needs that many frames' samples."""
    tdnn = zip(config.tdnn_kernel, config.tdnn_dilation, strict=True)
    frames = 2 + sum((k - 1) * d for k, d in tdnn)
    samples = frames
    for kernel, stride in reversed(list(zip(config.conv_kernel, config.conv_stride, strict=True))):
        samples = (samples - 1) * stride + kernel
    return samples


class ValidFrameGroupNorm(torch.nn.GroupNorm):
    """The front end's first norm (a GroupNorm of one channel per group: each channel normalised
    over time) over each row's own frames: ``frames`` (host ints, one per row) is set around a
    padded forward; row i's first ``frames[i]`` frames get the group norm of that slice alone,
    the very op an unpadded take runs; its padded frames are left unnormalised (no valid frame
    downstream reads them). With ``frames`` None it is the group norm. The loaded GroupNorm's
    class is swapped for this one (``valid_frame_norm``): its parameters and their names stay."""

    frames: list[int] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.frames is None:
            return super().forward(x)
        for i, length in enumerate(self.frames):  # in place: one take's slice at a time
            x[i : i + 1, :, :length] = F.group_norm(
                x[i : i + 1, :, :length], self.num_groups, self.weight, self.bias, self.eps
            )
        return x


def valid_frame_norm(model) -> ValidFrameGroupNorm | None:
    """Make the first convolution's per-channel group norm (``feat_extract_norm: group``) a
    ``ValidFrameGroupNorm``; None where the front end normalises per frame (``layer``). Reads
    transformers' WavLM module names (the pinned version)."""
    norm = getattr(model.wavlm.feature_extractor.conv_layers[0], "layer_norm", None)
    if not isinstance(norm, torch.nn.GroupNorm):
        return None
    if norm.num_groups != norm.num_channels:
        raise WeightsError(
            f"wavlm-speaker: the first group norm has {norm.num_groups} groups over "
            f"{norm.num_channels} channels; a per-channel norm (one group a channel) expected"
        )
    norm.__class__ = ValidFrameGroupNorm
    return norm


def tdnn_lengths(model):
    """Each take's frame count after the x-vector TDNN, dilation counted: transformers' own
    ``_get_tdnn_output_lengths`` (pinned 5.17.0) subtracts ``kernel - 1`` per layer whatever
    the layer's dilation, so with an attention mask a padded take's statistics pool over
    ``sum((kernel - 1) * (dilation - 1))`` padded frames (WavLM-Base-Plus: 6), as
    huggingface/transformers#25476 notes of the TDNN's effect on the mask. A lone take is
    unaffected (its slice ends at the tensor's end), so this keeps the model card's values."""
    pairs = list(zip(model.config.tdnn_kernel, model.config.tdnn_dilation, strict=True))

    def lengths(frames):
        for kernel, dilation in pairs:
            frames = frames - dilation * (kernel - 1)
        return frames

    return lengths


def _float_inputs(module, args):
    """A forward pre-hook: the x-vector head's input in float32."""
    return tuple(a.float() if torch.is_tensor(a) else a for a in args)


def runtime_defaults() -> dict:
    """The speed dials' defaults, as the config schema declares them."""
    from bestofn.schemas import schema

    props = schema("config")["$defs"]["wavlm_speaker_runtime"]["properties"]
    return {key: sub["default"] for key, sub in props.items()}


def check_batching(batching: str) -> str:
    """``runtime.batching``, refused by name where it is not one of BATCHING."""
    if batching not in BATCHING:
        known = ", ".join(BATCHING)
        raise ValueError(f"wavlm-speaker: runtime.batching is {batching!r}; known: {known}")
    return batching


def resolve_precision(device: str, dtype: str | None, precision: str | None) -> str:
    """The body's dtype name: the option ``dtype`` where set, else ``runtime.precision``
    (auto: bfloat16 on CUDA, float32 elsewhere); checked by running its ops on ``device``."""
    if dtype is None:
        precision = precision or runtime_defaults()["precision"]
        if precision not in ("auto", "float32", "bfloat16"):
            raise ValueError(
                f"wavlm-speaker: runtime.precision is {precision!r}; known: auto, float32, bfloat16"
            )
        if precision == "auto":
            precision = "bfloat16" if str(device).startswith("cuda") else "float32"
        dtype = precision
    return resolve_dtype("wavlm-speaker", str(device), dtype, CAST_OPS, "cast")


class SpeakerScorer(Scorer):
    """Config options: ``model_path`` (local microsoft/wavlm-base-plus-sv folder),
    ``dtype`` (optional; part of the group's identity: where set it fixes the body's precision),
    ``cache_dir`` (optional; memoises weight hashes under ``cache_dir/hash-memo``). Runtime:
    ``precision``, ``max_seconds``, ``batch_size``, ``batching`` (the module's docstring; the
    schema holds their defaults)."""

    name = "wavlm-speaker"
    table_weights = (
        "local microsoft/wavlm-base-plus-sv folder (config.json, preprocessor_config.json, weights)"
    )
    table_options = (
        "`model_path`, `dtype`; runtime `precision`, `batch_size`, `max_seconds`, `batching` "
        "(below)"
    )
    columns = {"spk_sim": "DOUBLE", "spk_ref": "VARCHAR"}
    reference_columns = frozenset({"spk_sim"})
    better = {"spk_sim": "higher"}
    input_sample_rate = SAMPLE_RATE  # the pipeline resamples once per group for every 16 kHz scorer

    def __init__(
        self,
        device: str = "cpu",
        model_path: str | None = None,
        dtype: str | None = None,
        cache_dir: str | None = None,
        precision: str | None = None,
        max_seconds: float | None = None,
        batch_size: int | None = None,
        batching: str | None = None,
    ):
        model, fe, folder = load_model(model_path)
        self._setup(model, fe, device, dtype, precision, max_seconds, batch_size, batching)
        self._weight_files = sorted(q for q in folder.iterdir() if q.is_file())
        self._paths = {"model_path": str(folder)}
        self._hash_memo = hash_memo_dir(cache_dir)

    @classmethod
    def from_modules(
        cls,
        model,
        feature_extractor,
        device: str = "cpu",
        dtype: str | None = None,
        precision: str | None = None,
        max_seconds: float | None = None,
        batch_size: int | None = None,
        batching: str | None = None,
    ):
        """Build from objects in memory (``bestofn.fakes.speaker``, tests)."""
        self = cls.__new__(cls)
        self._setup(
            model, feature_extractor, device, dtype, precision, max_seconds, batch_size, batching
        )
        self._weight_files, self._paths, self._hash_memo = [], {"model_path": None}, None
        return self

    def _setup(self, model, fe, device, dtype, precision, max_seconds, batch_size, batching):
        defaults = runtime_defaults()
        self.device = str(device)
        self.dtype = resolve_precision(self.device, dtype, precision)
        self.max_seconds = defaults["max_seconds"] if max_seconds is None else float(max_seconds)
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"wavlm-speaker: runtime.max_seconds must be > 0, got {max_seconds}")
        self.batch_size = int(batch_size or defaults["batch_size"])
        if self.batch_size < 1:
            raise ValueError(f"wavlm-speaker: runtime.batch_size must be >= 1, got {batch_size}")
        self.batching = check_batching(batching or defaults["batching"])
        self.model = model.to(self.device).eval()
        self._cast(self.dtype)
        self._built = (self.dtype, self.batch_size, self.max_seconds, self.batching)
        # a take shorter than this is padded with silence to it, alone (the model cannot
        # embed less; before, such a take was only ever padded beside a longer one)
        self.min_samples = min_samples(model.config)
        self.feature_extractor = fe
        # the front end's per-channel group norm over each take's own frames, and the pooling
        # over each take's own TDNN frames (the docstring)
        self._norm = valid_frame_norm(self.model)
        self.model._get_tdnn_output_lengths = tdnn_lengths(self.model)
        # one embedding per reference voice per worker, keyed by the file's content
        self._references: dict[str, torch.Tensor] = {}

    def _cast(self, dtype: str) -> None:
        """The body in ``dtype``, the head in float32: the layer weights (where the config
        sums the layers), the projector, TDNN and pooling layers; the body's hidden states
        enter the head as float32."""
        self.model.to(getattr(torch, dtype))
        for name in HEAD_MODULES:
            getattr(self.model, name).float()
        if getattr(self.model, "layer_weights", None) is not None:
            self.model.layer_weights.data = self.model.layer_weights.data.float()
        if dtype != "float32" and not getattr(self.model, "_bestofn_head_cast", False):
            self.model.projector.register_forward_pre_hook(_float_inputs)
            self.model._bestofn_head_cast = True
        self.dtype = dtype

    def set_speed(self, precision=None, batch_size=None, max_seconds=None, batching=None) -> None:
        """The speed dials on a built scorer (the lab's variants); each left None goes back to
        the value it was built with. ``max_seconds`` 0: the whole take. Weights cast from
        bfloat16 back to float32 keep bfloat16's rounding: the timings are float32's, the
        values those of rounded weights (build in float32 to compare values)."""
        built = self._built
        dtype = built[0] if precision is None else resolve_precision(self.device, None, precision)
        if dtype != self.dtype:
            self._cast(dtype)
        self.batch_size = built[1] if batch_size is None else int(batch_size)
        self.max_seconds = built[2] if max_seconds is None else (float(max_seconds) or None)
        self.batching = built[3] if batching is None else check_batching(batching)

    def crop(self, clip: np.ndarray) -> np.ndarray:
        """The central ``max_seconds`` of a 16 kHz clip (the whole clip when shorter or unset);
        a clip shorter than the model's minimum, padded with silence to it."""
        if clip.shape[0] < self.min_samples:
            return np.pad(clip, (0, self.min_samples - clip.shape[0]))
        if self.max_seconds is None:
            return clip
        keep = max(1, int(round(self.max_seconds * SAMPLE_RATE)))
        if clip.shape[0] <= keep:
            return clip
        start = (clip.shape[0] - keep) // 2
        return clip[start : start + keep]

    def _forward(self, group: list[np.ndarray]) -> torch.Tensor:
        """[B, D] x-vectors of one batch: each take through the feature extractor alone, then
        padded to the longest and masked (one length: nothing padded)."""
        values = [
            self.feature_extractor(c, sampling_rate=SAMPLE_RATE, return_tensors="pt")[
                "input_values"
            ][0]
            for c in group
        ]
        lengths = [int(v.shape[0]) for v in values]
        batch = torch.zeros(len(values), max(lengths), dtype=torch.float32)
        mask = torch.zeros(len(values), max(lengths), dtype=torch.long)
        for i, v in enumerate(values):
            batch[i, : lengths[i]], mask[i, : lengths[i]] = v, 1
        batch = batch.to(self.device, self.model.dtype)
        conv = self.model.config
        if self._norm is not None:
            k, stride = conv.conv_kernel[0], conv.conv_stride[0]
            self._norm.frames = [(n - k) // stride + 1 for n in lengths]
        try:
            out = self.model(batch, attention_mask=mask.to(self.device))
        finally:
            if self._norm is not None:
                self._norm.frames = None
        return out.embeddings.float()

    @torch.inference_mode()
    def embed(self, clips16k: list[np.ndarray]) -> torch.Tensor:
        """[B, D] unit x-vectors of 16 kHz mono clips, in their order."""
        clips = [self.crop(c) for c in clips16k]
        order = sorted(range(len(clips)), key=lambda i: clips[i].shape[0])
        if self.batching == "padded":  # in order of length: a batch pads to about its own length
            runs = [order]
        else:  # takes of one length together, no padding
            runs = [list(g) for _, g in itertools.groupby(order, key=lambda i: clips[i].shape[0])]
        size = self.batch_size
        batches = [run[k : k + size] for run in runs for k in range(0, len(run), size)]
        embeddings = torch.cat([self._forward([clips[i] for i in idx]) for idx in batches])
        where = torch.tensor([i for idx in batches for i in idx], device=embeddings.device)
        out = torch.empty_like(embeddings)
        out[where] = embeddings  # back in the clips' order
        return F.normalize(out, dim=-1)

    def reference(self, path: str) -> torch.Tensor:
        data = Path(path).read_bytes()
        key = hashlib.sha256(data).hexdigest()
        if key not in self._references:
            audio, _ = load_audio(path, sample_rate=SAMPLE_RATE)
            self._references[key] = self.embed([to_mono(audio)])[0]
        return self._references[key]

    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec):
        # the pipeline hands 16 kHz mono (input_sample_rate); a direct caller may not
        emb = self.embed([resample(to_mono(a), sample_rate, SAMPLE_RATE) for a in audios])
        if spec.reference_audio:
            target, label = self.reference(spec.reference_audio), "reference"
        else:
            target, label = F.normalize(emb.mean(0), dim=0), "group_centroid"
        sims = emb @ target
        return {"spk_sim": [float(s) for s in sims.cpu()], "spk_ref": [label] * len(audios)}

    def provenance(self) -> dict:
        return {
            "backend": self.name,
            **self._paths,
            "weights_sha256": self.weights_sha256(),
            "dtype": self.dtype,
            # the speed dials: each moves spk_sim's last bits (a bestofn ab dial)
            "kernel_path": {
                "precision": self.dtype,
                "head": "float32",
                "batching": self.batching,
                "batch_size": self.batch_size,
                "max_seconds": self.max_seconds,
            },
            "spk_sim": "cos(x-vector, reference voice's) or cos(x-vector, group centroid)",
        }

    def close(self) -> None:
        self.model = None
        self._references.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
