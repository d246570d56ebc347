"""A MOSS-Audio-Tokenizer ``config.json`` (v1 or v2) read into the stage lists our code runs.

Both versions are ``MossAudioTokenizerModel`` (``model_type`` ``moss-audio-tokenizer``; some
files say ``speech_tokenizer``) and describe the codec the same way: ``encoder_kwargs`` /
``decoder_kwargs`` are lists of stages run in order (``PatchedPretransform``: fold or unfold
``patch_size`` steps into channels; ``Transformer``: a causal transformer stage) and
``quantizer_kwargs`` the residual quantizer. The module list is read from the file, never
assumed. What tells them apart, and what it changes:

- v1 (MOSS-Audio-Tokenizer, the 24 kHz mono codec of MOSS-TTS Delay): one window for every
  stage, ``int(rate * causal_transformer_context_duration)`` steps at that stage's rate.
- v2 (MOSS-Audio-Tokenizer-v2, the 48 kHz stereo codec of MOSS-TTS-Local v1.5):
  ``number_channels`` 2 with ``enable_channel_interleave``: the channels are interleaved
  sample by sample (L0 R0 L1 R1 ...) into one stream at ``channels x sampling_rate``, so the
  patches multiply to ``channels x downsample_rate`` (7680 = 240 x 2^5); each stage has its own
  ``context_duration`` (seconds; the published decoder's windows are 125/250/400/400/400/400
  steps), ``int(round(rate * duration))`` steps.

A file is v2 when it names more than one channel or gives any stage its own
``context_duration``; otherwise v1.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from bestofn.moss.codec.checkpoint import AudioTokenizerError
from bestofn.moss.codec.layers import StageCfg

QUANTIZER_TYPES = ("rlfq", "random_prefix_rlfq", "rvq", "spec_rvq")


def is_audio_tokenizer_config(cfg: dict) -> bool:
    """True for a MOSS-Audio-Tokenizer ``config.json`` (v1 or v2): the stage lists and the
    quantizer section this module reads."""
    return (
        isinstance(cfg.get("decoder_kwargs"), list)
        and isinstance(cfg.get("encoder_kwargs"), list)
        and isinstance(cfg.get("quantizer_kwargs"), dict)
        and cfg.get("sampling_rate", cfg.get("sample_rate")) is not None
    )


def codec_version(cfg: dict) -> str:
    channels = int(cfg.get("number_channels", cfg.get("channels_numbers", 1)))
    stages = [*cfg.get("encoder_kwargs", []), *cfg.get("decoder_kwargs", [])]
    per_stage = any(isinstance(s, dict) and "context_duration" in s for s in stages)
    return "v2" if channels > 1 or per_stage else "v1"


def _transformer(s: dict, rate: float, duration: float, version: str, at: str) -> StageCfg:
    for bad, ok in (("gating", "none"), ("weights_per_step", 0)):
        if s.get(bad, ok) not in (ok, None, False):
            raise AudioTokenizerError(f"{at}: {bad}={s[bad]!r} is not supported")
    pos = s.get("positional_embedding", "sin")
    if pos not in ("rope", "none"):
        raise AudioTokenizerError(f"{at}: positional_embedding={pos!r} is not supported")
    if not s.get("causal", False):
        raise AudioTokenizerError(f"{at}: only causal transformers are supported")
    if not s.get("conv_layout", False):
        raise AudioTokenizerError(f"{at}: only conv_layout transformers are supported")
    norm = s.get("norm", "layer_norm")
    if norm not in ("layer_norm", "rms_norm", "rms_norm_f32"):
        raise AudioTokenizerError(f"{at}: norm={norm!r} is not supported")
    duration = float(s.get("context_duration", duration))
    # as each version's published code computes it
    context = int(round(rate * duration)) if version == "v2" else int(rate * duration)
    try:
        st = StageCfg(
            "transformer",
            input_dim=int(s["input_dimension"]),
            output_dim=int(s["output_dimension"]),
            d_model=int(s["d_model"]),
            heads=int(s["num_heads"]),
            layers=int(s["num_layers"]),
            ff=int(s.get("dim_feedforward", 2048)),
            context=context,
            norm=norm,
            rope=pos == "rope",
            max_period=float(s.get("max_period", 10000)),
            layer_scale=s.get("layer_scale") is not None,
        )
    except KeyError as e:
        raise AudioTokenizerError(f"{at}: missing field {e.args[0]!r}") from None
    if st.d_model % st.heads or (st.d_model // st.heads) % 2:
        raise AudioTokenizerError(f"{at}: d_model/num_heads must be an even integer")
    if st.context < 1:
        raise AudioTokenizerError(f"{at}: context_duration {duration} s is under one step")
    return st


def _stages(cfg: dict, field: str, rate: float, down: bool, version: str, where: str):
    """Parse one stage list; returns (stages, step rate after them)."""
    duration = float(cfg.get("causal_transformer_context_duration", 10.0))
    out = []
    for i, s in enumerate(cfg[field]):
        at = f"{where}: {field}[{i}]"
        kind = s.get("module_type")
        if kind == "PatchedPretransform":
            st = StageCfg("patch", patch=int(s["patch_size"]))
            ratio = st.patch
        elif kind == "Transformer":
            st = _transformer(s, rate, duration, version, at)
            ratio = 1
        else:
            raise AudioTokenizerError(f"{at}: unknown module_type {kind!r}")
        out.append(st)
        rate = rate / ratio if down else rate * ratio
    return out, rate


@dataclass
class AudioTokenizerConfig:
    version: str  # "v1" | "v2"
    sampling_rate: int
    downsample_rate: int  # samples per frame and channel
    channels: int  # channels of the audio in and out
    interleave: int  # channels folded into the one stream the stages see (1 or channels)
    num_quantizers: int
    codebook_size: int
    codebook_dim: int
    rvq_dim: int
    quantizer_input_dim: int
    quantizer_output_dim: int
    normalized_codes: bool  # rlfq: nearest L2-normalised entry; rvq: nearest entry
    encoder: list
    decoder: list

    @classmethod
    def from_dict(cls, cfg: dict, where: str = "config.json") -> AudioTokenizerConfig:
        try:
            q = cfg["quantizer_kwargs"]
            version = codec_version(cfg)
            rate = int(cfg.get("sampling_rate", cfg.get("sample_rate", 24000)))
            down = int(cfg.get("downsample_rate", 1920))
            channels = int(cfg.get("number_channels", cfg.get("channels_numbers", 1)))
            interleave = channels if cfg.get("enable_channel_interleave", True) else 1
            if channels > 1 and interleave == 1:
                raise AudioTokenizerError(
                    f"{where}: {channels} channels without enable_channel_interleave is not "
                    "supported"
                )
            qtype = q.get("quantizer_type", cfg.get("quantizer_type", "rlfq"))
            if qtype not in QUANTIZER_TYPES:
                raise AudioTokenizerError(f"{where}: quantizer_type {qtype!r} is not supported")
            qin = int(q.get("input_dim", 1024))
            rvq = int(q.get("rvq_dim") or qin)
            stream_rate = float(rate * interleave)
            encoder, frame_rate = _stages(cfg, "encoder_kwargs", stream_rate, True, version, where)
            decoder, _ = _stages(cfg, "decoder_kwargs", frame_rate, False, version, where)
            c = cls(
                version=version,
                sampling_rate=rate,
                downsample_rate=down,
                channels=channels,
                interleave=interleave,
                num_quantizers=int(q.get("num_quantizers", 32)),
                codebook_size=int(q.get("codebook_size", 1024)),
                codebook_dim=int(q.get("codebook_dim", 8)),
                rvq_dim=rvq,
                quantizer_input_dim=qin,
                quantizer_output_dim=int(q.get("output_dim") or qin),
                normalized_codes=qtype in ("rlfq", "random_prefix_rlfq"),
                encoder=encoder,
                decoder=decoder,
            )
        except KeyError as e:
            raise AudioTokenizerError(f"{where}: missing field {e.args[0]!r}") from None
        stream_hop = down * c.interleave
        for part in ("encoder", "decoder"):
            hop = math.prod(s.patch for s in getattr(c, part))
            if hop != stream_hop:
                raise AudioTokenizerError(
                    f"{where}: the {part}'s patch sizes multiply to {hop}, not downsample_rate "
                    f"x interleaved channels = {down} x {c.interleave}"
                )
        return c

    @property
    def frame_rate(self) -> float:
        return self.sampling_rate / self.downsample_rate


def read_config(codec_dir) -> tuple[dict, AudioTokenizerConfig]:
    path = Path(codec_dir) / "config.json"
    if not path.is_file():
        raise AudioTokenizerError(f"{path} not found (config field: codec_dir)")
    try:
        raw = json.loads(path.read_text())
    except ValueError as e:
        raise AudioTokenizerError(f"{path}: not JSON ({e})") from None
    if not isinstance(raw, dict) or not is_audio_tokenizer_config(raw):
        raise AudioTokenizerError(
            f"{path}: not a MOSS-Audio-Tokenizer config (needs encoder_kwargs, decoder_kwargs, "
            "quantizer_kwargs, sampling_rate)"
        )
    return raw, AudioTokenizerConfig.from_dict(raw, str(path))
