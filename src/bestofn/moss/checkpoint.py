"""Read a published MOSS-TTS-Local checkpoint directory (config.json + *.safetensors) into
``MossLocalModel`` (random checkpoints in the same layout: ``bestofn.fakes.moss``).

Published keys follow the reference remote code (transformer.*, local_transformer.*,
audio_embeddings.{k}, local_text_lm_head); tied heads (text_lm_head, audio_lm_heads.{k}) may be
absent. The backbone's q/k/v and gate/up matrices are fused here while copying.

LAION's voice-acting fine-tune (laion/moss-tts-local-transformer-4.55b-voice-acting, the
generator of config/recipes/emotions.yaml and clone.yaml) loads through this same path: its
model card names the base architecture (``moss_tts_local``), its codec and a LoRA merged into the
weights. Its config.json was not found in a public source, so every field (layer counts, widths,
``n_vq``, special-token ids) is ASSUMED to be the base's, as in ``bestofn fake-weights``; the
model is built from whatever its config.json says, and a key it lacks or adds is an error naming
the file (docs/notes/recipes.md).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import torch
from safetensors import safe_open

from bestofn.moss.config import MossLocalConfig
from bestofn.moss.model import MossLocalModel

TIED_OR_UNUSED = re.compile(r"^(text_lm_head\.weight|audio_lm_heads\.\d+\.weight|.*inv_freq)$")


class CheckpointError(ValueError):
    pass


def weight_files(ckpt_dir: Path) -> list[Path]:
    index = ckpt_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [ckpt_dir / s for s in shards]
    files = sorted(ckpt_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors in {ckpt_dir}")
    return files


class _Tensors:
    """Lazy name -> tensor access over all shards (mmap; nothing read until asked). ``device``:
    where ``get`` puts a tensor (safetensors reads it there: on a GPU the fusing and the cast to
    the model's dtype then run on the device, not on the host)."""

    def __init__(self, files: list[Path], device: str | torch.device = "cpu"):
        self.device = str(device)
        self.where: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as sf:
                for k in sf.keys():
                    self.where[k] = f
        self._open: dict[Path, object] = {}

    def get(self, key: str) -> torch.Tensor:
        f = self.where[key]
        if f not in self._open:
            self._open[f] = safe_open(str(f), framework="pt", device=self.device)
        return self._open[f].get_tensor(key)

    def __contains__(self, key):
        return key in self.where


def load_config(ckpt_dir: str | Path, config_cls=MossLocalConfig):
    """``ckpt_dir/config.json`` read by ``config_cls.from_json`` (Local's by default)."""
    path = Path(ckpt_dir) / "config.json"
    if not path.exists():
        raise CheckpointError(f"missing {path}")
    return config_cls.from_json(path)


class _DictTensors:
    """The same access over an in-memory state dict (e.g. the reference model's)."""

    def __init__(self, sd: dict):
        self.sd = sd
        self.where = dict.fromkeys(sd)

    def get(self, key):
        return self.sd[key]

    def __contains__(self, key):
        return key in self.sd


def load_model(
    ckpt_dir: str | Path,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    timings: dict | None = None,
) -> MossLocalModel:
    """The model of ``ckpt_dir`` on ``device``: each tensor read straight to the device, fused
    and cast there. ``timings`` (a dict): filled with the seconds spent reading tensors
    (``read_s``: on a GPU, the host-to-device copy included) and placing them (``place_s``:
    fusing, casting, copying into the parameters; device work is waited for)."""
    ckpt_dir = Path(ckpt_dir)
    cfg = load_config(ckpt_dir)
    tensors = _Tensors(weight_files(ckpt_dir), device)
    copier = TensorCopier(tensors, str(ckpt_dir))
    model = model_from_tensors(cfg, copier, device, dtype, str(ckpt_dir))
    t0 = time.perf_counter()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)  # the copies still queued count as placing
    if timings is not None:
        timings.update(read_s=copier.read_s, place_s=copier.place_s + time.perf_counter() - t0)
    return model


def model_from_state_dict(cfg, sd: dict, device="cpu", dtype=torch.float32) -> MossLocalModel:
    """Build from a published-layout state dict already in memory."""
    return model_from_tensors(cfg, _DictTensors(sd), device, dtype, "state dict")


def empty_model(model_cls, cfg, device, dtype):
    """``model_cls(cfg)`` with uninitialised weights on ``device`` (built on the meta device, so
    nothing is initialised twice) and its buffers built; the loaders copy every weight in."""
    with torch.device("meta"):
        model = model_cls(cfg)
    model = model.to_empty(device=device).to(dtype)
    model.build_buffers(device)
    return model


class TensorCopier:
    """Copies published tensors into a model's parameters, remembering which keys it used, so
    that ``check_all_used`` can reject a checkpoint with tensors this layout does not know.
    Every error names ``where`` (the checkpoint directory, or "state dict") and the key."""

    def __init__(self, t, where: str):
        self.t, self.where = t, where
        self.used: set[str] = set()
        self.read_s = self.place_s = 0.0  # seconds in take (reads) and in put (the rest)

    def take(self, key: str) -> torch.Tensor:
        if key not in self.t:
            raise CheckpointError(f"{self.where}: missing tensor {key!r}")
        self.used.add(key)
        t0 = time.perf_counter()
        tensor = self.t.get(key)
        self.read_s += time.perf_counter() - t0
        return tensor

    def put(self, param: torch.Tensor, *keys: str) -> None:
        """Copy the tensor ``keys[0]`` (several keys: concatenated along dim 0) into param."""
        parts = [self.take(k) for k in keys]
        t0 = time.perf_counter()
        src = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
        if tuple(src.shape) != tuple(param.shape):
            raise CheckpointError(
                f"{self.where}: {keys} has shape {tuple(src.shape)}, expected {tuple(param.shape)}"
            )
        param.copy_(src)
        self.place_s += time.perf_counter() - t0

    def put_qwen3_backbone(self, model, prefix: str) -> None:
        """A published Qwen3Model under ``prefix`` (embed_tokens, layers.{i}.*, norm) into
        ``model.embed_tokens`` / ``model.layers`` (``BackboneLayer``: q/k/v and gate/up fused
        while copying) / ``model.norm``."""
        put = self.put
        put(model.embed_tokens.weight, prefix + "embed_tokens.weight")
        for i, layer in enumerate(model.layers):
            p = f"{prefix}layers.{i}."
            a = p + "self_attn."
            put(layer.qkv.weight, a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight")
            put(layer.o_proj.weight, a + "o_proj.weight")
            put(layer.q_norm.weight, a + "q_norm.weight")
            put(layer.k_norm.weight, a + "k_norm.weight")
            put(layer.input_layernorm.weight, p + "input_layernorm.weight")
            put(layer.post_attention_layernorm.weight, p + "post_attention_layernorm.weight")
            put(layer.gate_up.weight, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
            put(layer.down_proj.weight, p + "mlp.down_proj.weight")
        put(model.norm.weight, prefix + "norm.weight")

    def check_all_used(self, may_skip) -> None:
        """Raise if a tensor was neither copied nor one that ``may_skip(key)`` allows."""
        extra = [k for k in self.t.where if k not in self.used and not may_skip(k)]
        if extra:
            raise CheckpointError(
                f"{self.where}: unexpected tensors (layout mismatch?): {extra[:8]}"
            )


@torch.no_grad()
def model_from_tensors(cfg, t, device, dtype, ckpt_dir: str) -> MossLocalModel:
    """``t``: tensors by name (``_Tensors``, ``_DictTensors``) or a ``TensorCopier`` over them."""
    model = empty_model(MossLocalModel, cfg, device, dtype)
    copier = t if isinstance(t, TensorCopier) else TensorCopier(t, ckpt_dir)
    t = copier.t
    take, put = copier.take, copier.put
    copier.put_qwen3_backbone(model, "transformer.")
    for i, block in enumerate(model.local_blocks):
        p = f"local_transformer.h.{i}."
        for mine, theirs in [
            (block.ln_1, "ln_1"),
            (block.c_attn, "attn.c_attn"),
            (block.c_proj, "attn.c_proj"),
            (block.ln_2, "ln_2"),
            (block.fc_in, "mlp.fc_in"),
            (block.fc_out, "mlp.fc_out"),
        ]:
            put(mine.weight, f"{p}{theirs}.weight")
            put(mine.bias, f"{p}{theirs}.bias")
    put(model.local_ln_f.weight, "local_transformer.ln_f.weight")
    put(model.local_ln_f.bias, "local_transformer.ln_f.bias")
    if model.local_wpe is not None:
        put(model.local_wpe.weight, "local_transformer.wpe.weight")
    model.audio_embed.zero_()
    for k, size in enumerate(cfg.audio_codebook_sizes):
        key = f"audio_embeddings.{k}.weight"
        if key not in t:
            key = f"audio_lm_heads.{k}.weight"  # tied copy
        put(model.audio_embed[k, :size], key)
    slot, end = cfg.audio_assistant_slot_token_id, cfg.audio_end_token_id
    if cfg.local_text_head_mode == "binary":
        put(model.stop_head, "local_text_lm_head.weight")
    else:  # full-vocab text head (tied to embed_tokens) restricted to the two candidates
        key = "text_lm_head.weight" if "text_lm_head.weight" in t else None
        full = take(key) if key else model.embed_tokens.weight
        model.stop_head.copy_(full[[slot, end]])
    copier.check_all_used(TIED_OR_UNUSED.match)
    return model.eval()
