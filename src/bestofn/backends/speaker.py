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
``embeddings`` output, L2-normalised, cosine. Takes are embedded one at a time unless the
feature extractor asks for attention masks (``return_attention_mask``): the base model's first
convolution uses group norm over time, which padding would change.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bestofn.backends.base import Scorer, hash_memo_dir
from bestofn.util.audio import load_audio, resample, to_mono
from bestofn.util.dtypes import resolve_dtype
from bestofn.util.spec import GroupSpec

SAMPLE_RATE = 16000
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
CAST_OPS = ("conv1d", "linear", "layer_norm", "attention")


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


class SpeakerScorer(Scorer):
    """Config options: ``model_path`` (local microsoft/wavlm-base-plus-sv folder),
    ``dtype`` (default float32: the embedding is small and the cosine floor is sensitive;
    bfloat16 on CUDA where asked), ``cache_dir`` (optional; memoises weight hashes under
    ``cache_dir/hash-memo``)."""

    name = "wavlm-speaker"
    table_weights = (
        "local microsoft/wavlm-base-plus-sv folder (config.json, preprocessor_config.json, weights)"
    )
    table_options = "`model_path`, `dtype` (below)"
    columns = {"spk_sim": "DOUBLE", "spk_ref": "VARCHAR"}
    reference_columns = frozenset({"spk_sim"})
    better = {"spk_sim": "higher"}
    input_sample_rate = SAMPLE_RATE  # the pipeline resamples once per group for every 16 kHz scorer

    def __init__(
        self,
        device: str = "cpu",
        model_path: str | None = None,
        dtype: str = "float32",
        cache_dir: str | None = None,
    ):
        model, fe, folder = load_model(model_path)
        self._setup(model, fe, device, dtype)
        self._weight_files = sorted(q for q in folder.iterdir() if q.is_file())
        self._paths = {"model_path": str(folder)}
        self._hash_memo = hash_memo_dir(cache_dir)

    @classmethod
    def from_modules(cls, model, feature_extractor, device: str = "cpu", dtype: str = "float32"):
        """Build from objects in memory (``bestofn.fakes.speaker``, tests)."""
        self = cls.__new__(cls)
        self._setup(model, feature_extractor, device, dtype)
        self._weight_files, self._paths, self._hash_memo = [], {"model_path": None}, None
        return self

    def _setup(self, model, fe, device, dtype):
        self.device = str(device)
        self.dtype = resolve_dtype("wavlm-speaker", self.device, dtype, CAST_OPS, "cast")
        self.model = model.to(self.device, getattr(torch, self.dtype)).eval()
        self.feature_extractor = fe
        self.batched = bool(getattr(fe, "return_attention_mask", False))
        # one embedding per reference voice per worker, keyed by the file's content
        self._references: dict[str, torch.Tensor] = {}

    @torch.inference_mode()
    def embed(self, clips16k: list[np.ndarray]) -> torch.Tensor:
        """[B, D] unit x-vectors of 16 kHz mono clips."""
        groups = [clips16k] if self.batched else [[c] for c in clips16k]
        out = []
        for group in groups:
            inputs = self.feature_extractor(
                group,
                sampling_rate=SAMPLE_RATE,
                padding=True,
                return_tensors="pt",
                return_attention_mask=self.batched,
            )
            values = inputs["input_values"].to(self.device, self.model.dtype)
            mask = inputs.get("attention_mask")
            mask = mask.to(self.device) if mask is not None else None
            out.append(self.model(values, attention_mask=mask).embeddings.float())
        return F.normalize(torch.cat(out), dim=-1)

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
            "batched": self.batched,
            "spk_sim": "cos(x-vector, reference voice's) or cos(x-vector, group centroid)",
        }

    def close(self) -> None:
        self.model = None
        self._references.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
