"""Merge a peft LoRA adapter into a checkpoint's weights once, and cache the result on disk.

Why: a LoRA left unmerged costs two extra small matmuls per adapted layer at every decode
step (and blocks fused/compiled kernels); merged, the fine-tuned model runs exactly as fast
as the base. Merging a 4B model takes a minute, so the merged checkpoint is cached:

    cache_dir/merged-<key>/      a complete checkpoint directory (config, code, tokenizer,
                                 merged *.safetensors) that from_pretrained can load as is
    cache_dir/hash-memo/         sha256 of files, memoised by (path, size, mtime, inode)

``key`` is a sha256 over the content hashes of every file of the base checkpoint, of the
adapter's config and weights, and of ``MERGE_VERSION``; a changed adapter (or base) is a new
key, hence a new merge, and a stale merge can never be picked up. Several workers starting
together take a file lock, so only one merges; the others wait and reuse its result. The
merge is written into a temporary sibling and renamed into place, so a crash leaves no half
cache entry.

The arithmetic is peft's (``LoraLayer.get_delta_weight``), done directly on the safetensors
shards, so no model class is instantiated (any checkpoint works, including remote code):

    linear:    W += scale * (B @ A)            (transposed when fan_in_fan_out)
    embedding: W += scale * (B @ A).T          (lora_embedding_A / lora_embedding_B)
    scale = alpha / r, or alpha / sqrt(r) with use_rslora; alpha from alpha_pattern if
    it matches the module, r read from A's shape (so rank_pattern is honoured)

computed in float32 and cast back to the base tensor's dtype. Full tensors in the adapter
(``modules_to_save``, or the embedding copies peft saves when an embedding is targeted)
replace the base tensor. DoRA, LoRA bias, trainable-token adapters and non-LoRA peft
methods are refused with a clear error rather than merged wrong.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from bestofn.util.hashing import combined_sha256, dir_digest, file_sha256
from bestofn.util.hashing import files_under as _files

log = logging.getLogger(__name__)

MERGE_VERSION = "1"  # bump when the merge arithmetic or layout changes: invalidates all merges
MERGE_INFO = "bestofn_merge_info.json"
_PEFT_PREFIX = "base_model.model."
# <module>.lora_A.weight, <module>.lora_A.<adapter>.weight, <module>.lora_embedding_A[.<adapter>]
_LORA_KEY = re.compile(
    r"^(?P<module>.+)\.(?P<kind>lora_A|lora_B|lora_embedding_A|lora_embedding_B)"
    r"(?:\.(?!weight$)[^.]+)?(?:\.weight)?$"
)
_UNSUPPORTED_KEY_PARTS = ("lora_magnitude_vector", "trainable_tokens", "lora_B.bias", "lora_A.bias")


class LoraMergeError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# content hashes


# ---------------------------------------------------------------------------------------------
# reading an adapter


def _adapter_files(adapter_dir: Path) -> tuple[Path, Path]:
    config = adapter_dir / "adapter_config.json"
    if not config.is_file():
        raise FileNotFoundError(f"LoRA adapter config not found: {config} (config field: lora)")
    for name in ("adapter_model.safetensors", "adapter_model.bin"):
        if (adapter_dir / name).is_file():
            return config, adapter_dir / name
    raise FileNotFoundError(
        f"LoRA adapter weights not found: {adapter_dir}/adapter_model.safetensors "
        "(config field: lora)"
    )


def _load_adapter(adapter_dir: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    config_path, weights_path = _adapter_files(adapter_dir)
    config = json.loads(config_path.read_text())
    if weights_path.suffix == ".safetensors":
        tensors = load_file(str(weights_path))
    else:
        tensors = torch.load(weights_path, map_location="cpu", weights_only=True)
    return config, tensors


def _check_supported(config: dict, adapter_dir: Path) -> None:
    peft_type = str(config.get("peft_type", "LORA")).upper()
    problems = []
    if peft_type != "LORA":
        problems.append(f"peft_type={peft_type} (only LORA can be merged)")
    if config.get("use_dora"):
        problems.append("use_dora=true")
    if config.get("lora_bias"):
        problems.append("lora_bias=true")
    if config.get("trainable_token_indices"):
        problems.append("trainable_token_indices")
    if config.get("layer_replication"):
        problems.append("layer_replication")
    if config.get("target_parameters"):
        problems.append("target_parameters")
    if problems:
        raise LoraMergeError(f"unsupported LoRA adapter {adapter_dir}: {', '.join(problems)}")


def _match_pattern(patterns: dict, module: str, default):
    """peft's get_pattern_key: a pattern matches a module name ending in it."""
    for pattern, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default


def adapter_updates(adapter_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Read an adapter into ({base key: float32 delta}, {base key: replacement tensor})."""
    adapter_dir = Path(adapter_dir)
    config, tensors = _load_adapter(adapter_dir)
    _check_supported(config, adapter_dir)
    fan_in_fan_out = bool(config.get("fan_in_fan_out", False))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    replacements: dict[str, torch.Tensor] = {}
    for raw_key, tensor in tensors.items():
        # peft wraps each targeted layer: its own weights live under "<module>.base_layer."
        key = raw_key.removeprefix(_PEFT_PREFIX).replace(".base_layer.", ".")
        if any(part in key for part in _UNSUPPORTED_KEY_PARTS):
            raise LoraMergeError(f"unsupported tensor {raw_key!r} in adapter {adapter_dir}")
        m = _LORA_KEY.match(key)
        if m is None:
            replacements[key] = tensor  # modules_to_save / saved embedding layer
            continue
        pairs.setdefault(m["module"], {})[m["kind"]] = tensor

    deltas: dict[str, torch.Tensor] = {}
    for module, pair in pairs.items():
        embedding = "lora_embedding_A" in pair or "lora_embedding_B" in pair
        a_name, b_name = (
            ("lora_embedding_A", "lora_embedding_B") if embedding else ("lora_A", "lora_B")
        )
        if a_name not in pair or b_name not in pair:
            raise LoraMergeError(f"adapter {adapter_dir}: {module} lacks {a_name} or {b_name}")
        a, b = pair[a_name].float(), pair[b_name].float()
        if a.ndim != 2 or b.ndim != 2:
            raise LoraMergeError(f"adapter {adapter_dir}: {module} is not a linear/embedding LoRA")
        rank = a.shape[0]
        alpha = float(_match_pattern(config.get("alpha_pattern"), module, config["lora_alpha"]))
        scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        delta = b @ a
        if embedding or fan_in_fan_out:
            delta = delta.T
        deltas[f"{module}.weight"] = delta * scale
    return deltas, replacements


# ---------------------------------------------------------------------------------------------
# merging


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)  # same filesystem: no 8 GB copy for untouched shards
    except OSError:
        shutil.copy2(src, dst)


def _merge_into(base_dir: Path, adapter_dir: Path, out_dir: Path) -> dict:
    """Write base + adapter as a complete checkpoint into ``out_dir``; return merge stats."""
    deltas, replacements = adapter_updates(adapter_dir)
    pending = set(deltas) | set(replacements)
    shards = [p for p in _files(base_dir) if p.suffix == ".safetensors"]
    if not shards:
        raise LoraMergeError(f"no *.safetensors weights in base checkpoint {base_dir}")
    n_merged = n_replaced = 0
    for src in _files(base_dir):
        dst = out_dir / src.relative_to(base_dir)
        if src.suffix != ".safetensors":
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)  # config, remote code, tokenizer: small
            continue
        with safe_open(str(src), framework="pt") as f:
            touched = pending.intersection(f.keys())
            metadata = f.metadata() or {"format": "pt"}
        if not touched:
            _link_or_copy(src, dst)
            continue
        tensors = load_file(str(src))
        for key in touched:
            base = tensors[key]
            if key in replacements:
                new = replacements[key]
                if new.shape != base.shape:
                    raise LoraMergeError(
                        f"{key}: adapter tensor {tuple(new.shape)} != base {tuple(base.shape)}"
                    )
                tensors[key] = new.to(base.dtype).contiguous()
                n_replaced += 1
            if key in deltas:
                delta = deltas[key]
                if delta.shape != base.shape:
                    raise LoraMergeError(
                        f"{key}: LoRA delta {tuple(delta.shape)} != base {tuple(base.shape)}"
                    )
                tensors[key] = (tensors[key].float() + delta).to(base.dtype).contiguous()
                n_merged += 1
        pending -= touched
        dst.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(dst), metadata=metadata)
        del tensors
    if pending:
        missing = ", ".join(sorted(pending)[:5])
        raise LoraMergeError(
            f"adapter {adapter_dir} targets weights not stored in {base_dir}: {missing}"
            f"{' ...' if len(pending) > 5 else ''} (tied weights cannot be LoRA-merged)"
        )
    return {"n_lora_merged": n_merged, "n_replaced": n_replaced}


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def merge_key(base_dir: Path, adapter_dir: Path, memo_dir: Path | None = None) -> dict:
    """Hashes that identify a merge: base files, adapter files, merge code version."""
    base_dir, adapter_dir = Path(base_dir), Path(adapter_dir)
    config, weights = _adapter_files(adapter_dir)
    base = combined_sha256(dir_digest(base_dir, memo_dir))
    adapter = combined_sha256(
        {config.name: file_sha256(config, memo_dir), weights.name: file_sha256(weights, memo_dir)}
    )
    key = hashlib.sha256(f"{MERGE_VERSION}\0{base}\0{adapter}".encode()).hexdigest()
    return {"key": key, "base_sha256": base, "adapter_sha256": adapter}


def merged_weights_dir(base_dir, adapter_dir, cache_dir) -> Path:
    """Path of a checkpoint directory holding ``base_dir`` with the LoRA ``adapter_dir`` merged.

    Merges on the first call for a (base, adapter) content pair; afterwards returns the cached
    directory without touching the weights. Safe to call from several processes at once.
    """
    base_dir, adapter_dir, cache_dir = Path(base_dir), Path(adapter_dir), Path(cache_dir)
    if not base_dir.is_dir():
        raise FileNotFoundError(f"base checkpoint directory not found: {base_dir}")
    if not adapter_dir.is_dir():
        raise FileNotFoundError(f"LoRA adapter directory not found: {adapter_dir} (field: lora)")
    ident = merge_key(base_dir, adapter_dir, cache_dir / "hash-memo")
    out = cache_dir / f"merged-{ident['key'][:24]}"
    if (out / MERGE_INFO).is_file():
        return out
    with _file_lock(cache_dir / f"merged-{ident['key'][:24]}.lock"):
        if (out / MERGE_INFO).is_file():  # another worker merged while we waited
            return out
        log.info("merging LoRA %s into %s -> %s", adapter_dir, base_dir, out)
        tmp = cache_dir / f".tmp-{out.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            stats = _merge_into(base_dir, adapter_dir, tmp)
            info = {
                "merge_version": MERGE_VERSION,
                "base_dir": str(base_dir.resolve()),
                "adapter_dir": str(adapter_dir.resolve()),
                **ident,
                **stats,
            }
            (tmp / MERGE_INFO).write_text(json.dumps(info, indent=1))
            shutil.rmtree(out, ignore_errors=True)  # an entry without info is incomplete
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def merge_info(merged_dir) -> dict:
    """Provenance of a merged checkpoint (base/adapter paths and hashes), or {} if not merged."""
    path = Path(merged_dir) / MERGE_INFO
    return json.loads(path.read_text()) if path.is_file() else {}
