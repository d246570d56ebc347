"""Empathic-Insight-Voice-Plus: every emotion and quality head on one BUD-E-Whisper encoder pass.

Published layout (laion/Empathic-Insight-Voice-Plus; sources in docs/notes/scorers-facts.md):

- encoder: laion/BUD-E-Whisper, a Whisper-Small fine-tune. 16 kHz mono, padded/cut to a 30 s
  window, encoder states [B, 1500, 768].
- one ``model_<Name>_best.pth`` per head, a plain state dict (keys may carry ``_orig_mod.`` from
  torch.compile): ``proj.{weight,bias}`` then ``mlp.<i>.{weight,bias}`` for the Linear layers of
  ``[ReLU, Dropout, Linear(64,64), ReLU, Dropout, Linear(64,32), ..., Linear(16,1)]``.
- emotion/attribute heads read the flattened states (1500*768 inputs, ~74M params each); the four
  quality heads read pooled states: cat(mean, min, max, std) over time (4*768 = 3072 inputs).

We never hard-code head names: the heads directory is listed, each head's kind is read off the
width of its ``proj.weight``, and heads of the same kind and shape are stacked so that the first
layer of all of them is one matmul (the only expensive part: x[B, 1.15M] @ W[H*64, 1.15M]^T) and the
small layers run as one batched einsum.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from bestofn.backends.base import Scorer, hash_memo_dir
from bestofn.util.audio import resample, to_mono
from bestofn.util.dtypes import resolve_dtype
from bestofn.util.spec import GroupSpec

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {
    "empathic-insight": {
        "role": "scorer",
        "class": "EmpathicInsightScorer",
        "preload": ("transformers:WhisperFeatureExtractor,WhisperModel",),
        "preload_rank": 10,
    }
}
# laion/BUD-E-Whisper (encoder) + laion/Empathic-Insight-Voice-Plus (59 model_<Name>_best.pth
# heads, 55 of them 295 MB: 55 * 295 MB is the size below), docs/notes/scorers-facts.md
PUBLISHED_WEIGHTS = (
    {
        "name": "bud-e-whisper",
        "repo_id": "laion/BUD-E-Whisper",
        "revision": "unknown",
        "allow_patterns": ("*.json", "*.txt", "*.safetensors"),
        "folder": "BUD-E-Whisper",
        "note": "a Whisper-Small fine-tune (the encoder)",
    },
    {
        "name": "empathic-insight",
        "repo_id": "laion/Empathic-Insight-Voice-Plus",
        "revision": "unknown",
        "allow_patterns": ("model_*_best.pth",),
        "folder": "Empathic-Insight-Voice-Plus",
        "size_bytes": 16_225_000_000,
        "note": (
            "59 heads; the 55 full-sequence ones are 295 MB each (HF file pages), the 4 pooled "
            "quality heads are small (size not stated: the total is a lower bound)"
        ),
    },
)

SAMPLE_RATE = 16000
HEAD_SUFFIXES = (".pth", ".pt")


class WeightsError(ValueError):
    """A weights path named in config is missing, unreadable, or not in the expected layout."""


# ---------------------------------------------------------------------------------------------
# head files: discovery, parsing, validation


def head_name(path: Path) -> str:
    """``model_Jealousy_&_Envy_best.pth`` -> ``Jealousy_&_Envy`` (the published naming)."""
    stem = path.stem
    if stem.startswith("model_"):
        stem = stem[len("model_") :]
    if stem.endswith("_best"):
        stem = stem[: -len("_best")]
    return stem


def _normalised(name: str) -> str:
    """Case, spaces, underscores, punctuation folded: ``Jealousy & Envy`` -> ``jealousy_envy``."""
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


def column_name(name: str, prefix: str) -> str:
    """A SQL-friendly column: ``Jealousy_&_Envy`` -> ``ei_jealousy_envy``."""
    return prefix + _normalised(name)


# The quality heads' published names start with this; every other head file is an emotion or
# attribute head (the file naming does not tell emotions from attributes such as Gender).
QUALITY_PREFIX = "score_"
TARGET = "target"  # the ``<prefix>target`` column: the group's own emotion's head


def head_files(heads_dir: Path) -> list[Path]:
    """The head files of a heads folder (``*.pth``, ``*.pt``), sorted."""
    return sorted(p for p in heads_dir.iterdir() if p.suffix in HEAD_SUFFIXES and p.is_file())


def emotion_head_names(heads_path) -> list[str]:
    """The emotion (and attribute) heads in a heads folder, by the published file naming
    ``model_<Name>_best.pth``, less the ``score_*`` quality heads. Reads names only."""
    heads_dir = _existing_dir(str(heads_path) if heads_path else None, "heads_path")
    return [n for n in map(head_name, head_files(heads_dir)) if not n.startswith(QUALITY_PREFIX)]


def resolve_head(emotion: str, ei_head: str | None, heads: list[str]) -> str | None:
    """The head that scores a group's own emotion: the sheet's ``ei_head`` when it gives one,
    else the emotion's name; matched to a head name with case, spaces, underscores and
    punctuation folded (``jealousy & envy`` -> ``Jealousy_&_Envy``). None when no head matches."""
    by_key = {_normalised(h): h for h in heads}
    want = ei_head if ei_head is not None and str(ei_head).strip() else emotion
    return by_key.get(_normalised(str(want))) if want else None


def load_head_state(path: Path, field: str = "heads_path") -> dict[str, torch.Tensor]:
    """Read one head's state dict, stripping torch.compile's ``_orig_mod.`` prefix."""
    try:
        # mmap: 55 heads x 295 MB are read page by page while being stacked, never all at once
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        sd = None  # legacy (non-zip) torch files cannot be mapped; read those whole
    try:
        if sd is None:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated file, not a torch file, pickled code...
        raise WeightsError(
            f"empathic-insight: cannot read head file {str(path)!r} (config option {field!r}): {e}"
        ) from e
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise WeightsError(
            f"empathic-insight: {str(path)!r} (config option {field!r}) is not a state dict "
            "of tensors"
        )
    return OrderedDict((k.replace("_orig_mod.", ""), v) for k, v in sd.items())


def head_layers(sd: dict[str, torch.Tensor], where: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (weight, bias) of every Linear in forward order: proj, then mlp.<i> by index.

    Checks the published layout: the chain of widths connects and ends in one output.
    """
    if "proj.weight" not in sd or "proj.bias" not in sd:
        raise WeightsError(
            f"empathic-insight: {where} is not in the proj/mlp layout (no proj.weight/proj.bias); "
            f"keys: {list(sd)[:8]}"
        )
    mlp_idx = sorted({int(m.group(1)) for k in sd if (m := re.fullmatch(r"mlp\.(\d+)\.weight", k))})
    expected = {"proj.weight", "proj.bias"} | {
        f"mlp.{i}.{p}" for i in mlp_idx for p in ("weight", "bias")
    }
    if set(sd) != expected:
        raise WeightsError(
            f"empathic-insight: {where} is not in the proj/mlp layout: unexpected keys "
            f"{sorted(set(sd) - expected)}, missing {sorted(expected - set(sd))}"
        )
    layers = [(sd["proj.weight"], sd["proj.bias"])]
    layers += [(sd[f"mlp.{i}.weight"], sd[f"mlp.{i}.bias"]) for i in mlp_idx]
    for (w_prev, _), (w, _b) in zip(layers[:-1], layers[1:], strict=True):
        if w.shape[1] != w_prev.shape[0]:
            raise WeightsError(
                f"empathic-insight: {where} layer widths do not chain: {w_prev.shape} -> {w.shape}"
            )
    if layers[-1][0].shape[0] != 1:
        raise WeightsError(
            f"empathic-insight: {where} ends in {layers[-1][0].shape[0]} outputs, not 1"
        )
    for w, b in layers:
        if b.shape != (w.shape[0],):
            raise WeightsError(
                f"empathic-insight: {where} bias {tuple(b.shape)} does not fit "
                f"weight {tuple(w.shape)}"
            )
    return layers


def pool_states(states: torch.Tensor) -> torch.Tensor:
    """[B, T, D] -> [B, 4D]: mean, min, max, std over time (std unbiased, as published)."""
    s = states.float()
    return torch.cat([s.mean(1), s.amin(1), s.amax(1), s.std(1)], dim=1)


class StackedHeads(nn.Module):
    """Heads with identical layer shapes, run together.

    Layer 0 of all H heads is one matmul against the row-stacked weights [H*P, in]; the remaining
    small layers are batched per head with einsum over stacked [H, out, in] weights.
    """

    def __init__(self, per_head: list[list[tuple[torch.Tensor, torch.Tensor]]], dtype, device):
        super().__init__()
        self.n_heads = len(per_head)
        self.proj_dim = per_head[0][0][0].shape[0]
        # stack one head at a time straight into the target dtype on the target device: the fp32
        # copies of 55 full-sequence heads would be 16 GB, the bf16 stack is 8 GB (and the head
        # files are memory-mapped, so the host never holds them all)
        first = per_head[0][0][0]
        w0 = torch.empty((self.n_heads * self.proj_dim, first.shape[1]), dtype=dtype, device=device)
        for i, layers in enumerate(per_head):
            w0[i * self.proj_dim : (i + 1) * self.proj_dim].copy_(layers[0][0])
        self.w0 = nn.Parameter(w0, requires_grad=False)
        self.b0 = nn.Parameter(
            torch.cat([layers[0][1] for layers in per_head]).to(device, dtype), requires_grad=False
        )
        self.ws = nn.ParameterList(
            nn.Parameter(
                torch.stack([layers[j][0] for layers in per_head]).to(device, dtype),
                requires_grad=False,
            )
            for j in range(1, len(per_head[0]))
        )
        self.bs = nn.ParameterList(
            nn.Parameter(
                torch.stack([layers[j][1] for layers in per_head]).to(device, dtype),
                requires_grad=False,
            )
            for j in range(1, len(per_head[0]))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, in] -> [B, H]
        x = x.to(self.w0.dtype)
        h = torch.addmm(self.b0, x, self.w0.T).view(x.shape[0], self.n_heads, self.proj_dim)
        for w, b in zip(self.ws, self.bs, strict=True):
            h = torch.einsum("bhi,hoi->bho", torch.relu(h), w) + b
        return h.squeeze(-1).float()


# ---------------------------------------------------------------------------------------------
# the scorer


def _default_dtype(device: str) -> str:
    return "bfloat16" if str(device).startswith("cuda") else "float32"


# What runs with weights cast to the dtype: the Whisper encoder and the MLP heads.
CAST_OPS = ("conv1d", "linear", "layer_norm", "attention")


def _dtype(device: str, dtype: str | None) -> str:
    """The asked dtype where this device runs it, else float32 (logged)."""
    want = dtype or _default_dtype(device)
    return resolve_dtype("empathic-insight", device, want, CAST_OPS, "cast")


def _to_mono_16k(audio: np.ndarray, sample_rate: int, max_samples: int) -> np.ndarray:
    return resample(to_mono(audio), sample_rate, SAMPLE_RATE)[:max_samples]


class EmpathicInsightScorer(Scorer):
    """One column per discovered head (emotions, attributes, quality scores), all from one encode,
    and ``ei_target``: the head of the group's own emotion (``resolve_head``: the emotion sheet's
    ``ei_head`` column, else the emotion's name), NaN when the emotion maps to no head.

    Config options: ``encoder_path`` (local BUD-E-Whisper directory: config.json, weights,
    preprocessor_config.json), ``heads_path`` (directory with the ``*.pth`` head files),
    ``batch_size`` (default 32), ``dtype`` (default bfloat16 on CUDA, float32 on CPU),
    ``column_prefix`` (default ``ei_``), ``cache_dir`` (optional; memoises the weight hashes under
    ``cache_dir/hash-memo`` so later worker starts skip re-hashing ~17 GB).
    """

    name = "empathic-insight"
    table_weights = "local BUD-E-Whisper encoder + head directory"
    table_options = "`encoder_path`, `heads_path`, `batch_size`, `dtype` (below)"
    dynamic_columns = True  # one column per head file found in heads_path
    # the four quality heads (score_overall_quality...): more is better; emotion heads measure
    # how much of an emotion a take carries, which has no better side (with the default prefix);
    # ei_target is the group's own emotion: more of it is the acting asked for
    better = {"ei_score_*": "higher", "ei_target": "higher"}
    input_sample_rate = SAMPLE_RATE  # the pipeline resamples once per group for every 16 kHz scorer
    emotion_heads = True

    @classmethod
    def planned_columns(cls, options: dict) -> dict[str, str] | None:
        """One column per head file in ``heads_path`` and the group's own emotion's
        (``<prefix>target``), from the files' names; None without a heads folder."""
        heads = Path(options.get("heads_path") or "").expanduser()
        if not options.get("heads_path") or not heads.is_dir():
            return None
        prefix = options.get("column_prefix", "ei_")
        names = [head_name(p) for p in head_files(heads)] + [TARGET]
        return {column_name(n, prefix): "DOUBLE" for n in names}

    @classmethod
    def check_plan(cls, options: dict, groups: dict, selection_uses, sheet, base):
        """The selection reads ``<prefix>target``, the head of each group's own emotion: an
        emotion that maps to no head is an error, naming it and the heads found in
        ``heads_path``; where the selection does not read it, a note."""
        column = column_name(TARGET, options.get("column_prefix", "ei_"))
        heads_path = options.get("heads_path")
        path = Path(heads_path or "").expanduser()
        path = path if path.is_absolute() else Path(base) / path
        if not heads_path or not path.is_dir():
            return [], []  # the plan's check_models names a missing weights path
        heads = emotion_head_names(path)
        emotions = {spec.emotion: spec.extra.get("ei_head") for spec in groups.values()}
        unmapped = sorted(e for e, h in emotions.items() if resolve_head(e, h, heads) is None)
        if not unmapped:
            return [], []
        where = (
            f"{sheet}: emotion(s) {', '.join(unmapped)} map to no Empathic-Insight head "
            f"(by the sheet's ei_head, else the emotion's name); heads in {heads_path}: "
            f"{', '.join(heads)}"
        )
        if selection_uses(column):
            return [f"{where}. The selection uses {column}: name the head in ei_head"], []
        return [], [f"note: {where}. Their {column} is NaN (the selection does not use it)"]

    def __init__(
        self,
        device: str = "cpu",
        encoder_path: str | None = None,
        heads_path: str | None = None,
        batch_size: int = 32,
        dtype: str | None = None,
        column_prefix: str = "ei_",
        cache_dir: str | None = None,
    ):
        from transformers import WhisperFeatureExtractor, WhisperModel

        enc_dir = _existing_dir(encoder_path, "encoder_path")
        heads_dir = _existing_dir(heads_path, "heads_path")
        dtype = _dtype(device, dtype)
        torch_dtype = getattr(torch, dtype)
        try:
            feature_extractor = WhisperFeatureExtractor.from_pretrained(enc_dir)
            whisper = WhisperModel.from_pretrained(
                enc_dir, dtype=torch_dtype, attn_implementation="sdpa"
            )
        except Exception as e:
            raise WeightsError(
                f"empathic-insight: cannot load a Whisper encoder from {str(enc_dir)!r} "
                f"(config option 'encoder_path'): {e}"
            ) from e

        files = head_files(heads_dir)
        if not files:
            raise WeightsError(
                f"empathic-insight: no head files (*.pth, *.pt) in {str(heads_dir)!r} "
                "(config option 'heads_path')"
            )
        heads = {head_name(p): load_head_state(p) for p in files}
        self._setup(
            whisper.get_encoder(),
            feature_extractor,
            heads,
            device,
            dtype,
            batch_size,
            column_prefix,
        )
        self._weight_files = sorted(p for p in enc_dir.iterdir() if p.is_file()) + files
        self._paths = {"encoder_path": str(enc_dir), "heads_path": str(heads_dir)}
        self._hash_memo = hash_memo_dir(cache_dir)

    @classmethod
    def from_modules(
        cls,
        encoder,
        feature_extractor,
        heads: dict,
        device: str = "cpu",
        dtype: str | None = None,
        batch_size: int = 32,
        column_prefix: str = "ei_",
    ) -> EmpathicInsightScorer:
        """Build from objects in memory (``bestofn.fakes.empathic``, tests); heads: name ->
        state dict."""
        self = cls.__new__(cls)
        self._setup(
            encoder,
            feature_extractor,
            heads,
            device,
            dtype or _default_dtype(device),
            batch_size,
            column_prefix,
        )
        self._weight_files, self._paths = [], {"encoder_path": None, "heads_path": None}
        self._hash_memo = None
        return self

    def _setup(self, encoder, feature_extractor, heads, device, dtype, batch_size, column_prefix):
        self.device = str(device)
        self.dtype = dtype = _dtype(self.device, dtype)
        self.batch_size = int(batch_size)
        self.feature_extractor = feature_extractor
        self.encoder = encoder.to(self.device, getattr(torch, dtype)).eval()
        seq_len = encoder.config.max_source_positions
        d_model = encoder.config.d_model
        # the window the encoder was built for: Whisper pads every clip to it (30 s for BUD-E)
        self.max_samples = feature_extractor.n_samples
        if feature_extractor.nb_max_frames != 2 * seq_len:
            raise WeightsError(
                f"empathic-insight: feature extractor gives {feature_extractor.nb_max_frames} "
                f"frames, encoder expects {2 * seq_len}"
            )
        widths = {seq_len * d_model: "flat", 4 * d_model: "pooled"}

        # group heads by what they read and by their layer shapes; each group is one StackedHeads
        groups: dict[tuple, list[str]] = {}
        layers_of: dict[str, list] = {}
        for name, sd in heads.items():
            layers = head_layers(sd, f"head {name!r}")
            kind = widths.get(layers[0][0].shape[1])
            if kind is None:
                raise WeightsError(
                    f"empathic-insight: head {name!r} reads {layers[0][0].shape[1]} inputs; this "
                    f"encoder gives {seq_len}x{d_model}={seq_len * d_model} (flattened) or "
                    f"{4 * d_model} (pooled)"
                )
            layers_of[name] = layers
            groups.setdefault((kind, tuple(tuple(w.shape) for w, _ in layers)), []).append(name)
        torch_dtype = getattr(torch, dtype)
        self.groups = [
            (
                kind,
                names,
                StackedHeads([layers_of[n] for n in names], torch_dtype, self.device),
            )
            for (kind, _), names in sorted(groups.items())
        ]
        self.head_kind = {n: kind for kind, names, _ in self.groups for n in names}
        self.column_of = {n: column_name(n, column_prefix) for n in heads}
        if len(set(self.column_of.values())) != len(self.column_of):
            raise WeightsError(
                f"empathic-insight: head names collide as columns: {sorted(self.column_of)}"
            )
        self.target_column = column_name(TARGET, column_prefix)
        if self.target_column in self.column_of.values():
            raise WeightsError(
                f"empathic-insight: a head named {TARGET!r} collides with the "
                f"{self.target_column!r} column (the group's own emotion)"
            )
        self.emotion_heads = sorted(n for n in heads if not n.startswith(QUALITY_PREFIX))
        # instance attribute: the heads (hence columns) are only known once the directory is read
        self.columns = {self.column_of[n]: "DOUBLE" for n in sorted(heads)}
        self.columns[self.target_column] = "DOUBLE"

    # -- scoring -----------------------------------------------------------------------------

    @torch.inference_mode()
    def encode(self, audios16k: list[np.ndarray]) -> torch.Tensor:
        """Encoder states [B, T, D] for 16 kHz mono clips (padded to the window)."""
        feats = self.feature_extractor(
            audios16k,
            sampling_rate=SAMPLE_RATE,
            return_tensors="pt",
            padding="max_length",
            device=self.device if self.device.startswith("cuda") else "cpu",
        ).input_features
        feats = feats.to(self.device, self.encoder.dtype)
        return self.encoder(feats).last_hidden_state

    @torch.inference_mode()
    def heads_from_states(self, states: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every head on one batch of encoder states; name -> [B] float32."""
        inputs = {
            "flat": lambda: states.reshape(states.shape[0], -1),
            "pooled": lambda: pool_states(states),
        }
        cache: dict[str, torch.Tensor] = {}
        out = {}
        for kind, names, stacked in self.groups:
            if kind not in cache:
                cache[kind] = inputs[kind]()
            y = stacked(cache[kind])
            out.update({n: y[:, i] for i, n in enumerate(names)})
        return out

    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec) -> dict[str, list]:
        clips = [_to_mono_16k(a, sample_rate, self.max_samples) for a in audios]
        result: dict[str, list] = {c: [] for c in self.columns if c != self.target_column}
        for i in range(0, len(clips), self.batch_size):
            ys = self.heads_from_states(self.encode(clips[i : i + self.batch_size]))
            # every head's values in one device-to-host copy (one sync per batch, not per head)
            names = list(ys)
            host = torch.stack([ys[n] for n in names], dim=1).cpu() if names else None
            for j, n in enumerate(names):
                result[self.column_of[n]].extend(float(v) for v in host[:, j])
        target = resolve_head(spec.emotion, spec.extra.get("ei_head"), self.emotion_heads)
        result[self.target_column] = (
            list(result[self.column_of[target]]) if target else [float("nan")] * len(clips)
        )
        return result

    def provenance(self) -> dict:
        return {
            "backend": self.name,
            **self._paths,
            "weights_sha256": self.weights_sha256(),
            "dtype": self.dtype,
            "heads": {
                n: {"column": self.column_of[n], "input": self.head_kind[n]}
                for n in sorted(self.column_of)
            },
            "window_samples": self.max_samples,
            "target": f"{self.target_column}: the head of the group's emotion (its ei_head, "
            "else its name; case, spaces and underscores folded); NaN when none",
        }

    def close(self) -> None:
        self.groups, self.encoder = [], None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _existing_dir(path: str | None, field: str) -> Path:
    if not path:
        raise WeightsError(f"empathic-insight: config option {field!r} is not set")
    p = Path(path).expanduser()
    if not p.is_dir():
        raise WeightsError(
            f"empathic-insight: {field} {str(p)!r} is not a directory (config option {field!r})"
        )
    return p
