"""VoiceCLAP (laion/voiceclap-commercial): genuineness, vocal-burst blend and prompt similarity
from ONE audio embedding per take.

Established from public sources (docs/notes/scorers-facts.md names them):

- the embedder is a dual-tower CLAP of about 113 M parameters: a BUD-E-Whisper (Whisper-small
  style) audio tower, 12 layers of width 768 on 80 mels at 16 kHz, in 30-s chunks, mean-pooled,
  MLP-projected to 768 and L2-normalised (chunks averaged); a MiniLM-L6 text tower (384 wide),
  mean-pooled, projected 384 -> 576 -> 768. It loads through the checkpoint's own remote code,
  ``AutoModel.from_pretrained(dir, trust_remote_code=True)``, from the published file set:
  config.json (``model_type: voiceclap-small``), configuration_voiceclap.py,
  modeling_voiceclap.py, model.safetensors, preprocessor_config.json (WhisperFeatureExtractor),
  tokenizer.json, tokenizer_config.json (a BERT tokenizer). The model computes its own log-mel
  (``compute_log_mel``, from its ``mel_filters`` buffer).
- its API, as LAION's code calls it: ``encode_waveform(wav[B, S] at 16 kHz)`` and
  ``encode_text(input_ids, attention_mask)`` with the folder's tokenizer.
- genuineness (0-6) and blend (0-10) heads are ``torch.save`` dicts: ``arch``, ``state_dict``
  with ``f1`` / ``f2`` (Linear(768, H) -> GELU -> Linear(H, 1)), ``mu`` / ``sd`` to standardise
  the embedding; the output is clamped to the label range. Published files:
  ``genu_commercial_best.pt``, ``blend_head_commercial.pt``.
- which embedding each head reads (LAION-AI/laion-moss-local-1.5-voice-acting-4.55b
  SYNTHETIC_DATA_RECIPE.md section 5: "blend head standardised-raw, genu head
  L2-normalised-standardised"): the blend head standardises the embedding as
  ``encode_waveform`` returns it, the genuineness head the L2-normalised embedding. Whether the
  published ``encode_waveform`` normalises is not known (were it to, the two are the same).

UNKNOWN (the published ``modeling_voiceclap.py`` is not in any public source we could read):
the key names inside the towers and the audio projection's hidden width. This loader does not
depend on them: the checkpoint's own code reads its own keys. It refuses a folder whose weights
leave any of the model's parameters unset (from_pretrained's missing keys).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bestofn.backends.base import Scorer, hash_memo_dir
from bestofn.util.audio import resample, to_mono
from bestofn.util.dtypes import resolve_dtype
from bestofn.util.spec import GroupSpec

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {
    "voiceclap": {
        "role": "scorer",
        "class": "VoiceCLAPScorer",
        "preload": ("transformers:AutoModel",),
        "preload_rank": 40,
    }
}
# laion/voiceclap-commercial (remote code + safetensors); its two heads come from
# laion/voiceclap-commercial-genuineness and laion/voiceclap-commercial-vocalburst-blend and land
# in one folder, voiceclap-heads (docs/notes/scorers-facts.md)
PUBLISHED_WEIGHTS = (
    {
        "name": "voiceclap",
        "repo_id": "laion/voiceclap-commercial",
        "revision": "unknown",
        "allow_patterns": ("*.json", "*.py", "*.safetensors", "*.txt"),
        "folder": "voiceclap-commercial",
        "note": "110M dual-tower CLAP, loaded through its remote code",
    },
    {
        "name": "voiceclap-genuineness",
        "repo_id": "laion/voiceclap-commercial-genuineness",
        "revision": "unknown",
        "allow_patterns": ("genu_commercial_best.pt",),
        "folder": "voiceclap-heads",
    },
    {
        "name": "voiceclap-blend",
        "repo_id": "laion/voiceclap-commercial-vocalburst-blend",
        "revision": "unknown",
        "allow_patterns": ("blend_head_commercial.pt",),
        "folder": "voiceclap-heads",
    },
)

SAMPLE_RATE = 16000
WINDOW_SAMPLES = 30 * SAMPLE_RATE
GENUINENESS_RANGE = (0.0, 6.0)
BLEND_RANGE = (0.0, 10.0)
# What runs under autocast: a Whisper-style audio tower and a BERT-style text tower.
AUTOCAST_OPS = ("conv1d", "linear", "layer_norm", "attention", "embedding")


# The published folder's files (LAION's scorer setup fetches exactly these for the encoder).
MODEL_FILES = (
    "config.json",
    "configuration_voiceclap.py",
    "modeling_voiceclap.py",
    "model.safetensors",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
MODEL_TYPE = "voiceclap-small"


class WeightsError(ValueError):
    """A weights path named in config is missing, unreadable, or not in the expected layout."""


# ---------------------------------------------------------------------------------------------
# the two regression heads


class RegressionHead(nn.Module):
    """(e - mu) / sd -> Linear -> GELU -> Dropout -> Linear -> clamp to the label range."""

    def __init__(self, state_dict: dict, mu, sd, value_range: tuple[float, float]):
        super().__init__()
        hidden, dim = state_dict["f1.weight"].shape
        # float32 whatever torch's default dtype is (the head runs on float32 embeddings)
        self.f1 = nn.Linear(dim, hidden, dtype=torch.float32)
        self.f2 = nn.Linear(hidden, 1, dtype=torch.float32)
        self.load_state_dict(state_dict)
        self.register_buffer("mu", torch.as_tensor(np.asarray(mu, np.float32)).reshape(-1))
        self.register_buffer("sd", torch.as_tensor(np.asarray(sd, np.float32)).reshape(-1))
        self.lo, self.hi = value_range

    def forward(self, emb: torch.Tensor) -> torch.Tensor:  # [B, D] -> [B]
        x = (emb.float() - self.mu) / self.sd
        return self.f2(F.gelu(self.f1(x))).squeeze(-1).clamp(self.lo, self.hi)


def _head_file(path: str | None, field: str) -> Path:
    if not path:
        raise WeightsError(f"voiceclap: config option {field!r} is not set")
    p = Path(path).expanduser()
    if p.is_dir():  # a downloaded model repo: take its single head checkpoint
        found = sorted(q for q in p.iterdir() if q.suffix in (".pt", ".pth") and q.is_file())
        if len(found) != 1:
            raise WeightsError(
                f"voiceclap: {field} {str(p)!r} holds {len(found)} head files "
                f"({[q.name for q in found]}); name the file itself in config option {field!r}"
            )
        p = found[0]
    if not p.is_file():
        raise WeightsError(
            f"voiceclap: {field} {str(p)!r} does not exist (config option {field!r})"
        )
    return p


def load_regression_head(path: str | None, field: str, value_range) -> tuple[RegressionHead, Path]:
    p = _head_file(path, field)
    try:
        ck = torch.load(p, map_location="cpu", weights_only=True)
    except Exception:
        # the published heads keep mu/sd as numpy arrays, which only the full unpickler reads
        try:
            ck = torch.load(p, map_location="cpu", weights_only=False)
        except Exception as e:
            raise WeightsError(
                f"voiceclap: cannot read {str(p)!r} (config option {field!r}): {e}"
            ) from e
    if not isinstance(ck, dict) or not {"state_dict", "mu", "sd"} <= set(ck):
        keys = sorted(ck) if isinstance(ck, dict) else type(ck).__name__
        raise WeightsError(
            f"voiceclap: {str(p)!r} (config option {field!r}) is not a head checkpoint "
            f"with state_dict/mu/sd; found {keys}"
        )
    sd = {k.replace("_orig_mod.", ""): v for k, v in ck["state_dict"].items()}
    if set(sd) != {"f1.weight", "f1.bias", "f2.weight", "f2.bias"}:
        raise WeightsError(f"voiceclap: {str(p)!r} is not an f1/f2 MLP head: keys {sorted(sd)}")
    if sd["f2.weight"].shape[0] != 1:
        raise WeightsError(
            f"voiceclap: {str(p)!r} has {sd['f2.weight'].shape[0]} outputs, expected 1"
        )
    dim = sd["f1.weight"].shape[1]
    if np.asarray(ck["mu"]).size != dim or np.asarray(ck["sd"]).size != dim:
        raise WeightsError(f"voiceclap: {str(p)!r} mu/sd do not have the embedding width {dim}")
    return RegressionHead(sd, ck["mu"], ck["sd"], value_range), p


# ---------------------------------------------------------------------------------------------
# the embedder (the checkpoint's own remote code)


def load_embedder(path: str | None, field: str = "model_path"):
    """(model, tokenizer, folder): the checkpoint's remote code on its weights, every file of
    the published set checked first and named when missing."""
    if not path:
        raise WeightsError(f"voiceclap: config option {field!r} is not set")
    p = Path(path).expanduser()
    if not p.is_dir():
        raise WeightsError(f"voiceclap: {field} {str(p)!r} is not a directory")
    for name in MODEL_FILES:
        if not (p / name).is_file():
            raise WeightsError(f"voiceclap: {str(p / name)!r} is missing ({field})")
    import json

    try:
        model_type = json.loads((p / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise WeightsError(f"voiceclap: cannot read {str(p / 'config.json')!r}: {e}") from e
    if model_type != MODEL_TYPE:
        raise WeightsError(
            f"voiceclap: {str(p / 'config.json')!r} has model_type {model_type!r}, "
            f"expected {MODEL_TYPE!r}"
        )
    from transformers import AutoModel, AutoTokenizer

    weights = p / "model.safetensors"
    try:
        # float32 weights: reduced precision is applied with autocast at run time, so the remote
        # code's own preprocessing (waveform -> mel) keeps full precision whatever it does inside
        model, info = AutoModel.from_pretrained(
            p, trust_remote_code=True, dtype=torch.float32, output_loading_info=True
        )
    except Exception as e:
        raise WeightsError(
            f"voiceclap: cannot load the VoiceCLAP remote-code model from {str(p)!r} "
            f"(config option {field!r}; model.safetensors, modeling_voiceclap.py): {e}"
        ) from e
    missing = sorted(info.get("missing_keys") or [])
    if missing:  # from_pretrained would leave these at random values
        raise WeightsError(
            f"voiceclap: {str(weights)!r} lacks {len(missing)} of the model's weights, "
            f"e.g. {missing[:4]}"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(p, trust_remote_code=True)  # no prompt
    except Exception as e:
        raise WeightsError(
            f"voiceclap: cannot load the tokenizer from {str(p / 'tokenizer.json')!r}: {e}"
        ) from e
    check_embedder_api(model, str(p))
    return model, tokenizer, p


def check_embedder_api(model, where: str) -> None:
    missing = [
        m for m in ("encode_waveform", "encode_text") if not callable(getattr(model, m, None))
    ]
    if missing:
        raise WeightsError(
            f"voiceclap: the model at {where} has no {missing}; this loader understands a "
            "VoiceCLAP checkpoint exposing encode_waveform(wav) and "
            "encode_text(input_ids, attention_mask)"
        )


def _raw_embedding(out) -> torch.Tensor:
    """Whatever the remote code returns -> [B, D] float32, as returned (not normalised)."""
    if isinstance(out, (tuple, list)):
        out = out[0]
    if hasattr(out, "last_hidden_state"):
        out = out.last_hidden_state.mean(1)
    return out.reshape(out.shape[0], -1).float()


def _as_embedding(out) -> torch.Tensor:
    """Whatever the remote code returns -> [B, D] float32, L2-normalised (the joint space)."""
    return F.normalize(_raw_embedding(out), dim=-1)


def _to_window(audio: np.ndarray, sample_rate: int, window: int) -> np.ndarray:
    a = resample(to_mono(audio), sample_rate, SAMPLE_RATE)[:window]
    return np.pad(a, (0, window - a.size))


# ---------------------------------------------------------------------------------------------
# the scorer


class VoiceCLAPScorer(Scorer):
    """Config options: ``model_path`` (local voiceclap-commercial folder: remote code, weights,
    tokenizer),
    ``genuineness_path`` / ``blend_path`` (head ``.pt`` file, or a directory holding exactly one),
    ``batch_size`` (default 32), ``dtype`` of the embedder (default bfloat16 on CUDA, float32 on
    CPU; applied with autocast on the device; float32, logged, where the device cannot run
    it), ``window_s`` (default 30, as the heads were fitted),
    ``cache_dir`` (optional; memoises weight hashes under ``cache_dir/hash-memo``).

    ``vc_prompt_sim`` = cos(audio, text(emotion_description)), minus cos(audio,
    text(negative_description)) when a negative text is given; an empty description falls back
    to the emotion's name.
    """

    name = "voiceclap"
    table_weights = "local laion/voiceclap-commercial folder"
    table_options = "`model_path`, `genuineness_path`, `blend_path` (below)"
    columns = {"vc_genuineness": "DOUBLE", "vc_blend": "DOUBLE", "vc_prompt_sim": "DOUBLE"}
    better = {"vc_genuineness": "higher", "vc_prompt_sim": "higher"}  # vc_blend: no direction
    input_sample_rate = SAMPLE_RATE  # the pipeline resamples once per group for every 16 kHz scorer

    def __init__(
        self,
        device: str = "cpu",
        model_path: str | None = None,
        genuineness_path: str | None = None,
        blend_path: str | None = None,
        batch_size: int = 32,
        dtype: str | None = None,
        window_s: float = 30.0,
        cache_dir: str | None = None,
    ):
        dtype = dtype or ("bfloat16" if str(device).startswith("cuda") else "float32")
        genu, genu_file = load_regression_head(
            genuineness_path, "genuineness_path", GENUINENESS_RANGE
        )
        blend, blend_file = load_regression_head(blend_path, "blend_path", BLEND_RANGE)
        model, tokenizer, model_dir = load_embedder(model_path)
        self._setup(model, tokenizer, genu, blend, device, dtype, batch_size, window_s)
        self._weight_files = [genu_file, blend_file] + sorted(
            q for q in model_dir.iterdir() if q.is_file()
        )
        self._paths = {
            "model_path": str(model_dir),
            "genuineness_path": str(genu_file),
            "blend_path": str(blend_file),
        }
        self._hash_memo = hash_memo_dir(cache_dir)

    @classmethod
    def from_modules(
        cls,
        model,
        tokenizer,
        genuineness: RegressionHead,
        blend: RegressionHead,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 32,
        window_s: float = 30.0,
    ) -> VoiceCLAPScorer:
        """Build from objects in memory (``bestofn.fakes.voiceclap``, tests)."""
        check_embedder_api(model, type(model).__name__)
        self = cls.__new__(cls)
        self._setup(model, tokenizer, genuineness, blend, device, dtype, batch_size, window_s)
        self._weight_files, self._paths, self._hash_memo = [], {}, None
        return self

    def _setup(self, model, tokenizer, genu, blend, device, dtype, batch_size, window_s):
        self.device, self.batch_size = str(device), int(batch_size)
        # reduced precision only where this device runs every op under autocast; else float32
        self.dtype = resolve_dtype("voiceclap", self.device, dtype, AUTOCAST_OPS)
        self.window = int(round(window_s * SAMPLE_RATE))
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.genuineness = genu.to(self.device).eval()
        self.blend = blend.to(self.device).eval()
        self._text_cache: dict[str, torch.Tensor] = {}

    @torch.inference_mode()
    def embed_audio_raw(self, clips16k: list[np.ndarray]) -> torch.Tensor:
        """One encode for a batch of windowed 16 kHz clips -> [B, D] as the model returns it."""
        wav = torch.from_numpy(np.stack(clips16k)).to(self.device)
        with self._autocast():
            return _raw_embedding(self.model.encode_waveform(wav, sample_rate=SAMPLE_RATE))

    def embed_audio(self, clips16k: list[np.ndarray]) -> torch.Tensor:
        """One encode for a batch of windowed 16 kHz clips -> [B, D] unit vectors."""
        return F.normalize(self.embed_audio_raw(clips16k), dim=-1)

    def _autocast(self):
        if self.dtype == "float32":
            return contextlib.nullcontext()
        kind = torch.device(self.device).type
        return torch.autocast(kind, dtype=getattr(torch, self.dtype))

    @torch.inference_mode()
    def embed_text(self, text: str) -> torch.Tensor:
        """[D] unit vector; a group's direction texts are encoded once per worker, not per take."""
        if text not in self._text_cache:
            enc = self.tokenizer([text], padding=True, truncation=True, return_tensors="pt")
            ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
            with self._autocast():
                self._text_cache[text] = _as_embedding(self.model.encode_text(ids, mask))[0]
        return self._text_cache[text]

    @torch.inference_mode()
    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec) -> dict[str, list]:
        want = self.embed_text(spec.emotion_description or spec.emotion)
        avoid = self.embed_text(spec.negative_description) if spec.negative_description else None
        out: dict[str, list] = {c: [] for c in self.columns}
        clips = [_to_window(a, sample_rate, self.window) for a in audios]
        for i in range(0, len(clips), self.batch_size):
            raw = self.embed_audio_raw(clips[i : i + self.batch_size])
            emb = F.normalize(raw, dim=-1)
            sim = emb @ want
            if avoid is not None:
                sim = sim - emb @ avoid
            # each head reads the embedding its authors trained it on (LAION's recipe section
            # 5): genuineness the L2-normalised one, blend the raw one, each then standardised
            # by the head's own mu / sd; the three columns in one device-to-host copy (float32
            # holds each value exactly)
            genuineness, blend, sim = torch.stack(
                [self.genuineness(emb).float(), self.blend(raw).float(), sim.float()]
            ).tolist()
            out["vc_genuineness"] += genuineness
            out["vc_blend"] += blend
            out["vc_prompt_sim"] += sim
        return out

    def provenance(self) -> dict:
        return {
            "backend": self.name,
            **self._paths,
            "weights_sha256": self.weights_sha256(),
            "dtype": self.dtype,
            "window_samples": self.window,
            "head_inputs": "genuineness: L2-normalised embedding; blend: raw embedding",
            "prompt_sim": "cos(audio, emotion_description or emotion) "
            "- cos(audio, negative_description)",
        }

    def close(self) -> None:
        self.model = None
        self._text_cache.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
