"""Production restorer: Sidon (sarulab-speech), 16 kHz in -> 48 kHz out. Declared below
(``BACKENDS``) as ``sidon``.

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

# What this package provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {
    "sidon": {
        "role": "restorer",
        "class": "SidonRestorer",
        "preload": (
            "safetensors.torch",
            "transformers:Wav2Vec2BertConfig,Wav2Vec2BertModel,SeamlessM4TFeatureExtractor",
        ),
        "preload_rank": 30,
    }
}
# facebook/w2v-bert-2.0 + sarulab-speech/sidon_raw_weight (adapter + decoder state dict),
# docs/notes/sidon-parakeet-facts.md; w2v-BERT's revision is a public pin
# (docs/notes/weights-revisions.md)
PUBLISHED_WEIGHTS = (
    {
        "name": "w2v-bert-2.0",
        "repo_id": "facebook/w2v-bert-2.0",
        "revision": "da985ba0987f70aaeb84a80f2851cfac8c697a7b",
        "allow_patterns": ("config.json", "model.safetensors", "preprocessor_config.json"),
        "folder": "w2v-bert-2.0",
        "note": "Sidon's base encoder (its first 8 layers are used)",
    },
    {
        "name": "sidon",
        "repo_id": "sarulab-speech/sidon_raw_weight",
        "revision": "unknown",
        "allow_patterns": (
            "adapter_config.json",
            "adapter_model.safetensors",
            "decoder_state_dict.pt",
        ),
        "folder": "sidon_raw_weight",
        "note": "peft LoRA adapter + DAC decoder state dict",
    },
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
