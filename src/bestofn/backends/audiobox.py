"""Audiobox Aesthetics (``facebook/audiobox-aesthetics``): four no-reference quality axes per take.

Columns (``aes_*``), one per axis of the published model, on its 1–10 annotation scale:
``aes_ce`` content enjoyment, ``aes_cu`` content usefulness, ``aes_pc`` production complexity,
``aes_pq`` production quality. Higher is better for CE, CU and PQ; PC counts how much is going on
in the audio (a single clean voice is simple), so it has no declared direction.

The model, as the public code defines it (facebookresearch/audiobox-aesthetics, PyPI
``audiobox-aesthetics`` 0.0.4: ``model/aes.py``, ``infer.py``, ``utils.py``; docs/notes/
scorers-facts.md): a WavLM-Base encoder (12 layers, width 768, gated relative position bias,
a 7-layer convolutional front end with group norm on its first layer) whose 13 hidden states
(the input to the first layer and every layer's output) are mixed by a softmax-weighted sum per
axis, averaged over the valid frames, L2-normalised and projected to one number by a per-axis
linear head; the number is mapped back to the annotation scale with the axis's ``mean`` and
``std`` (``target_transform``). Audio: 16 kHz mono, cut into 10 s windows (hop 10 s), the last
one zero-padded and masked; a take's score is the windows' mean weighted by their valid length.

We do not install the package: it requires torchaudio (whose wheels pin a torch version other
than ours) and submitit. The encoder here is transformers' ``WavLMModel`` (already pinned), with
the published state dict's names mapped onto it (``_WAVLM_NAMES``); the sizes are read from the
weights' shapes. Two layouts load (``model_path``):

- a folder with ``config.json`` and ``model.safetensors``: what the package's
  ``AesMultiOutput.from_pretrained`` reads (huggingface_hub's PyTorchModelHubMixin layout; the
  config holds the model's constructor fields, ``target_transform`` among them); the GitHub
  repository's later export (``export_model_to_hf.py``, ``inference.py``) saves the same module
  under ``encoder.``, which is stripped;
- ``checkpoint.pt``: what the package's predictor downloads and reads (``state_dict`` with a
  ``model.`` prefix, ``model_cfg``, ``target_transform``), read with ``weights_only=True``.

Unknown here (no public listing seen): which of the two the hub repo holds today, its revision
and sizes, and whether its ``config.json`` spells every field (missing ones take the package's
dataclass defaults, ``target_transform`` must be there). Known differences from the package's
own inference: it resamples with torchaudio, the pipeline here with soxr; ``dtype: bfloat16``
casts the whole model (the package runs in its config's precision, float32, with the first
layer's group norm in float32 always): ours, not checked against the package. The frame mask of
a padded window follows the package's rule (a frame is padding when all its samples are); the
encoder matches the package's at float32 (lab/probes/audiobox_parity.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bestofn.backends.base import Scorer, hash_memo_dir
from bestofn.util.audio import resample, to_mono
from bestofn.util.dtypes import resolve_dtype
from bestofn.util.spec import GroupSpec

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {
    "audiobox-aesthetics": {
        "role": "scorer",
        "class": "AudioboxAestheticsScorer",
        "preload": ("safetensors.torch", "transformers:WavLMModel"),
        "preload_rank": 60,
    }
}
# facebook/audiobox-aesthetics, config.json + model.safetensors as the package's
# from_pretrained reads them (PyPI audiobox-aesthetics 0.0.4, model/aes.py;
# docs/notes/scorers-facts.md)
PUBLISHED_WEIGHTS = (
    {
        "name": "audiobox-aesthetics",
        "repo_id": "facebook/audiobox-aesthetics",
        "revision": "unknown",
        "allow_patterns": ("config.json", "model.safetensors", "checkpoint.pt"),
        "folder": "audiobox-aesthetics",
        "note": (
            "optional scorer; WavLM-Base + four axis heads; the hub export (config.json + "
            "model.safetensors) and the package's checkpoint.pt: which the repo holds is unknown, "
            "the loader reads either (safetensors first)"
        ),
    },
)

SAMPLE_RATE = 16000
WINDOW_S = 10  # infer.py: make_inference_batch(hop_size=10, window_size=10)
AXES = ("CE", "CU", "PC", "PQ")
COLUMNS = {f"aes_{a.lower()}": "DOUBLE" for a in AXES}
# WavLM-Base's front end (aes.py DEFAULT_AUDIO_CFG conv_feature_layers): kernel sizes are read
# from the weights, strides are not in them
CONV_STRIDES = (5, 2, 2, 2, 2, 2, 2)
MAX_DISTANCE = 800  # DEFAULT_AUDIO_CFG max_distance of the relative position buckets
# AesMultiOutput's dataclass defaults (aes.py), for fields a config.json leaves out
MODEL_DEFAULTS = {
    "proj_num_layer": 1, "proj_ln": False, "proj_act_fn": "gelu", "nth_layer": 13,
    "use_weighted_layer_sum": True, "normalize_embed": True, "output_dim": 1,
}  # fmt: skip
SAFETENSORS = ("config.json", "model.safetensors")
# The repository's later hub export (inference.py's AudioBoxAesthetics) holds the same module
# as ``self.encoder``: its tensors carry this prefix; the package's AesMultiOutput's do not
HUB_PREFIX = "encoder."
CHECKPOINT = "checkpoint.pt"
CAST_OPS = ("conv1d", "linear", "layer_norm", "attention")

# published name (under ``wavlm_model.``) <-> transformers' WavLMModel name; {L}: an encoder
# layer's prefix, {i}: a layer number, {p}: weight or bias, {q}: which projection
_POS = "encoder.pos_conv_embed.conv."
_WAVLM_NAMES = (
    ("mask_emb", "masked_spec_embed"),
    ("feature_extractor.conv_layers.{i}.0.weight", "feature_extractor.conv_layers.{i}.conv.weight"),
    ("feature_extractor.conv_layers.0.2.{p}", "feature_extractor.conv_layers.0.layer_norm.{p}"),
    ("layer_norm.{p}", "feature_projection.layer_norm.{p}"),
    ("post_extract_proj.{p}", "feature_projection.projection.{p}"),
    ("encoder.pos_conv.0.bias", _POS + "bias"),
    ("encoder.pos_conv.0.weight_g", _POS + "parametrizations.weight.original0"),
    ("encoder.pos_conv.0.weight_v", _POS + "parametrizations.weight.original1"),
    ("encoder.layer_norm.{p}", "encoder.layer_norm.{p}"),
    ("{L}self_attn.{q}_proj.{p}", "{L}attention.{q}_proj.{p}"),
    ("{L}self_attn.grep_a", "{L}attention.gru_rel_pos_const"),
    ("{L}self_attn.grep_linear.{p}", "{L}attention.gru_rel_pos_linear.{p}"),
    ("{L}self_attn.relative_attention_bias.weight", "{L}attention.rel_attn_embed.weight"),
    ("{L}self_attn_layer_norm.{p}", "{L}layer_norm.{p}"),
    ("{L}fc1.{p}", "{L}feed_forward.intermediate_dense.{p}"),
    ("{L}fc2.{p}", "{L}feed_forward.output_dense.{p}"),
    ("{L}final_layer_norm.{p}", "{L}final_layer_norm.{p}"),
)  # fmt: skip
_SLOTS = {"i": r"\d+", "p": "weight|bias", "q": "q|k|v|out"}


def _template_regex(template: str) -> re.Pattern:
    template = template.replace("{L}", "encoder.layers.{i}.")
    parts = re.split(r"\{(\w)\}", template)
    return re.compile(
        "".join(
            re.escape(t) if n % 2 == 0 else f"(?P<{t}>{_SLOTS[t]})" for n, t in enumerate(parts)
        )
        + "$"
    )


_TO_HF = [(_template_regex(a), b.replace("{L}", "encoder.layers.{i}.")) for a, b in _WAVLM_NAMES]
_TO_PUBLISHED = [
    (_template_regex(b), a.replace("{L}", "encoder.layers.{i}.")) for a, b in _WAVLM_NAMES
]


class WeightsError(ValueError):
    """A weights path named in config is missing, unreadable, or not in the published layout."""


def _rename(name: str, table) -> str | None:
    for pattern, target in table:
        m = pattern.match(name)
        if m:
            return target.format(**m.groupdict())
    return None


def wavlm_name(published: str) -> str | None:
    """transformers' name of a published ``wavlm_model.*`` tensor (without the prefix)."""
    return _rename(published, _TO_HF)


def published_wavlm_name(hf_name: str) -> str | None:
    """The published name of a transformers WavLMModel tensor (for the fake weights)."""
    return _rename(hf_name, _TO_PUBLISHED)


def wavlm_config(state: dict):
    """transformers' WavLMConfig of the published encoder, sizes read from its tensors."""
    from transformers import WavLMConfig

    conv = sorted(
        (int(m[1]), state[k].shape)
        for k in state
        if (m := re.match(r"^feature_extractor\.conv_layers\.(\d+)\.0\.weight$", k))
    )
    layers = {int(m[1]) for k in state if (m := re.match(r"^encoder\.layers\.(\d+)\.", k))}
    if len(conv) != len(CONV_STRIDES) or not layers:
        raise WeightsError(
            f"{len(conv)} convolution layers and {len(layers)} encoder layers in the weights; "
            f"the published WavLM has {len(CONV_STRIDES)} and 12"
        )
    hidden, width = state["post_extract_proj.weight"].shape
    pos = state["encoder.pos_conv.0.weight_v"].shape
    buckets, heads = state["encoder.layers.0.self_attn.relative_attention_bias.weight"].shape
    return WavLMConfig(
        hidden_size=hidden,
        num_hidden_layers=len(layers),
        num_attention_heads=heads,
        intermediate_size=state["encoder.layers.0.fc1.weight"].shape[0],
        conv_dim=tuple(shape[0] for _, shape in conv),
        conv_kernel=tuple(shape[-1] for _, shape in conv),
        conv_stride=CONV_STRIDES,
        conv_bias=False,
        feat_extract_norm="group",
        do_stable_layer_norm=False,
        num_conv_pos_embeddings=pos[-1],
        num_conv_pos_embedding_groups=hidden // pos[1],
        num_buckets=buckets,
        max_bucket_distance=MAX_DISTANCE,
        layer_norm_eps=1e-5,  # torch's LayerNorm default, as the published WavLM code uses
        feat_proj_layer_norm=True,
        hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0,
    )  # fmt: skip
    del width


def _head(width: int, fields: dict) -> nn.Sequential:
    """One axis's projection: ``proj_num_layer - 1`` hidden blocks (linear, optional layer
    norm, GELU), then a linear layer to ``output_dim``; indices as the published module's."""
    if fields["proj_act_fn"] != "gelu":
        raise WeightsError(f"proj_act_fn {fields['proj_act_fn']!r}: only gelu is published")
    parts: list[nn.Module] = []
    for _ in range(int(fields["proj_num_layer"]) - 1):
        parts.append(nn.Linear(width, width))
        if fields["proj_ln"]:
            parts.append(nn.LayerNorm(width))
        parts.append(nn.GELU())
    parts.append(nn.Linear(width, int(fields["output_dim"])))
    return nn.Sequential(*parts)


class AestheticsModel(nn.Module):
    """The published model on transformers' WavLM: ``forward(windows, sample_mask)`` gives the
    four axes on the annotation scale, one value per window."""

    def __init__(self, encoder_config, fields: dict, target_transform: dict):
        from transformers import WavLMModel

        super().__init__()
        self.wavlm = WavLMModel(encoder_config)
        width = encoder_config.hidden_size
        self.normalize_embed = bool(fields["normalize_embed"])
        self.weighted = bool(fields["use_weighted_layer_sum"])
        n_states = encoder_config.num_hidden_layers + 1
        self.heads = nn.ModuleDict({a: _head(width, fields) for a in AXES})
        self.layer_weights = nn.ParameterDict(
            {a: nn.Parameter(torch.full((n_states,), 1.0 / n_states)) for a in AXES}
        )
        self.register_buffer(
            "target_mean", torch.tensor([float(target_transform[a]["mean"]) for a in AXES])
        )
        self.register_buffer(
            "target_std", torch.tensor([float(target_transform[a]["std"]) for a in AXES])
        )

    @staticmethod
    def frame_mask(sample_mask: torch.Tensor, n_frames: int) -> torch.Tensor:
        """Valid frames of windows whose valid samples are ``sample_mask``: the samples cut
        into ``n_frames`` equal blocks (the remainder dropped from the end), a frame padding
        when all of its block is (the published WavLM's rule)."""
        padding = ~sample_mask
        extra = padding.shape[1] % n_frames
        if extra:
            padding = padding[:, :-extra]
        return ~padding.view(padding.shape[0], n_frames, -1).all(-1)

    def hidden_states(self, wav: torch.Tensor, sample_mask: torch.Tensor):
        """(the encoder's input and every layer's output, [B, T, C] each; frame mask)."""
        w = self.wavlm
        features = w.feature_extractor(wav).transpose(1, 2)
        frames = self.frame_mask(sample_mask, features.shape[1])
        x, _ = w.feature_projection(features)
        enc = w.encoder
        x = x.masked_fill(~frames[..., None], 0.0)
        x = enc.layer_norm(x + enc.pos_conv_embed(x))
        states, bias = [x], None
        for i, layer in enumerate(enc.layers):
            x, bias = layer(x, attention_mask=frames.long(), position_bias=bias, index=i)
            states.append(x)
        return states, frames

    def forward(self, wav: torch.Tensor, sample_mask: torch.Tensor) -> torch.Tensor:
        states, frames = self.hidden_states(wav, sample_mask)
        stacked = torch.stack(states, dim=-1)  # B T C L
        keep = frames[..., None].to(stacked.dtype)
        out = []
        for a in AXES:
            if self.weighted:
                mix = torch.softmax(self.layer_weights[a].float(), dim=-1).to(stacked.dtype)
                embed = stacked @ mix
            else:
                embed = states[-1]
            embed = (embed * keep).sum(1) / keep.sum(1).clamp(min=1)
            if self.normalize_embed:
                embed = F.normalize(embed, dim=-1)
            out.append(self.heads[a](embed)[:, 0].float())
        return torch.stack(out, dim=-1) * self.target_std + self.target_mean


def _read(path: Path) -> tuple[dict, dict, list[Path]]:
    """(tensors under their published names, model fields, files read) of either layout."""
    if path.is_dir() and (path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        if not (path / "config.json").is_file():
            raise WeightsError(
                f"{str(path / 'config.json')!r} is missing (beside model.safetensors)"
            )
        try:
            fields = json.loads((path / "config.json").read_text())
            state = load_file(str(path / "model.safetensors"))
        except Exception as e:
            raise WeightsError(f"cannot read {str(path)!r}: {e}") from e
        if state and all(k.startswith(HUB_PREFIX) for k in state):
            state = {k[len(HUB_PREFIX) :]: v for k, v in state.items()}
        return state, fields, [path / n for n in SAFETENSORS]
    ckpt = path / CHECKPOINT if path.is_dir() else path
    if not ckpt.is_file():
        raise WeightsError(
            f"{str(path)!r} holds neither {' + '.join(SAFETENSORS)} nor {CHECKPOINT}"
        )
    try:
        doc = torch.load(ckpt, map_location="cpu", weights_only=True)
        state = {re.sub(r"^model\.", "", k): v for k, v in doc["state_dict"].items()}
        fields = {**doc["model_cfg"], "target_transform": doc["target_transform"]}
    except Exception as e:
        raise WeightsError(f"cannot read {str(ckpt)!r} as the published checkpoint: {e}") from e
    return state, fields, [ckpt]


def load_model(path: str | None, field: str = "model_path") -> tuple[AestheticsModel, list[Path]]:
    """The model from a published folder or checkpoint; every tensor must be used and every
    weight of the model given."""
    if not path:
        raise WeightsError(f"audiobox-aesthetics: config option {field!r} is not set")
    p = Path(path).expanduser()
    if not p.exists():
        raise WeightsError(f"audiobox-aesthetics: {field} {str(p)!r} does not exist")
    try:
        state, fields, files = _read(p)
        fields = {**MODEL_DEFAULTS, **{k: v for k, v in fields.items() if v is not None}}
        transform = fields.get("target_transform")
        if not isinstance(transform, dict) or any(
            not isinstance(transform.get(a), dict) or {"mean", "std"} - set(transform[a])
            for a in AXES
        ):
            raise WeightsError(
                f"target_transform must give mean and std for each of {', '.join(AXES)}; got "
                f"{transform!r}"
            )
        encoder = {k[len("wavlm_model.") :]: v for k, v in state.items()
                   if k.startswith("wavlm_model.")}  # fmt: skip
        model = AestheticsModel(wavlm_config(encoder), fields, transform)
        mine = {}
        for k, v in state.items():
            if k.startswith("wavlm_model."):
                name = wavlm_name(k[len("wavlm_model.") :])
                mine[f"wavlm.{name}" if name else k] = v
            elif k.startswith("proj_layer."):
                mine["heads." + k[len("proj_layer.") :]] = v
            else:
                mine[k] = v
        expected = set(model.state_dict()) - {"target_mean", "target_std"}
        unused = sorted(set(mine) - expected)
        missing = sorted(expected - set(mine))
        if unused or missing:
            raise WeightsError(
                f"the weights do not match the published model: {len(missing)} missing (e.g. "
                f"{missing[:3]}), {len(unused)} unknown (e.g. {unused[:3]})"
            )
        n_states = len(state["layer_weights.CE"])
        given = model.wavlm.config.num_hidden_layers + 1
        if fields["use_weighted_layer_sum"] and n_states != given:
            raise WeightsError(
                f"layer_weights mix {n_states} states; the encoder gives {given} (its input "
                "and every layer)"
            )
        model.load_state_dict(mine, strict=False)
    except WeightsError as e:
        raise WeightsError(f"audiobox-aesthetics: {field} {str(p)!r}: {e}") from None
    except (KeyError, RuntimeError, ValueError) as e:
        why = f"{type(e).__name__}: {e}"
        raise WeightsError(f"audiobox-aesthetics: {field} {str(p)!r}: {why}") from e
    return model.eval(), files


def windows(audios16k: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list[int], np.ndarray]:
    """10 s windows of 16 kHz mono clips (the last one zero-padded), their valid-sample masks,
    the clip of each window and each window's weight (its valid share)."""
    if not any(len(a) for a in audios16k):
        return (
            np.zeros((0, WINDOW_S * SAMPLE_RATE), np.float32),
            np.zeros((0, 0), bool),
            [],
            np.zeros(0),
        )
    size = WINDOW_S * SAMPLE_RATE
    wavs, masks, owner, weight = [], [], [], []
    for i, a in enumerate(audios16k):
        for start in range(0, len(a), size):  # an empty clip has no window
            piece = a[start : start + size]
            wav = np.zeros(size, np.float32)
            wav[: len(piece)] = piece
            mask = np.zeros(size, bool)
            mask[: len(piece)] = True
            wavs.append(wav)
            masks.append(mask)
            owner.append(i)
            weight.append(len(piece) / size)
    return np.stack(wavs), np.stack(masks), owner, np.array(weight)


class AudioboxAestheticsScorer(Scorer):
    """Config options: ``model_path`` (the published folder, or its checkpoint.pt), ``dtype``
    (float32 default; bfloat16 on CUDA where asked), ``batch_size`` (10 s windows per forward),
    ``cache_dir`` (optional; memoises weight hashes)."""

    name = "audiobox-aesthetics"
    table_weights = (
        "local facebook/audiobox-aesthetics folder (config.json + model.safetensors) or its "
        "`checkpoint.pt`"
    )
    table_options = "`model_path`, `dtype`, `batch_size` (below)"
    columns = COLUMNS
    better = {"aes_ce": "higher", "aes_cu": "higher", "aes_pq": "higher"}
    input_sample_rate = SAMPLE_RATE

    def __init__(
        self,
        device: str = "cpu",
        model_path: str | None = None,
        dtype: str = "float32",
        batch_size: int = 16,
        cache_dir: str | None = None,
    ):
        model, files = load_model(model_path)
        self._setup(model, device, dtype, batch_size)
        self._weight_files = files
        self._paths = {"model_path": str(Path(model_path).expanduser())}
        self._hash_memo = hash_memo_dir(cache_dir)

    @classmethod
    def from_model(cls, model, device: str = "cpu", dtype: str = "float32", batch_size: int = 16):
        """Build from a model in memory (``bestofn.fakes.audiobox``, benches)."""
        self = cls.__new__(cls)
        self._setup(model, device, dtype, batch_size)
        self._weight_files, self._paths, self._hash_memo = [], {"model_path": None}, None
        return self

    def _setup(self, model, device, dtype, batch_size):
        if int(batch_size) < 1:
            raise ValueError(f"audiobox-aesthetics: batch_size must be >= 1, got {batch_size}")
        self.device = str(device)
        self.dtype = resolve_dtype("audiobox-aesthetics", self.device, dtype, CAST_OPS, "cast")
        self.batch_size = int(batch_size)
        model = model.to(self.device, getattr(torch, self.dtype)).eval()
        # the mean/std that map back to the annotation scale stay float32
        model.target_mean, model.target_std = model.target_mean.float(), model.target_std.float()
        self.model = model

    @torch.inference_mode()
    def axes(self, audios16k: list[np.ndarray]) -> np.ndarray:
        """[clips, 4] scores (CE, CU, PC, PQ) of 16 kHz mono clips; NaN for an empty clip."""
        wavs, masks, owner, weight = windows(audios16k)
        preds = []
        dtype = next(self.model.parameters()).dtype
        for s in range(0, len(wavs), self.batch_size):
            wav = torch.from_numpy(wavs[s : s + self.batch_size]).to(self.device, dtype)
            mask = torch.from_numpy(masks[s : s + self.batch_size]).to(self.device)
            preds.append(self.model(wav, mask).cpu().double().numpy())
        per_window = np.concatenate(preds) if preds else np.zeros((0, len(AXES)))
        out = np.full((len(audios16k), len(AXES)), np.nan)  # an empty take: NaN, no score
        owner = np.array(owner, dtype=int)
        for i in range(len(audios16k)):
            w = weight[owner == i]
            if len(w):
                out[i] = (per_window[owner == i] * w[:, None]).sum(0) / w.sum()
        return out

    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec):
        # the pipeline hands 16 kHz mono (input_sample_rate); a direct caller may not
        clips = [resample(to_mono(a), sample_rate, SAMPLE_RATE).astype(np.float32) for a in audios]
        values = self.axes(clips)
        return {col: [float(v) for v in values[:, j]] for j, col in enumerate(COLUMNS)}

    def provenance(self) -> dict:
        return {
            "backend": self.name,
            **self._paths,
            "weights_sha256": self.weights_sha256(),
            "dtype": self.dtype,
            "window_s": WINDOW_S,
            "axes": "aes_ce content enjoyment, aes_cu content usefulness, aes_pc production "
            "complexity, aes_pq production quality (1-10 annotation scale)",
        }

    def close(self) -> None:
        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
