"""Production restorer: Sidon (sarulab-speech), 16 kHz in -> 48 kHz out. The registry names it
``bestofn.backends.sidon:SidonRestorer``.

- ``model``: the networks (SeamlessM4T fbank, the DAC-style decoder);
- ``kernels``: the decoder's fused Triton kernels on CUDA, and ``DecoderKernels``, one
  restorer's choice of them (its runtime ``snake`` and ``layout``);
- ``loader``: the raw release layout, the LoRA merge and the merged-cleanser cache;
- ``adapter``: ``SidonRestorer``, the backend (batching, resampling, provenance)."""

from bestofn.backends.sidon.adapter import AUTOCAST_OPS, SidonRestorer
from bestofn.backends.sidon.kernels import (
    DEFAULT_LAYOUT,
    DEFAULT_SNAKE,
    LAYOUTS,
    SNAKE_MODES,
    DecoderKernels,
    conv_without_bias,
)
from bestofn.backends.sidon.loader import (
    SidonLoadError,
    fold_weight_norm,
    load_base_encoder,
    load_decoder,
    load_release,
    merge_lora,
)
from bestofn.backends.sidon.model import (
    DECODER_CHANNELS,
    DECODER_RATES,
    INPUT_SAMPLE_RATE,
    N_LAYERS,
    OUTPUT_SAMPLE_RATE,
    DACDecoder,
    DecoderBlock,
    ResidualUnit,
    SeamlessFbank,
    Snake1d,
)

__all__ = [
    "AUTOCAST_OPS",
    "DACDecoder",
    "DECODER_CHANNELS",
    "DECODER_RATES",
    "DEFAULT_LAYOUT",
    "DEFAULT_SNAKE",
    "DecoderBlock",
    "DecoderKernels",
    "INPUT_SAMPLE_RATE",
    "LAYOUTS",
    "N_LAYERS",
    "OUTPUT_SAMPLE_RATE",
    "ResidualUnit",
    "SNAKE_MODES",
    "SeamlessFbank",
    "SidonLoadError",
    "SidonRestorer",
    "Snake1d",
    "conv_without_bias",
    "fold_weight_norm",
    "load_base_encoder",
    "load_decoder",
    "load_release",
    "merge_lora",
]
