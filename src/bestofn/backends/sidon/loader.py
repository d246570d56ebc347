"""Loading Sidon from the "raw" release layout (``sarulab-speech/sidon_raw_weight`` + the
``facebook/w2v-bert-2.0`` base), read from local directories named in config:

    w2v_bert_dir/   config.json, model.safetensors (or pytorch_model.bin)   -> base encoder
    adapter_dir/    adapter_config.json, adapter_model.safetensors (peft LoRA),
                    decoder_state_dict.pt (DAC Decoder state dict, weight-norm g/v pairs)

The LoRA (r=64, alpha=16, on every ffn{1,2}.output_dense of the first 8 layers) is merged into
the weights once, here. Any other layout (e.g. the TorchScript ``sidon-v0.1`` export) is
refused with an error that says what was expected. With ``cache_dir`` set, the merged 8-layer
cleanser is written once as safetensors (keyed by content hashes) and later workers load it
without the 2.3 GB base."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from bestofn.backends.sidon.model import DECODER_RATES, DACDecoder
from bestofn.util.hashing import file_sha256

log = logging.getLogger("bestofn.backends.sidon")

LORA_TARGET = "output_dense"  # ffn1.output_dense and ffn2.output_dense of each layer
MERGE_VERSION = "1"  # part of the merged-cache key: bump when the merge changes
_PEFT_PREFIX = "base_model.model."


class SidonLoadError(RuntimeError):
    pass


@dataclass
class Release:
    """What ``load_release`` read: the merged cleanser, the decoder, and their files."""

    encoder: nn.Module
    decoder: DACDecoder
    paths: dict = field(default_factory=dict)
    hashes: dict = field(default_factory=dict)
    merged_from_cache: bool = False


def _read_adapter(adapter_dir: Path) -> tuple[dict, dict]:
    cfg_path = adapter_dir / "adapter_config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(
            f"sidon: {cfg_path} not found (config field: restorer.sidon.adapter_dir; expected the "
            "sarulab-speech/sidon_raw_weight layout: adapter_config.json, "
            "adapter_model.safetensors, decoder_state_dict.pt)"
        )
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise SidonLoadError(
            f"sidon: {cfg_path} is not valid JSON (config field: restorer.sidon.adapter_dir): {e}"
        ) from e
    problems = []
    if cfg.get("peft_type") != "LORA":
        problems.append(f"peft_type={cfg.get('peft_type')!r} (want 'LORA')")
    for flag in ("use_dora", "fan_in_fan_out"):
        if cfg.get(flag):
            problems.append(f"{flag}=true")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        problems.append("rank_pattern/alpha_pattern set")
    if problems:
        raise SidonLoadError(
            f"sidon: unsupported LoRA adapter in {cfg_path}: "
            f"{'; '.join(problems)} (config field: restorer.sidon.adapter_dir)"
        )

    weights = adapter_dir / "adapter_model.safetensors"
    try:
        if weights.is_file():
            from safetensors.torch import load_file

            tensors = load_file(str(weights))
        elif (adapter_dir / "adapter_model.bin").is_file():
            weights = adapter_dir / "adapter_model.bin"
            tensors = torch.load(weights, map_location="cpu", weights_only=True)
        else:
            raise FileNotFoundError(
                f"sidon: {adapter_dir}/adapter_model.safetensors not found "
                "(config field: restorer.sidon.adapter_dir)"
            )
    except FileNotFoundError:
        raise
    except Exception as e:
        raise SidonLoadError(
            f"sidon: cannot read LoRA weights {weights} (corrupt?) "
            f"(config field: restorer.sidon.adapter_dir): {e}"
        ) from e
    return cfg, tensors


@torch.no_grad()
def merge_lora(model: nn.Module, adapter_cfg: dict, tensors: dict, n_layers: int) -> int:
    """Fold ``W += scale * B @ A`` into every adapted Linear, once. LoRA biases (peft
    ``bias="lora_only"`` training) replace the base bias when the adapter carries them.
    Refuses any key it does not understand, and an adapter that misses a target module."""
    r, alpha = int(adapter_cfg["r"]), float(adapter_cfg["lora_alpha"])
    scale = alpha / (math.sqrt(r) if adapter_cfg.get("use_rslora") else r)
    modules = dict(model.named_modules())
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        name = key[len(_PEFT_PREFIX) :] if key.startswith(_PEFT_PREFIX) else key
        parts = name.split(".")
        if len(parts) >= 3 and parts[-1] == "weight" and parts[-2] in ("lora_A", "lora_B"):
            pairs.setdefault(".".join(parts[:-2]), {})[parts[-2]] = value
        elif len(parts) >= 4 and parts[-1] == "weight" and parts[-3] in ("lora_A", "lora_B"):
            pairs.setdefault(".".join(parts[:-3]), {})[parts[-3]] = value  # named adapter
        elif parts[-1] == "bias" and ".".join(parts[:-1]) in modules:
            pairs.setdefault(".".join(parts[:-1]), {})["bias"] = value
        else:
            raise SidonLoadError(f"sidon: unexpected tensor {key!r} in the LoRA adapter")
    expected = {
        f"encoder.layers.{i}.{ffn}.{LORA_TARGET}"
        for i in range(n_layers)
        for ffn in ("ffn1", "ffn2")
    }
    missing = sorted(expected - {m for m, p in pairs.items() if "lora_A" in p})
    extra = sorted(set(pairs) - expected)
    if missing or extra:
        raise SidonLoadError(
            "sidon: the LoRA adapter does not have the Sidon layout (LoRA on ffn1/ffn2."
            f"output_dense of layers 0..{n_layers - 1}); missing: {missing[:4]}"
            f"{'...' if len(missing) > 4 else ''}; unexpected: {extra[:4]}"
        )
    for name, p in pairs.items():
        linear = modules[name]
        if "lora_B" not in p:
            raise SidonLoadError(f"sidon: LoRA pair for {name} lacks lora_B")
        a, b = p["lora_A"].float(), p["lora_B"].float()
        if b.shape[0] != linear.out_features or a.shape[1] != linear.in_features:
            raise SidonLoadError(
                f"sidon: LoRA shapes {tuple(b.shape)}x{tuple(a.shape)} do not "
                f"fit {name} ({linear.out_features}x{linear.in_features})"
            )
        delta = (b @ a) * scale
        linear.weight.copy_((linear.weight.float() + delta).to(linear.weight.dtype))
        if "bias" in p:
            linear.bias.copy_(p["bias"].to(linear.bias.dtype))
    return len(pairs)


def load_base_encoder(w2v_bert_dir: Path, n_layers: int):
    from transformers import Wav2Vec2BertModel

    if not (w2v_bert_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"sidon: {w2v_bert_dir}/config.json not found (config field: "
            "restorer.sidon.w2v_bert_dir; expected a local facebook/w2v-bert-2.0 directory)"
        )
    if not any((w2v_bert_dir / f).is_file() for f in ("model.safetensors", "pytorch_model.bin")):
        raise FileNotFoundError(
            f"sidon: {w2v_bert_dir} has no model.safetensors (config field: "
            "restorer.sidon.w2v_bert_dir)"
        )
    try:
        model = Wav2Vec2BertModel.from_pretrained(
            str(w2v_bert_dir),
            num_hidden_layers=n_layers,
            layerdrop=0.0,
            local_files_only=True,
            dtype=torch.float32,  # merge and autocast from full precision
            add_adapter=False,
        )
    except Exception as e:
        raise SidonLoadError(
            f"sidon: cannot load w2v-BERT 2.0 from {w2v_bert_dir} (corrupt?) "
            f"(config field: restorer.sidon.w2v_bert_dir): {e}"
        ) from e
    return model


def load_decoder(path: Path, hidden_size: int) -> DACDecoder:
    if not path.is_file():
        raise FileNotFoundError(
            f"sidon: decoder weights {path} not found (config fields: "
            "restorer.sidon.decoder_path, or adapter_dir/decoder_state_dict.pt)"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise SidonLoadError(
            f"sidon: cannot read decoder weights {path} (corrupt?) "
            f"(config field: restorer.sidon.decoder_path): {e}"
        ) from e
    if isinstance(state, dict) and "state_dict" in state:  # a Lightning checkpoint
        state = {
            k[len("decoder.") :]: v
            for k, v in state["state_dict"].items()
            if k.startswith("decoder.")
        }
    if (
        not isinstance(state, dict)
        or "model.0.weight_v" not in state
        and "model.0.weight" not in state
        and "model.0.parametrizations.weight.original1" not in state
    ):
        raise SidonLoadError(
            f"sidon: {path} is not a DAC Decoder state dict (no model.0 conv); "
            "TorchScript exports (sidon-v0.1 *_cuda.pt) are not supported"
        )
    state = fold_weight_norm(state)
    in_ch = state["model.0.weight"].shape[1]
    channels = state["model.0.weight"].shape[0]
    if in_ch != hidden_size:
        raise SidonLoadError(
            f"sidon: decoder input has {in_ch} channels, encoder gives {hidden_size} ({path})"
        )
    decoder = DACDecoder(in_ch, channels, DECODER_RATES)
    result = decoder.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise SidonLoadError(
            f"sidon: {path} does not have the DAC Decoder layout (channels {channels}, rates "
            f"{list(DECODER_RATES)}): missing {result.missing_keys[:4]}, "
            f"unexpected {result.unexpected_keys[:4]}"
        )
    return decoder


def _first_file(directory: Path, names: tuple[str, ...], field: str) -> Path:
    for name in names:
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(
        f"sidon: {directory} has no {' or '.join(names)} (config field: restorer.sidon.{field})"
    )


def fold_weight_norm(state: dict) -> dict:
    """DAC saves weight-normed convs as ``weight_g``/``weight_v`` (torch.nn.utils.weight_norm,
    dim=0) or, with newer torch, ``parametrizations.weight.original0/1``. Fold both into a
    plain ``weight = g * v / ||v||`` (norm over every dim but 0), once, at load."""
    out = {}
    for key, value in state.items():
        for g_suffix, v_suffix in (
            (".weight_g", ".weight_v"),
            (".parametrizations.weight.original0", ".parametrizations.weight.original1"),
        ):
            if key.endswith(v_suffix):
                stem = key[: -len(v_suffix)]
                g = state.get(stem + g_suffix)
                if g is None:
                    raise SidonLoadError(f"decoder state dict has {key} without {stem + g_suffix}")
                v = value.float()
                norm = torch.linalg.vector_norm(v, dim=tuple(range(1, v.ndim)), keepdim=True)
                out[stem + ".weight"] = (v * (g.float() / norm)).to(value.dtype)
                break
            if key.endswith(g_suffix):
                break
        else:
            out[key] = value
    return out


def load_release(w2v_bert_dir, adapter_dir, decoder_path, cache_dir, num_layers: int) -> Release:
    """Read and check the release files (each missing or foreign one is an error naming the
    file and its config field, before the slow encoder load), merge the LoRA (or take the
    merged cleanser from ``cache_dir``), and load the decoder."""
    if not w2v_bert_dir:
        raise ValueError(
            "sidon: config field restorer.sidon.w2v_bert_dir is required "
            "(a local facebook/w2v-bert-2.0 directory)"
        )
    if not adapter_dir:
        raise ValueError(
            "sidon: config field restorer.sidon.adapter_dir is required "
            "(a local sarulab-speech/sidon_raw_weight directory)"
        )
    base, adapter = Path(w2v_bert_dir).expanduser(), Path(adapter_dir).expanduser()
    for name, d in (("w2v_bert_dir", base), ("adapter_dir", adapter)):
        if not d.is_dir():
            raise FileNotFoundError(
                f"sidon: {d} is not a directory (config field: restorer.sidon.{name})"
            )
    dec_path = (
        Path(decoder_path).expanduser() if decoder_path else adapter / "decoder_state_dict.pt"
    )
    if not dec_path.is_file():  # fail before the slow encoder load
        raise FileNotFoundError(
            f"sidon: decoder weights {dec_path} not found (config fields: "
            "restorer.sidon.decoder_path, or adapter_dir/decoder_state_dict.pt)"
        )
    cache = Path(cache_dir).expanduser() if cache_dir else None
    memo = cache / "hash-memo" if cache else None

    release = Release(None, None)
    adapter_cfg, lora = _read_adapter(adapter)
    base_weights = _first_file(base, ("model.safetensors", "pytorch_model.bin"), "w2v_bert_dir")
    base_config = _first_file(base, ("config.json",), "w2v_bert_dir")
    adapter_weights = _first_file(
        adapter, ("adapter_model.safetensors", "adapter_model.bin"), "adapter_dir"
    )
    for key, p in (
        ("w2v_bert", base_weights),
        ("w2v_bert_config", base_config),
        ("adapter", adapter_weights),
        ("adapter_config", adapter / "adapter_config.json"),
        ("decoder", dec_path),
    ):
        if p.is_file():
            release.paths[key], release.hashes[key] = str(p), file_sha256(p, memo)

    encoder = None
    cache_file = None
    if cache is not None:
        key = hashlib.sha256(
            f"{MERGE_VERSION}\0{num_layers}\0{release.hashes['w2v_bert']}\0"
            f"{release.hashes['w2v_bert_config']}\0{release.hashes['adapter']}\0"
            f"{release.hashes['adapter_config']}".encode()
        ).hexdigest()[:32]
        cache_file = cache / f"sidon-cleanser-{key}.safetensors"
        if cache_file.is_file():
            encoder = _encoder_from_cache(base, cache_file, num_layers)
            release.merged_from_cache = encoder is not None
    if encoder is None:
        encoder = load_base_encoder(base, num_layers)
        n = merge_lora(encoder, adapter_cfg, lora, num_layers)
        log.info("sidon: merged LoRA into %d modules of %s", n, base)
        if cache_file is not None:
            _write_cache(encoder, cache_file)
    release.encoder = encoder
    release.decoder = load_decoder(dec_path, encoder.config.hidden_size)
    return release


def _encoder_from_cache(base: Path, cache_file: Path, num_layers: int):
    from safetensors.torch import load_file
    from transformers import Wav2Vec2BertConfig, Wav2Vec2BertModel

    config = Wav2Vec2BertConfig.from_pretrained(
        str(base), num_hidden_layers=num_layers, layerdrop=0.0, add_adapter=False
    )
    with torch.device("meta"):
        model = Wav2Vec2BertModel(config)
    try:
        model.load_state_dict(load_file(str(cache_file)), strict=True, assign=True)
    except Exception as e:  # a broken cache entry is rebuilt, not trusted
        log.warning("sidon: ignoring unreadable merged cache %s: %s", cache_file, e)
        return None
    return model


def _write_cache(encoder, cache_file: Path) -> None:
    from safetensors.torch import save_file

    cache_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache_file.with_suffix(f".tmp{os.getpid()}")
    state = {k: v.contiguous() for k, v in encoder.state_dict().items()}
    save_file(state, str(tmp))
    os.replace(tmp, cache_file)  # atomic: a crash never leaves a half entry
