"""MOSS-TTS v1.5 Delay (8B): checkpoint facts, the network for inference, and its loader.

Facts (OpenMOSS/MOSS-TTS ``moss_tts_delay/``; docs/notes/moss-facts.md, section Delay):

- config.json: ``model_type = "moss_tts_delay"``, a nested ``language_config`` (Qwen3),
  ``n_vq`` (32), ``audio_vocab_size`` (1024), ``audio_pad_code`` (1024), ``sampling_rate``
  (24000) and the special token ids.
- Weights (published key names): ``language_model.*`` (a plain Qwen3Model: embed_tokens,
  layers.{i}.self_attn.{q,k,v,o}_proj / {q,k}_norm, mlp.{gate,up,down}_proj, the two layer
  norms, norm), ``emb_ext.{k}.weight`` [audio_vocab + 1, H] (the pad code has its own row and
  IS added to the input embedding), ``lm_heads.0.weight`` [vocab, H] (text head) and
  ``lm_heads.{1+k}.weight`` [audio_vocab + 1, H] (codebook k; its last logit is never sampled).
- Input rows are [text token, code_0 .. code_{n_vq-1}]; one backbone step per row, all heads
  on the final hidden. Codebook k of frame f sits in row f + k (the delay pattern).
- Positions are the slot index (the published forward passes no position ids, so a left-padded
  prompt's pads take positions too); padded and finished slots are masked as keys.

The backbone layers are ``bestofn.moss.model.BackboneLayer`` (the same Qwen3 block as Local).

LAION's voice-acting fine-tune (laion/moss-tts-v1.5-8b-voice-acting, config/recipes/delay.yaml)
loads through this same loader: its card names ``moss_tts_delay``, 32 codebooks and the v1 codec.
Its config.json was not found in a public source: its fields are ASSUMED to be the base's (as
``bestofn fake-weights`` writes them); the network is built from what its config.json says
(docs/notes/recipes.md).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn

from bestofn.moss.checkpoint import (
    TensorCopier,
    _DictTensors,
    _Tensors,
    empty_model,
    load_config,
    weight_files,
)
from bestofn.moss.config import HfJsonConfig, qwen3_fields, qwen3_hf_dict
from bestofn.moss.kv_cache import BackboneCache
from bestofn.moss.model import (
    BackboneLayer,
    Qwen3Backbone,
    RMSNorm,
    decode_backbone,
    prefill_attention_mask,
)
from bestofn.moss.options import engine_defaults

MODEL_TYPE = "moss_tts_delay"
# the text head's temperature in the published Delay generate (Local's stop head: 1.0)
DELAY_TEXT_TEMPERATURE = 1.5


@dataclass
class MossDelayConfig(HfJsonConfig):
    # backbone (Qwen3-8B in the published model)
    hidden_size: int = 4096
    num_layers: int = 36
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 12288
    vocab_size: int = 151936
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    # audio
    n_vq: int = 32
    audio_vocab_size: int = 1024
    audio_pad_code: int = 1024
    sampling_rate: int = 24_000
    frame_rate: float = 12.5
    # special tokens (published defaults)
    pad_token_id: int = 151643
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    audio_start_token_id: int = 151652
    audio_end_token_id: int = 151653
    audio_user_slot_token_id: int = 151654
    audio_assistant_gen_slot_token_id: int = 151656
    audio_assistant_delay_slot_token_id: int = 151662

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.audio_pad_code != self.audio_vocab_size:
            # the published heads have audio_vocab + 1 rows and mask the last one as the pad
            raise ValueError(
                f"audio_pad_code ({self.audio_pad_code}) must equal audio_vocab_size "
                f"({self.audio_vocab_size}) in the Delay layout"
            )
        ids = [self.pad_token_id, self.im_end_token_id, self.audio_start_token_id,
               self.audio_end_token_id, self.audio_assistant_gen_slot_token_id,
               self.audio_assistant_delay_slot_token_id]  # fmt: skip
        if max(ids) >= self.vocab_size:
            raise ValueError(f"special token ids {ids} must lie below vocab_size {self.vocab_size}")

    @property
    def audio_vocab(self) -> int:
        return self.audio_vocab_size

    @classmethod
    def from_hf_dict(cls, cfg: dict) -> MossDelayConfig:
        q = cfg.get("language_config") or {}
        d = cls.__dataclass_fields__
        ints = {k: int(cfg[k]) for k in d if k in cfg and k.endswith(("_id", "_code"))}
        return cls(
            **qwen3_fields(
                q,
                num_layers=36,
                intermediate_size=12288,
                rope_keys=("rope_parameters", "rope_scaling"),
            ),
            n_vq=int(cfg.get("n_vq", 32)),
            audio_vocab_size=int(cfg.get("audio_vocab_size", 1024)),
            sampling_rate=int(cfg.get("sampling_rate", 24000)),
            **ints,
        )

    def to_hf_dict(self) -> dict:
        """config.json in the published layout (what ``MossTTSDelayConfig`` reads)."""
        out = {
            "architectures": ["MossTTSDelayModel"],
            "model_type": MODEL_TYPE,
            "language_config": qwen3_hf_dict(self, tie_word_embeddings=False),
            "tie_word_embeddings": False,
        }
        for k, v in asdict(self).items():
            if k in ("n_vq", "audio_vocab_size", "sampling_rate") or k.endswith(("_id", "_code")):
                out[k] = v
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def is_delay_checkpoint(ckpt_dir: str | Path) -> bool:
    """True when ``ckpt_dir/config.json`` describes a MOSS-TTS Delay model."""
    path = Path(ckpt_dir) / "config.json"
    if not path.is_file():
        return False
    cfg = json.loads(path.read_text())
    archs = cfg.get("architectures") or []
    return cfg.get("model_type") == MODEL_TYPE or "MossTTSDelayModel" in archs


# ---- delay pattern -------------------------------------------------------------------------


def apply_delay(codes: torch.Tensor, pad_code: int) -> torch.Tensor:
    """codes [T, n_vq] -> delayed rows [T + n_vq - 1, n_vq]: codebook k shifted down k rows."""
    T, n = codes.shape
    out = torch.full((T + n - 1, n), pad_code, dtype=codes.dtype, device=codes.device)
    for k in range(n):
        out[k : k + T, k] = codes[:, k]
    return out


def undo_delay(rows: torch.Tensor) -> torch.Tensor:
    """Delayed rows [R, n_vq] -> codes [R - n_vq + 1, n_vq] (frames with every codebook)."""
    R, n = rows.shape
    T = max(0, R - n + 1)
    idx = torch.arange(T, device=rows.device)[:, None] + torch.arange(n, device=rows.device)
    return rows.gather(0, idx) if T else rows.new_zeros((0, n))


def distinct_prompts(ids: torch.Tensor, mask: torch.Tensor):
    """Rows of (ids [B, T, C], mask [B, T]) -> (first [U]: the first row of each distinct
    prompt, inv [B]: each row's prompt, an index into ``first``). Runs on the host."""
    B = ids.shape[0]
    key = torch.cat([ids.reshape(B, -1), mask.reshape(B, -1).long()], dim=1).cpu()
    _, inv = torch.unique(key, dim=0, return_inverse=True)
    first = torch.full((int(inv.max()) + 1,), B, dtype=torch.long)
    first.scatter_reduce_(0, inv, torch.arange(B), reduce="amin")
    return first, inv


# ---- network -------------------------------------------------------------------------------


class MossDelayModel(Qwen3Backbone, nn.Module):
    has_local = False  # no local transformer: fused and decode_attention are its paths

    def __init__(self, c: MossDelayConfig):
        super().__init__()
        self.config = c
        H, V1 = c.hidden_size, c.audio_vocab_size + 1
        self.embed_tokens = nn.Embedding(c.vocab_size, H)
        self.layers = nn.ModuleList(BackboneLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(H, c.rms_norm_eps)
        self.audio_embed = nn.Parameter(torch.zeros(c.n_vq, V1, H))  # emb_ext, stacked
        self.text_head = nn.Parameter(torch.zeros(c.vocab_size, H))  # lm_heads.0
        self.audio_heads = nn.Parameter(torch.zeros(c.n_vq, V1, H))  # lm_heads.1..n_vq
        # Local's backbone decode paths (fused: K+V in one cache write, residual add + next norm
        # in one piece); the backend sets them from its runtime options, until then the defaults
        d = engine_defaults()
        self.set_paths(fused=d["fused"], decode_attention=d["decode_attention"])
        self.build_buffers()

    def build_buffers(self, device=None) -> None:
        c = self.config
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
        self.register_buffer("inv_freq", inv.to(device) if device else inv, persistent=False)
        # built here, not in a decode step (a tensor made from Python numbers there is a copy
        # from the host, which a CUDA graph cannot capture)
        pad = torch.tensor([c.audio_pad_code], device=device)
        self.register_buffer("pad_idx", pad, persistent=False)

    def embed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [..., 1 + n_vq] -> [..., H]: text embedding + every channel's code embedding
        (pad codes included: the published model embeds them with their own row)."""
        x = self.embed_tokens(ids[..., 0])
        if ids.dim() > 2:  # a prompt: channel by channel (no [B, T, n_vq, H] intermediate)
            for k in range(self.config.n_vq):
                x = x + self.audio_embed[k][ids[..., 1 + k]]
            return x
        k = torch.arange(self.config.n_vq, device=ids.device)
        return x + self.audio_embed[k, ids[..., 1:]].sum(-2)

    def prefill(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: BackboneCache,
        last_only: bool = False,
    ):
        """ids [B, T, 1+n_vq] left-padded -> final-norm hidden [B, T, H] ([B, H] of the last
        position with ``last_only``); fills cache [0, T).

        Rows with the same prompt (the N takes of one text in best-of-N) are run once: the
        distinct prompts go through the backbone in cache rows [0, U), then every row's K/V
        and hidden are gathered from its prompt's row."""
        B, T, _ = ids.shape
        mask = attention_mask.bool()
        first, inv = distinct_prompts(ids, mask)
        U = len(first)
        if U < B:
            ids, mask = ids[first.to(ids.device)], mask[first.to(mask.device)]
        pos = torch.arange(T, device=ids.device).expand(U, T)
        x = self.embed_rows(ids).to(self.text_head.dtype)
        cos, sin = self._rope(pos, x.dtype)
        attn_mask = prefill_attention_mask(mask)
        for i, layer in enumerate(self.layers):
            x = layer.prefill(x, cos, sin, attn_mask, cache.k[i][:U], cache.v[i][:U])
        if last_only:
            x = x[:, -1]
        if U < B:  # row b takes prompt inv[b]'s K/V (a gather copies before it writes)
            inv = inv.to(x.device)
            for i in range(len(self.layers)):
                if cache.kv is not None:
                    cache.kv[i][:, :, :T] = cache.kv[i][inv, :, :T]
                else:
                    cache.k[i][:, :, :T] = cache.k[i][inv, :, :T]
                    cache.v[i][:, :, :T] = cache.v[i][inv, :, :T]
            x, mask = x[inv], mask[inv]
        cache.key_mask[:, :T].copy_(mask)
        cache.pos.fill_(T)
        cache.write_idx.fill_(T)
        return self.norm(x)

    def backbone_step(self, x, alive, cache: BackboneCache, kv_len: int | None = None):
        """x [B, H]: embeddings of each row's newest input; alive [B]: its attention-mask bit."""
        hn = decode_backbone(self, x, alive, cache, kv_len)
        cache.pos.add_(1)
        cache.write_idx.add_(1)
        return hn

    def text_logits(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.text_head.t()

    def audio_logits(self, h: torch.Tensor) -> torch.Tensor:
        """[B, H] -> [B, n_vq, audio_vocab + 1] (the last entry, the pad code, at -inf)."""
        logits = torch.einsum("bh,kvh->bkv", h, self.audio_heads)
        return logits.index_fill(-1, self.pad_idx, float("-inf"))

    def new_backbone_cache(self, batch: int, max_len: int) -> BackboneCache:
        c, p = self.config, self.text_head
        return BackboneCache(
            c.num_layers, batch, c.num_kv_heads, max_len, c.head_dim, p.dtype, p.device,
            kv_side_by_side=self.fused_backbone,
        )  # fmt: skip


# ---- checkpoint ----------------------------------------------------------------------------


def load_delay_config(ckpt_dir: str | Path) -> MossDelayConfig:
    return load_config(ckpt_dir, MossDelayConfig)


def load_delay_model(
    ckpt_dir: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> MossDelayModel:
    ckpt_dir = Path(ckpt_dir)
    cfg = load_delay_config(ckpt_dir)
    return delay_model_from_tensors(
        cfg, _Tensors(weight_files(ckpt_dir)), device, dtype, str(ckpt_dir)
    )


def delay_model_from_state_dict(cfg, sd: dict, device="cpu", dtype=torch.float32):
    return delay_model_from_tensors(cfg, _DictTensors(sd), device, dtype, "state dict")


@torch.no_grad()
def delay_model_from_tensors(cfg: MossDelayConfig, t, device, dtype, where: str):
    model = empty_model(MossDelayModel, cfg, device, dtype)
    copier = TensorCopier(t, where)
    copier.put_qwen3_backbone(model, "language_model.")
    copier.put(model.text_head, "lm_heads.0.weight")
    for k in range(cfg.n_vq):
        copier.put(model.audio_embed[k], f"emb_ext.{k}.weight")
        copier.put(model.audio_heads[k], f"lm_heads.{k + 1}.weight")
    copier.check_all_used(lambda k: k.endswith("inv_freq"))
    return model.eval()
