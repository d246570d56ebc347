"""facebook/audiobox-aesthetics with random weights, in its published layout.

On disk (``write``): ``audiobox-aesthetics/config.json`` (the model's constructor fields, as
huggingface_hub's PyTorchModelHubMixin writes them for the package's ``AesMultiOutput``, with
``target_transform``) and ``model.safetensors`` under the published tensor names
(``wavlm_model.*``, ``proj_layer.<axis>.0.*``, ``layer_weights.<axis>``; bestofn.backends.audiobox).
``write_checkpoint`` writes the other published form, ``checkpoint.pt`` (``state_dict`` with a
``model.`` prefix, ``model_cfg``, ``target_transform``).

Real size: WavLM-Base (12 layers, width 768, 12 heads, FFN 3072, 512-channel front end,
positional convolution 128 wide in 16 groups, 320 buckets), 13 mixed states, one linear head per
axis. Tiny: 2 layers of width 32. The ``target_transform`` values are made up (the published
means and deviations are not in any source seen); so are the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bestofn.fakes import check_size

# `bestofn fake-weights` writes this backend's published checkpoint with ``write`` below
# (bestofn.fakes.weights finds this line)
FAKE_WEIGHTS = "audiobox-aesthetics"
FOLDER = "audiobox-aesthetics"
FIELDS = {
    "proj_num_layer": 1, "proj_ln": False, "proj_act_fn": "gelu", "proj_dropout": 0,
    "nth_layer": 13, "use_weighted_layer_sum": True, "precision": "32", "normalize_embed": True,
    "output_dim": 1, "freeze_encoder": True,
}  # fmt: skip
TARGET_TRANSFORM = {a: {"mean": 5.5, "std": 1.5} for a in ("CE", "CU", "PC", "PQ")}


def encoder_config(tiny: bool):
    from transformers import WavLMConfig

    from bestofn.backends.audiobox import CONV_STRIDES, MAX_DISTANCE

    sizes = (
        dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             conv_dim=(32,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
             num_buckets=32)
        if tiny
        else dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                  intermediate_size=3072, conv_dim=(512,) * 7, num_conv_pos_embeddings=128,
                  num_conv_pos_embedding_groups=16, num_buckets=320)
    )  # fmt: skip
    return WavLMConfig(
        **sizes, conv_kernel=(10, 3, 3, 3, 3, 2, 2), conv_stride=CONV_STRIDES, conv_bias=False,
        feat_extract_norm="group", do_stable_layer_norm=False, max_bucket_distance=MAX_DISTANCE,
        layer_norm_eps=1e-5,
    )  # fmt: skip


def build_model(tiny: bool, seed: int = 0):
    from bestofn.backends.audiobox import AestheticsModel

    torch.manual_seed(seed)
    config = encoder_config(tiny)
    fields = {**FIELDS, "nth_layer": config.num_hidden_layers + 1}
    model = AestheticsModel(config, fields, TARGET_TRANSFORM).eval()
    with torch.no_grad():  # unequal layer mixes, so a wrong state order shows
        for p in model.layer_weights.values():
            p.copy_(torch.randn_like(p))
    return model, fields


def published_state(model) -> dict[str, torch.Tensor]:
    """The model's tensors under the published names."""
    from bestofn.backends.audiobox import published_wavlm_name

    out = {}
    for name, tensor in model.state_dict().items():
        if name in ("target_mean", "target_std"):
            continue
        if name.startswith("wavlm."):
            published = published_wavlm_name(name[len("wavlm.") :])
            if published is None:
                raise KeyError(f"no published name for {name}")
            name = f"wavlm_model.{published}"
        elif name.startswith("heads."):
            name = "proj_layer." + name[len("heads.") :]
        out[name] = tensor.detach().contiguous().clone()
    return out


def build(device: str, size: str = "real", **kw):
    """An AudioboxAestheticsScorer with random weights in memory."""
    from bestofn.backends.audiobox import AudioboxAestheticsScorer

    model, _ = build_model(check_size(size))
    return AudioboxAestheticsScorer.from_model(model, device=device, **kw)


def write(out_dir, size: str = "tiny", seed: int = 0) -> dict:
    """``out_dir/audiobox-aesthetics`` (config.json + model.safetensors); the scorer options."""
    from safetensors.torch import save_file

    folder = Path(out_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    model, fields = build_model(check_size(size), seed + 11)
    save_file(published_state(model), str(folder / "model.safetensors"))
    config = {**fields, "target_transform": TARGET_TRANSFORM}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {"model_path": str(folder.resolve())}


def write_checkpoint(path, size: str = "tiny", seed: int = 0) -> Path:
    """The same random model as ``checkpoint.pt`` (the package's own download)."""
    model, fields = build_model(check_size(size), seed + 11)
    state = {f"model.{k}": v for k, v in published_state(model).items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"state_dict": state, "model_cfg": fields, "target_transform": TARGET_TRANSFORM}, path
    )
    return path
