"""VoiceCLAP-small model written from the published description of laion/voiceclap-commercial
(random weights, written by ``bestofn.fakes.voiceclap``; never used with real weights).

What follows the public sources (docs/notes/scorers-facts.md): the attributes ``mel_filters``
(a buffer), ``audio_encoder``, ``audio_proj``, ``compute_log_mel`` (Whisper's log-mel: STFT 400
/ hop 160, log10, floor at max - 8, (x + 4) / 4), ``encode_waveform(wav[B, S] at 16 kHz)``
(30-s chunks, the encoder's states mean-pooled, projected, L2-normalised, chunks averaged) and
``encode_text(input_ids, attention_mask)`` (a MiniLM-L6-shaped BERT, mean-pooled, projected
384 -> 576 -> 768, L2-normalised). What is ours (UNKNOWN in the published model): the key
names inside the towers (transformers' Whisper encoder and BERT naming here), the audio
projection's hidden width, the text projection's activation.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import BertConfig, BertModel, PreTrainedModel, WhisperConfig
from transformers.audio_utils import mel_filter_bank
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from .configuration_voiceclap import VoiceClapConfig

N_FFT, HOP = 400, 160


class AudioEncoder(nn.Module):
    """Log-mel [B, n_mels, 2 * n_ctx] -> states [B, n_ctx, n_state]."""

    def __init__(self, config):
        super().__init__()
        wcfg = WhisperConfig(
            num_mel_bins=config.n_mels, max_source_positions=config.n_ctx, d_model=config.n_state,
            encoder_layers=config.n_layer, encoder_attention_heads=config.n_head,
            encoder_ffn_dim=4 * config.n_state,
        )  # fmt: skip
        wcfg._attn_implementation = "sdpa"
        self.encoder = WhisperEncoder(wcfg)

    def forward(self, mel):
        return self.encoder(mel).last_hidden_state


def _mlp(d_in, hidden, d_out):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_out))


class VoiceClapModel(PreTrainedModel):
    config_class = VoiceClapConfig

    def __init__(self, config):
        super().__init__(config)
        self.audio_encoder = AudioEncoder(config)
        self.audio_proj = _mlp(config.n_state, config.audio_proj_hidden, config.embed_dim)
        tcfg = BertConfig(
            vocab_size=config.text_vocab_size, hidden_size=config.text_hidden_size,
            num_hidden_layers=config.text_num_layers, num_attention_heads=config.text_num_heads,
            intermediate_size=config.text_intermediate_size,
            max_position_embeddings=config.text_max_positions,
        )  # fmt: skip
        tcfg._attn_implementation = "sdpa"
        self.text_encoder = BertModel(tcfg, add_pooling_layer=False)
        self.text_proj = _mlp(config.text_hidden_size, config.text_proj_hidden, config.embed_dim)
        filters = mel_filter_bank(
            num_frequency_bins=1 + N_FFT // 2, num_mel_filters=config.n_mels, min_frequency=0.0,
            max_frequency=config.sample_rate / 2, sampling_rate=config.sample_rate,
            norm="slaney", mel_scale="slaney",
        )  # fmt: skip
        # saved with the weights (whether the published file holds it is unknown): a buffer built
        # here would not survive from_pretrained's meta-device construction
        self.register_buffer("mel_filters", torch.tensor(filters.T, dtype=torch.float32))
        self.chunk = int(config.chunk_seconds * config.sample_rate)
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

    @torch.no_grad()
    def compute_log_mel(self, chunks):
        window = torch.hann_window(N_FFT, device=chunks.device)
        stft = torch.stft(chunks.float(), N_FFT, HOP, window=window, return_complex=True)
        mel = self.mel_filters.float() @ (stft[..., :-1].abs() ** 2)
        log_spec = torch.clamp(mel, min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.amax(dim=(-2, -1), keepdim=True) - 8.0)
        return (log_spec + 4.0) / 4.0

    def encode_waveform(self, wav, sample_rate=16000):
        if sample_rate != self.config.sample_rate:
            raise ValueError(f"expected {self.config.sample_rate} Hz audio, got {sample_rate}")
        wav = wav[None] if wav.dim() == 1 else wav
        b, t = wav.shape
        n = max(1, -(-t // self.chunk))
        chunks = F.pad(wav, (0, n * self.chunk - t)).reshape(b * n, self.chunk)
        p = next(self.parameters())
        states = self.audio_encoder(self.compute_log_mel(chunks).to(p.dtype))
        # the raw projection, not L2-normalised: LAION's recipe feeds the blend head the raw
        # embedding and the genuineness head the normalised one, so the two differ
        emb = self.audio_proj(states.mean(1)).float()
        return emb if n == 1 else emb.view(b, n, -1).mean(1)

    def encode_text(self, input_ids, attention_mask):
        h = self.text_encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask[..., None].to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1)
        return F.normalize(self.text_proj(pooled).float(), dim=-1)
