"""RANDOM STAND-IN for MOSS-Audio-Tokenizer-v2: NOT the real codec; its audio is noise.

It has the v2 interface as the MOSS processor and ``bestofn.moss.codec.RemoteCodec`` use it
(48 kHz stereo, 12 codebooks, 3840 samples per frame; ``batch_encode``, ``decode``,
``set_compute_dtype``), loaded the way the real one is: remote code next to its config.json.
Written into a codec directory by ``bestofn.fakes.moss_codec.write``; the v2 modeling code is
published only on the model hub, so nothing here reproduces it.
"""

from dataclasses import dataclass

import torch
import torch.nn as nn
from transformers import PretrainedConfig
from transformers.modeling_utils import PreTrainedAudioTokenizerBase


class RandomCodecConfig(PretrainedConfig):
    model_type = "bestofn_random_codec"

    def __init__(
        self,
        n_vq=12,
        codebook_size=64,
        code_dim=8,
        sampling_rate=48000,
        downsample_rate=3840,
        channels=2,
        codec_weight_dtype="fp32",
        **kwargs,
    ):
        self.n_vq, self.codebook_size, self.code_dim = n_vq, codebook_size, code_dim
        self.sampling_rate, self.downsample_rate = sampling_rate, downsample_rate
        self.channels = channels
        self.codec_weight_dtype = codec_weight_dtype
        super().__init__(**kwargs)


@dataclass
class CodecOutput:
    audio_codes: torch.Tensor = None
    audio_codes_lengths: torch.Tensor = None
    audio: torch.Tensor = None
    audio_lengths: torch.Tensor = None


class RandomCodecModel(PreTrainedAudioTokenizerBase):  # the processor checks this base
    config_class = RandomCodecConfig

    def __init__(self, config):
        super().__init__(config)
        c = config
        self.sampling_rate, self.downsample_rate = c.sampling_rate, c.downsample_rate
        self.pool = 48  # samples averaged into one encoder feature
        n_feat = c.channels * c.downsample_rate // self.pool
        self.enc = nn.Linear(n_feat, c.code_dim)
        nq, size, dim = c.n_vq, c.codebook_size, c.code_dim
        self.enc_heads = nn.ModuleList(nn.Linear(dim, size) for _ in range(nq))
        self.codebooks = nn.ModuleList(nn.Embedding(size, dim) for _ in range(nq))
        self.dec = nn.Linear(c.code_dim, c.channels * 160)
        self.compute_dtype = torch.float32
        self.attention_implementation = None
        self.post_init()

    def set_compute_dtype(self, dtype):
        dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
        self.compute_dtype = dtypes.get(str(dtype), torch.float32)

    def set_attention_implementation(self, name):
        self.attention_implementation = name

    @torch.no_grad()
    def batch_encode(self, wav_list, num_quantizers=None):
        c, hop = self.config, self.config.downsample_rate
        frames = [-(-int(w.shape[-1]) // hop) for w in wav_list]
        x = torch.zeros(len(wav_list), c.channels, max(frames) * hop, device=self.device)
        for i, w in enumerate(wav_list):
            x[i, :, : w.shape[-1]] = w.to(self.device, torch.float32)
        x = x.reshape(len(wav_list), c.channels, max(frames), hop // self.pool, self.pool).mean(-1)
        feats = torch.tanh(self.enc(x.permute(0, 2, 1, 3).flatten(2)))
        nq = num_quantizers or c.n_vq
        codes = torch.stack([head(feats).argmax(-1) for head in self.enc_heads[:nq]])
        return CodecOutput(audio_codes=codes, audio_codes_lengths=torch.tensor(frames))

    @torch.no_grad()
    def decode(
        self, audio_codes, padding_mask=None, num_quantizers=None, return_dict=True, **kwargs
    ):
        c, hop = self.config, self.config.downsample_rate
        nq, batch, frames = audio_codes.shape
        if kwargs.get("chunk_duration") is not None and batch != 1:  # as the v1 codec
            raise ValueError("Streaming decode via chunk_duration only supports batch_size=1.")
        lengths = padding_mask.sum(-1) if padding_mask is not None else torch.full((batch,), frames)
        with torch.autocast(
            self.device.type, dtype=self.compute_dtype, enabled=self.compute_dtype != torch.float32
        ):
            z = sum(self.codebooks[k](audio_codes[k]) for k in range(nq))
            y = torch.tanh(self.dec(z))  # [B, T, C*160]
        y = y.float().reshape(batch, frames, c.channels, 160).permute(0, 2, 1, 3)
        y = y.reshape(batch, c.channels, -1)
        audio = torch.nn.functional.interpolate(y, scale_factor=hop / 160)
        return CodecOutput(audio=audio, audio_lengths=lengths.to(torch.long) * hop)
