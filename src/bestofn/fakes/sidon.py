"""Sidon with random weights: w2v-BERT 2.0 (the feature cleanser's base), the Sidon LoRA adapter
and the DAC-style decoder, in memory or on disk in the raw release layout:

    w2v-bert-2.0/       config.json, model.safetensors, preprocessor_config.json
    sidon_raw_weight/   adapter_config.json, adapter_model.safetensors (peft LoRA on every
                        ffn{1,2}.output_dense of the first 8 layers), decoder_state_dict.pt
                        (DAC Decoder state dict with weight-norm g/v pairs)

Real size: the full 24-layer w2v-BERT 2.0 (Sidon keeps 8), LoRA r=64 alpha=16, decoder
1024 -> 1536 channels. Tiny: 32-wide layers (9 on disk, 8 kept; 2 in memory), r=4, 32 channels.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bestofn.backends.sidon import DECODER_CHANNELS, DECODER_RATES, N_LAYERS, DACDecoder
from bestofn.fakes import check_size

# `bestofn fake-weights` writes this backend's published checkpoint with ``write`` below
# (bestofn.fakes.weights finds this line)
FAKE_WEIGHTS = "sidon"
LORA = {"tiny": dict(r=4, alpha=16), "real": dict(r=64, alpha=16)}
DISK_LAYERS = {"tiny": N_LAYERS + 1, "real": 24}  # the release has more layers than Sidon keeps


def w2v_bert_config(tiny: bool = False, num_layers: int = N_LAYERS):
    from transformers import Wav2Vec2BertConfig

    if not tiny:  # transformers' defaults are facebook/w2v-bert-2.0's architecture
        return Wav2Vec2BertConfig(num_hidden_layers=num_layers, layerdrop=0.0)
    return Wav2Vec2BertConfig(
        hidden_size=32,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        intermediate_size=64,
        conv_depthwise_kernel_size=5,
        left_max_position_embeddings=8,
        right_max_position_embeddings=2,
        output_hidden_size=32,
        layerdrop=0.0,
    )


def build_modules(tiny: bool = False, num_layers: int = N_LAYERS, seed: int = 0):
    """(encoder, decoder) with random weights; the LoRA is taken as already merged."""
    from transformers import Wav2Vec2BertModel

    torch.manual_seed(seed)
    config = w2v_bert_config(tiny, num_layers)
    encoder = Wav2Vec2BertModel(config)
    decoder = DACDecoder(config.hidden_size, 32 if tiny else DECODER_CHANNELS, DECODER_RATES)
    return encoder, decoder


def build(device: str, size: str = "real", num_layers: int | None = None, **kw):
    """A SidonRestorer with random weights in memory: the real size (8-layer w2v-BERT 2.0 +
    1536-channel DAC decoder), or a tiny one (2 layers by default, 0.3 s tail padding)."""
    from bestofn.backends.sidon import SidonRestorer

    tiny = check_size(size)
    num_layers = num_layers or (2 if tiny else N_LAYERS)
    if tiny:
        kw.setdefault("tail_pad_s", 0.3)
    encoder, decoder = build_modules(tiny, num_layers)
    return SidonRestorer.from_modules(encoder, decoder, device=device, num_layers=num_layers, **kw)


def weight_normed_decoder(input_channel: int, channels: int, seed: int = 1) -> DACDecoder:
    """A DAC decoder whose convolutions carry weight norm, as DAC trains and saves them."""
    torch.manual_seed(seed)
    dec = DACDecoder(input_channel, channels, DECODER_RATES)
    for m in list(dec.modules()):
        if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
            torch.nn.utils.weight_norm(m)
    with torch.no_grad():  # give Snake alphas non-trivial values
        for name, p in dec.named_parameters():
            if name.endswith("alpha"):
                p.uniform_(0.5, 1.5)
    return dec.eval()


def write(out_dir, size: str = "tiny", seed: int = 0) -> dict:
    """``out_dir/w2v-bert-2.0`` and ``out_dir/sidon_raw_weight``; returns the restorer options."""
    import warnings

    from safetensors.torch import save_file
    from transformers import SeamlessM4TFeatureExtractor, Wav2Vec2BertModel

    tiny = check_size(size)
    out = Path(out_dir)
    base_dir, adapter_dir = out / "w2v-bert-2.0", out / "sidon_raw_weight"
    torch.manual_seed(seed)
    base = Wav2Vec2BertModel(w2v_bert_config(tiny, DISK_LAYERS[size])).eval()
    base.save_pretrained(base_dir)
    SeamlessM4TFeatureExtractor().save_pretrained(base_dir)

    adapter_dir.mkdir(parents=True, exist_ok=True)
    r, alpha = LORA[size]["r"], LORA[size]["alpha"]
    adapter_config = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": alpha,
        "lora_dropout": 0.1,
        "bias": "none",
        "target_modules": ["output_dense"],
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
        "task_type": None,
    }
    (adapter_dir / "adapter_config.json").write_text(json.dumps(adapter_config, indent=1))
    g = torch.Generator().manual_seed(seed + 2)
    lora = {}
    for i in range(N_LAYERS):
        for ffn in ("ffn1", "ffn2"):
            lin = getattr(base.encoder.layers[i], ffn).output_dense
            key = f"base_model.model.encoder.layers.{i}.{ffn}.output_dense"
            lora[f"{key}.lora_A.weight"] = torch.randn(r, lin.in_features, generator=g) * 0.01
            lora[f"{key}.lora_B.weight"] = torch.randn(lin.out_features, r, generator=g) * 0.01
    save_file(lora, str(adapter_dir / "adapter_model.safetensors"))

    channels = 32 if tiny else DECODER_CHANNELS
    with warnings.catch_warnings():  # torch.nn.utils.weight_norm: DAC's own (deprecated) form
        warnings.simplefilter("ignore", FutureWarning)
        decoder = weight_normed_decoder(base.config.hidden_size, channels, seed + 1)
    torch.save(decoder.state_dict(), adapter_dir / "decoder_state_dict.pt")
    return {
        "w2v_bert_dir": str(base_dir.resolve()),
        "adapter_dir": str(adapter_dir.resolve()),
        "decoder_path": str((adapter_dir / "decoder_state_dict.pt").resolve()),
    }
