"""STAND-IN VoiceCLAP model (random weights, written by ``bestofn.fakes.voiceclap``).

Whisper-encoder audio tower + BERT text tower, each mean-pooled and MLP-projected into one
L2-normalised joint space; ``encode_waveform(wav[B, S] at 16 kHz)`` and ``encode_text(texts)``
as the voiceclap backend calls them. It exists to run the real loading path and time the real
shapes, never to produce a meaningful score.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import (
    BertConfig,
    BertModel,
    PreTrainedModel,
    WhisperConfig,
    WhisperFeatureExtractor,
)
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from .configuration_voiceclap import VoiceClapConfig

SAMPLE_RATE = 16000


class VoiceClapModel(PreTrainedModel):
    config_class = VoiceClapConfig

    def __init__(self, config):
        super().__init__(config)
        wcfg, tcfg = WhisperConfig(**config.audio_tower), BertConfig(**config.text_tower)
        wcfg._attn_implementation = tcfg._attn_implementation = "sdpa"
        self.fe = WhisperFeatureExtractor(
            feature_size=config.n_mels, chunk_length=config.chunk_length
        )
        self.audio = WhisperEncoder(wcfg)
        self.text = BertModel(tcfg, add_pooling_layer=False)
        joint = config.joint_dim
        self.audio_proj = nn.Sequential(
            nn.Linear(wcfg.d_model, joint), nn.GELU(), nn.Linear(joint, joint)
        )
        self.text_proj = nn.Sequential(
            nn.Linear(tcfg.hidden_size, joint), nn.GELU(), nn.Linear(joint, joint)
        )
        self.vocab = tcfg.vocab_size
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def encode_waveform(self, wav: torch.Tensor, sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
        if sample_rate != SAMPLE_RATE:
            raise ValueError(f"expected {SAMPLE_RATE} Hz audio, got {sample_rate}")
        dev = str(wav.device)
        feats = self.fe(
            list(wav.float().cpu().numpy()),
            sampling_rate=SAMPLE_RATE,
            return_tensors="pt",
            device=dev if dev.startswith("cuda") else "cpu",
        ).input_features
        p = next(self.parameters())
        h = self.audio(feats.to(p.device, p.dtype)).last_hidden_state.mean(1)
        return F.normalize(self.audio_proj(h).float(), dim=-1)

    def encode_text(self, texts: list[str]) -> torch.Tensor:
        # byte ids stand in for the WordPiece tokenizer (no tokenizer files offline)
        ids = [list(t.encode())[:128] or [0] for t in texts]
        n = max(map(len, ids))
        p = next(self.parameters())
        x = torch.tensor([i + [0] * (n - len(i)) for i in ids], device=p.device) % self.vocab
        mask = (
            torch.arange(n, device=p.device)[None]
            < torch.tensor([len(i) for i in ids], device=p.device)[:, None]
        )
        h = self.text(input_ids=x, attention_mask=mask.long()).last_hidden_state
        h = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return F.normalize(self.text_proj(h).float(), dim=-1)
