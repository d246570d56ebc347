"""Canary: the installed transformers still does what the published MOSS-TTS-Local v1.5 code needs.

The published remote code (OpenMOSS/MOSS-TTS, ``moss_tts_local_v1.5/``) is not in CI, so the
moss-hf and parity tests skip there. This file writes its own tiny remote-code model, processor
and codec, each using transformers the way the published files do (same imports, same base
classes, same keyword arguments, same load calls), and fails where transformers no longer
supports that use.

The two breaks seen so far:

- transformers 5.18.0 to 5.24.0: ``AutoProcessor.from_pretrained`` always sets
  ``kwargs["revision"]`` (``resolve_revision``, models/auto/processing_auto.py). The published
  processor's ``from_pretrained`` passes its leftover kwargs on to ``cls(...)``, and
  ``ProcessorMixin.__init__`` raises ``TypeError: Unexpected keyword argument revision.``
  The processor never loads.
- transformers 5.24.0: ``ModelOutput`` got a metaclass (``_BCCacheNameMeta``, utils/generic.py)
  that wraps each output dataclass's ``__init__`` and renames ``past_key_values=`` to ``cache=``.
  The published ``MossTTSLocalOutput`` declares its own ``past_key_values`` field, so its forward
  raises ``TypeError: MossTTSLocalOutput.__init__() got an unexpected keyword argument 'cache'``.

pyproject.toml pins transformers to a version that passes this file. Raise the pin only after
this file passes with the new version (and the moss-hf and parity tests with the reference code).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# ---- the remote code, written into the checkpoint directories --------------------------------
# The imports below are spelled as in the published files on purpose: a moved or renamed import is
# one of the ways a transformers release breaks them.

CONFIGURATION = """
from transformers.configuration_utils import PretrainedConfig
from transformers.models.gpt2.configuration_gpt2 import GPT2Config
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config


class CanaryConfig(PretrainedConfig):
    model_type = "bestofn_canary"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(self, qwen3_config=None, gpt2_config=None, n_vq=2, codebook_size=8,
                 attn_implementation="sdpa", initializer_range=0.02, pad_token_id=0, **kwargs):
        if isinstance(qwen3_config, dict):
            qwen3_config = Qwen3Config(**qwen3_config)
        self.qwen3_config = qwen3_config or Qwen3Config(
            vocab_size=12, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, head_dim=4)
        if isinstance(gpt2_config, dict):
            gpt2_config = GPT2Config(**gpt2_config)
        self.gpt2_config = gpt2_config or GPT2Config(
            vocab_size=12, n_embd=8, n_layer=1, n_head=2, activation_function="silu")
        self.n_vq = int(n_vq)
        self.codebook_size = int(codebook_size)
        self.attn_implementation = attn_implementation
        self.initializer_range = float(initializer_range)
        self.hidden_size = int(self.qwen3_config.hidden_size)
        self.vocab_size = int(self.qwen3_config.vocab_size)
        kwargs.setdefault("tie_word_embeddings", True)
        super().__init__(pad_token_id=int(pad_token_id), **kwargs)

    def to_dict(self):
        out = super().to_dict()
        out["qwen3_config"] = self.qwen3_config.to_dict()
        out["gpt2_config"] = self.gpt2_config.to_dict()
        return out
"""

MODELING = '''
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn as nn
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import PreTrainedModel
from transformers.models.gpt2.configuration_gpt2 import GPT2Config
from transformers.utils import ModelOutput

from .configuration_canary import CanaryConfig


@dataclass
class CanaryOutput(ModelOutput):  # its own past_key_values field, as MossTTSLocalOutput has
    last_hidden_state: Optional[torch.FloatTensor] = None
    past_key_values: Optional[tuple] = None
    hidden_states: Optional[tuple] = None
    attentions: Optional[tuple] = None


class CanaryBackbone(nn.Module):
    """A causal running mean of the input rows, then silu(Linear): its cache is a tuple of one
    plain dict per layer (the published local transformer's static cache is such dicts)."""

    def __init__(self, config):
        super().__init__()
        self.attn_implementation = str(getattr(config, "_attn_implementation", "eager"))
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values=None, inputs_embeds=None, use_cache=None,
                output_attentions=None, output_hidden_states=None, return_dict=True, **kwargs):
        x = inputs_embeds
        b, t, _ = x.shape
        if past_key_values is None:
            prev_sum, prev_n = x.new_zeros(b, x.shape[-1]), 0
        else:
            prev_sum, prev_n = past_key_values[0]["sum"], past_key_values[0]["length"]
        sums = prev_sum[:, None] + x.cumsum(1)
        counts = torch.arange(prev_n + 1, prev_n + t + 1, dtype=x.dtype)
        hidden = self.act(self.proj(sums / counts[None, :, None]))
        cache = ({"static_kv_cache": True, "sum": sums[:, -1], "length": prev_n + t},)
        return BaseModelOutputWithPast(
            last_hidden_state=hidden,
            past_key_values=cache if use_cache else None,
            hidden_states=None,
            attentions=None,
        )


class CanaryPreTrainedModel(PreTrainedModel):
    config_class = CanaryConfig
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["CanaryBackbone"]
    _supports_flash_attn_2 = True
    _supports_sdpa = True
    _supports_cache_class = True


class CanaryModel(CanaryPreTrainedModel):
    _tied_weights_keys = None

    def __init__(self, config):
        super().__init__(config)
        self._tied_weights_keys = {"text_lm_head.weight": "transformer.embed_tokens.weight"}
        self._tied_weights_keys.update({
            f"audio_lm_heads.{i}.weight": f"audio_embeddings.{i}.weight" for i in range(config.n_vq)
        })
        config.qwen3_config.pad_token_id = config.pad_token_id
        config.qwen3_config._attn_implementation = config.attn_implementation
        local = config.gpt2_config.to_dict()
        local["n_positions"] = local["n_ctx"] = config.n_vq + 1
        local = GPT2Config(**local)
        local._attn_implementation = config.attn_implementation
        self.local_attn = local._attn_implementation
        self.transformer = CanaryBackbone(config.qwen3_config)
        h = config.hidden_size
        self.audio_embeddings = nn.ModuleList(
            nn.Embedding(config.codebook_size, h) for _ in range(config.n_vq))
        self.text_lm_head = nn.Linear(h, config.vocab_size, bias=False)
        self.audio_lm_heads = nn.ModuleList(
            nn.Linear(h, config.codebook_size, bias=False) for _ in range(config.n_vq))
        self.post_init()
        self.tie_weights()

    def can_generate(self):
        return True

    def tie_weights(self, *args, **kwargs):
        del args, kwargs
        self.text_lm_head.weight = self.transformer.embed_tokens.weight
        for embedding, head in zip(self.audio_embeddings, self.audio_lm_heads):
            head.weight = embedding.weight

    def get_input_embeddings(self):
        return self.transformer.embed_tokens

    def _embed(self, input_ids):
        x = self.transformer.embed_tokens(input_ids[..., 0])
        for i, emb in enumerate(self.audio_embeddings):
            x = x + emb(input_ids[..., i + 1])
        return x

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values=None, inputs_embeds=None, use_cache=None,
                output_attentions=None, output_hidden_states=None, return_dict=True, **kwargs):
        del kwargs
        if inputs_embeds is None:
            inputs_embeds = self._embed(input_ids)
        out = self.transformer(
            input_ids=None, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            return_dict=True)
        if not return_dict:
            return (out.last_hidden_state, out.past_key_values, out.hidden_states, out.attentions)
        return CanaryOutput(
            last_hidden_state=out.last_hidden_state,
            past_key_values=out.past_key_values,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )

    def _next_row(self, hidden):
        text = self.text_lm_head(hidden).argmax(-1)
        codes = [head(hidden).argmax(-1) for head in self.audio_lm_heads]
        return torch.stack([text, *codes], dim=-1)[:, None, :]

    @torch.no_grad()
    def generate(self, input_ids, max_new_frames=4, use_kv_cache=True):
        """Greedy frames; with the cache it feeds back the backbone output's past_key_values,
        as the published generate does; without it, it re-runs forward on the whole sequence."""
        ids, feed, past = input_ids, input_ids, None
        for _ in range(max_new_frames):
            if use_kv_cache:
                out = self.transformer(inputs_embeds=self._embed(feed), past_key_values=past,
                                       use_cache=True, return_dict=True)
                past = out.past_key_values
            else:
                out = self(input_ids=ids, use_cache=False)
            row = self._next_row(out.last_hidden_state[:, -1, :])
            ids, feed = torch.cat([ids, row], dim=1), row
        return ids
'''

PROCESSING = """
from typing import Any, Optional

from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    BatchFeature,
    PreTrainedTokenizerBase,
    ProcessorMixin,
    logging,
    processing_utils,
)

from .configuration_canary import CanaryConfig

if hasattr(processing_utils, "MODALITY_TO_BASE_CLASS_MAPPING"):
    processing_utils.MODALITY_TO_BASE_CLASS_MAPPING["audio_tokenizer"] = "PreTrainedModel"
else:
    processing_utils.AUTO_TO_BASE_CLASS_MAPPING["AutoModel"] = "PreTrainedModel"
logger = logging.get_logger(__name__)


class CanaryProcessor(ProcessorMixin):
    attributes = ["tokenizer"]
    tokenizer_class = "AutoTokenizer"
    audio_tokenizer_class = "AutoModel"

    tokenizer: PreTrainedTokenizerBase
    audio_tokenizer: Any

    def __init__(self, tokenizer, audio_tokenizer=None,
                 model_config: Optional[CanaryConfig] = None, **kwargs):
        super().__init__(tokenizer=tokenizer, audio_tokenizer=audio_tokenizer, **kwargs)
        self.tokenizer = tokenizer
        self.audio_tokenizer = audio_tokenizer
        self.model_config = model_config or CanaryConfig()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        trust_remote_code = kwargs.pop("trust_remote_code", True)
        kwargs.pop("_from_auto", None)
        codec_path = kwargs.pop("codec_path", None)
        codec_weight_dtype = kwargs.pop("codec_weight_dtype", "fp32")
        model_config = AutoConfig.from_pretrained(
            pretrained_model_name_or_path, *args, trust_remote_code=trust_remote_code, **kwargs)
        if codec_path is None:
            processor_dict, _ = cls.get_processor_dict(
                pretrained_model_name_or_path, **dict(kwargs))
            codec_path = processor_dict.get("audio_tokenizer_name_or_path")
        tokenizer = AutoTokenizer.from_pretrained(
            pretrained_model_name_or_path, *args, trust_remote_code=trust_remote_code, **kwargs)
        audio_tokenizer = AutoModel.from_pretrained(
            codec_path, trust_remote_code=trust_remote_code, codec_weight_dtype=codec_weight_dtype,
            **kwargs)
        return cls(tokenizer=tokenizer, audio_tokenizer=audio_tokenizer,
                   model_config=model_config, **kwargs)

    def __call__(self, text):
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return BatchFeature({"input_ids": [ids]})
"""

CODEC = """
from dataclasses import dataclass

import torch
import torch.nn as nn
from transformers import PretrainedConfig
from transformers.modeling_utils import PreTrainedAudioTokenizerBase


class CanaryCodecConfig(PretrainedConfig):
    model_type = "bestofn_canary_codec"

    def __init__(self, n_vq=2, codebook_size=8, hop=4, codec_weight_dtype="fp32", **kwargs):
        self.n_vq, self.codebook_size, self.hop = n_vq, codebook_size, hop
        self.codec_weight_dtype = codec_weight_dtype
        super().__init__(**kwargs)


@dataclass
class CanaryCodecOutput:
    audio: torch.Tensor = None
    audio_lengths: torch.Tensor = None


class CanaryCodec(PreTrainedAudioTokenizerBase):
    config_class = CanaryCodecConfig

    def __init__(self, config):
        super().__init__(config)
        self.codebooks = nn.ModuleList(
            nn.Embedding(config.codebook_size, config.hop) for _ in range(config.n_vq))
        self.post_init()

    def encode(self, input_values, *args, **kwargs):
        raise NotImplementedError

    def decode(self, audio_codes, padding_mask=None, num_quantizers=None, return_dict=True,
               **kwargs):
        wav = sum(cb(audio_codes[i]) for i, cb in enumerate(self.codebooks))  # [B, T, hop]
        wav = wav.flatten(1)
        lengths = torch.full((wav.shape[0],), wav.shape[1])
        return CanaryCodecOutput(audio=wav[:, None, :], audio_lengths=lengths)
"""


def _write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<audio_start>", "hello", "there", "world"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")
    fast.save_pretrained(out)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A model directory and a codec directory laid out as the published ones are: remote code
    beside config.json (auto_map), tokenizer files, processor_config.json naming the codec."""
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("canary")
    codec_dir, model_dir = root / "canary_codec", root / "canary_model"
    codec_dir.mkdir()
    model_dir.mkdir()

    (codec_dir / "modeling_canary_codec.py").write_text(textwrap.dedent(CODEC))
    codec_cfg = {
        "model_type": "bestofn_canary_codec",
        "auto_map": {
            "AutoConfig": "modeling_canary_codec.CanaryCodecConfig",
            "AutoModel": "modeling_canary_codec.CanaryCodec",
        },
    }
    (codec_dir / "config.json").write_text(json.dumps(codec_cfg))
    cfg = AutoConfig.from_pretrained(str(codec_dir), trust_remote_code=True)
    AutoModel.from_config(cfg, trust_remote_code=True).save_pretrained(str(codec_dir))

    for name, text in [
        ("configuration_canary.py", CONFIGURATION),
        ("modeling_canary.py", MODELING),
        ("processing_canary.py", PROCESSING),
    ]:
        (model_dir / name).write_text(textwrap.dedent(text))
    (model_dir / "__init__.py").write_text("")
    model_cfg = {
        "model_type": "bestofn_canary",
        "auto_map": {
            "AutoConfig": "configuration_canary.CanaryConfig",
            "AutoModel": "modeling_canary.CanaryModel",
        },
    }
    (model_dir / "config.json").write_text(json.dumps(model_cfg))
    cfg = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=True)
    model = AutoModel.from_config(cfg, trust_remote_code=True)
    model.save_pretrained(str(model_dir))
    _write_tokenizer(model_dir)
    processor_cfg = {
        "processor_class": "CanaryProcessor",
        "auto_map": {"AutoProcessor": "processing_canary.CanaryProcessor"},
        "audio_tokenizer_name_or_path": str(codec_dir),
    }
    (model_dir / "processor_config.json").write_text(json.dumps(processor_cfg))
    saved_embeddings = model.transformer.embed_tokens.weight.detach().clone()
    return model_dir, codec_dir, saved_embeddings


@pytest.fixture(scope="module")
def model(checkpoint):
    """Loaded as moss-hf loads the model: config first (attention set on it), then AutoModel."""
    from transformers import AutoConfig, AutoModel

    model_dir, _, _ = checkpoint
    config = AutoConfig.from_pretrained(
        str(model_dir), trust_remote_code=True, local_files_only=True
    )
    config.attn_implementation = "sdpa"
    return AutoModel.from_pretrained(
        str(model_dir),
        config=config,
        trust_remote_code=True,
        local_files_only=True,
        dtype=torch.float32,
    ).eval()


def _prompt(model):
    ids = torch.tensor([[[2, 1, 3], [3, 0, 5], [1, 7, 2]]])  # [B=1, T=3, 1 + n_vq]
    assert ids.shape[-1] == 1 + model.config.n_vq
    return ids


# ---- the tests -----------------------------------------------------------------------------------


def test_output_dataclass_with_its_own_past_key_values_field():
    """MossTTSLocalOutput is a ModelOutput dataclass with a field named past_key_values, built with
    that keyword (broken by transformers 5.24.0: the keyword becomes `cache`)."""
    from dataclasses import dataclass

    from transformers.modeling_outputs import BaseModelOutputWithPast
    from transformers.utils import ModelOutput

    @dataclass
    class Out(ModelOutput):
        last_hidden_state: torch.FloatTensor | None = None
        past_key_values: tuple | None = None
        hidden_states: tuple | None = None
        attentions: tuple | None = None

    hidden = torch.ones(1, 2, 3)
    cache = ({"static_kv_cache": True, "length": 2},)
    out = Out(last_hidden_state=hidden, past_key_values=cache, hidden_states=None, attentions=None)
    assert out.last_hidden_state is hidden
    assert out.past_key_values is cache
    # the published decoders return transformers' own output class with a tuple of dicts as cache
    base = BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=cache)
    assert base.past_key_values is cache
    assert base.last_hidden_state is hidden


def test_remote_model_loads_reties_heads_and_runs_forward(model, checkpoint):
    """AutoConfig/AutoModel with trust_remote_code from a local directory, an instance-level
    _tied_weights_keys dict and a tie_weights override: heads absent from the file are tied to
    the saved embeddings; forward returns the model's own ModelOutput subclass."""
    _, _, saved_embeddings = checkpoint
    assert type(model).__name__ == "CanaryModel"
    assert model.text_lm_head.weight is model.transformer.embed_tokens.weight
    for embedding, head in zip(model.audio_embeddings, model.audio_lm_heads, strict=True):
        assert head.weight is embedding.weight
    assert torch.equal(model.transformer.embed_tokens.weight, saved_embeddings)
    assert model.transformer.attn_implementation == "sdpa"
    assert model.local_attn == "sdpa"
    assert model.can_generate()

    ids = _prompt(model)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    assert type(out).__name__ == "CanaryOutput"
    assert out.last_hidden_state.shape == (1, 3, model.config.hidden_size)
    assert out.past_key_values[0]["length"] == 3


def test_cached_decode_matches_recomputing_through_forward(model):
    """The published generate feeds the backbone's past_key_values back step by step; the result
    must equal re-running forward over the whole sequence."""
    ids = _prompt(model)
    cached = model.generate(ids, max_new_frames=4, use_kv_cache=True)
    full = model.generate(ids, max_new_frames=4, use_kv_cache=False)
    assert cached.shape == (1, 3 + 4, 1 + model.config.n_vq)
    assert torch.equal(cached, full)


def test_remote_processor_loads_through_autoprocessor(checkpoint):
    """AutoProcessor with trust_remote_code reaches the processor's own from_pretrained, which
    passes its remaining kwargs to ProcessorMixin.__init__ with an audio tokenizer loaded by
    AutoModel (broken by transformers 5.18.0: AutoProcessor adds `revision` to those kwargs)."""
    from transformers import AutoProcessor
    from transformers.modeling_utils import PreTrainedAudioTokenizerBase

    model_dir, codec_dir, _ = checkpoint
    for kwargs in ({}, {"codec_path": str(codec_dir), "codec_weight_dtype": "bf16"}):
        processor = AutoProcessor.from_pretrained(str(model_dir), trust_remote_code=True, **kwargs)
        assert type(processor).__name__ == "CanaryProcessor"
        codec = processor.audio_tokenizer
        assert isinstance(codec, PreTrainedAudioTokenizerBase)
        assert codec.config.codec_weight_dtype == kwargs.get("codec_weight_dtype", "fp32")
        assert processor.model_config.n_vq == 2
        assert processor("hello world")["input_ids"] == [[2, 4]]
        audio = codec.decode(torch.zeros(2, 1, 3, dtype=torch.long), return_dict=True).audio
        assert audio.shape == (1, 1, 3 * codec.config.hop)
