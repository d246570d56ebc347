"""VoiceCLAP with random weights: a STAND-IN embedder and the two regression heads.

The real laion/voiceclap-commercial modelling code is remote code that is not public in any
source we could read, so the embedder here is our own (``remote/voiceclap``): a Whisper-Small
audio tower and a MiniLM-L6-shaped text tower projected into a 768-d joint space, exposing the
``encode_waveform`` / ``encode_text`` API the backend relies on. On disk (``write``) it is laid
out as the real checkpoint is and loaded through the same ``trust_remote_code`` path:

    voiceclap-commercial/   config.json (auto_map), configuration_voiceclap.py,
                            modeling_voiceclap.py, model.safetensors, preprocessor_config.json,
                            STAND-IN.md
    voiceclap-heads/        genu_commercial_best.pt, blend_head_commercial.pt (torch.save dicts:
                            state_dict f1/f2, mu and sd as numpy arrays, arch)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from bestofn.backends.voiceclap import BLEND_RANGE, GENUINENESS_RANGE, RegressionHead
from bestofn.fakes import check_size

REMOTE_DIR = Path(__file__).parent / "remote" / "voiceclap"
REMOTE_FILES = ("configuration_voiceclap.py", "modeling_voiceclap.py")
HEAD_HIDDEN = 64
STAND_IN_NOTE = """\
# RANDOM STAND-IN for laion/voiceclap-commercial

Written by `bestofn fake-weights` / `bestofn.fakes.voiceclap.write`. The modelling code here is
NOT VoiceCLAP's: it is a random dual-tower model with VoiceCLAP's published shapes and the API
the voiceclap scorer calls (`encode_waveform`, `encode_text`). Its scores mean nothing.
"""


def stand_in_config(tiny: bool = False) -> dict:
    """The VoiceClapConfig fields: real (BUD-E-Whisper-Small + all-MiniLM-L6-v2, 768-d joint)
    or tiny (the tiny Whisper, a 1-layer 16-wide BERT, 16-d joint, 3 s window)."""
    from bestofn.fakes.whisper import whisper_small

    wcfg, fe = whisper_small(tiny)
    audio = {
        k: getattr(wcfg, k)
        for k in ("d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
                  "num_mel_bins", "max_source_positions")
    }  # fmt: skip
    if tiny:
        text = dict(vocab_size=260, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32)  # fmt: skip
        joint = 16
    else:
        text = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                    num_attention_heads=12, intermediate_size=1536)  # fmt: skip
        joint = 768
    return {
        "audio_tower": audio,
        "text_tower": text,
        "joint_dim": joint,
        "n_mels": fe.feature_size,
        "chunk_length": fe.chunk_length,
    }


def build_model(tiny: bool = False, seed: int = 0):
    """The stand-in embedder in memory (the same class the written remote code defines)."""
    from bestofn.fakes.remote.voiceclap.configuration_voiceclap import VoiceClapConfig
    from bestofn.fakes.remote.voiceclap.modeling_voiceclap import VoiceClapModel

    torch.manual_seed(seed)
    return VoiceClapModel(VoiceClapConfig(**stand_in_config(tiny))).eval()


def random_head_checkpoint(dim: int, hidden: int = HEAD_HIDDEN, seed: int = 0) -> dict:
    """A head as published: ``state_dict`` (f1/f2), ``mu``/``sd`` as numpy arrays, ``arch``."""
    g = torch.Generator().manual_seed(seed)
    sd = {
        "f1.weight": torch.randn(hidden, dim, generator=g) * dim**-0.5,
        "f1.bias": torch.zeros(hidden),
        "f2.weight": torch.randn(1, hidden, generator=g) * hidden**-0.5,
        "f2.bias": torch.full((1,), 3.0),
    }
    # unit-norm embeddings have components ~ dim**-0.5; standardise them to ~N(0, 1)
    return {
        "state_dict": sd,
        "mu": np.zeros(dim, np.float32),
        "sd": np.full(dim, dim**-0.5, np.float32),
        "arch": {"D": dim, "H": hidden, "p": 0.0, "out": 1},
    }


def random_head(dim: int, value_range, hidden: int = HEAD_HIDDEN, seed: int = 0) -> RegressionHead:
    ck = random_head_checkpoint(dim, hidden, seed)
    return RegressionHead(ck["state_dict"], ck["mu"], ck["sd"], value_range)


def build(device: str, size: str = "real", **kw):
    """A VoiceCLAPScorer with the stand-in towers and random heads in memory (real size, or
    ``size="tiny"``, a seconds-on-CPU variant with a 3 s window)."""
    from bestofn.backends.voiceclap import VoiceCLAPScorer

    tiny = check_size(size)
    dtype = kw.pop("dtype", None) or ("bfloat16" if str(device).startswith("cuda") else "float32")
    model = build_model(tiny)
    dim = model.config.joint_dim
    return VoiceCLAPScorer.from_modules(
        model,
        random_head(dim, GENUINENESS_RANGE, seed=1),
        random_head(dim, BLEND_RANGE, seed=2),
        device=device,
        dtype=dtype,
        window_s=kw.pop("window_s", 3.0 if tiny else 30.0),
        **kw,
    )


def write(out_dir, size: str = "tiny", seed: int = 0) -> dict:
    """``out_dir/voiceclap-commercial`` (stand-in remote code + weights) and
    ``out_dir/voiceclap-heads``; returns the scorer options."""
    tiny = check_size(size)
    out = Path(out_dir)
    model_dir, heads_dir = out / "voiceclap-commercial", out / "voiceclap-heads"
    model = build_model(tiny, seed)
    model.save_pretrained(model_dir)
    model.fe.save_pretrained(model_dir)
    for name in REMOTE_FILES:
        shutil.copyfile(REMOTE_DIR / name, model_dir / name)
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["VoiceClapModel"]
    config["auto_map"] = {
        "AutoConfig": "configuration_voiceclap.VoiceClapConfig",
        "AutoModel": "modeling_voiceclap.VoiceClapModel",
    }
    config["bestofn_stand_in"] = "random weights, NOT laion/voiceclap-commercial (STAND-IN.md)"
    (model_dir / "config.json").write_text(json.dumps(config, indent=1))
    (model_dir / "STAND-IN.md").write_text(STAND_IN_NOTE)

    heads_dir.mkdir(parents=True, exist_ok=True)
    dim = model.config.joint_dim
    genu = heads_dir / "genu_commercial_best.pt"
    blend = heads_dir / "blend_head_commercial.pt"
    torch.save(random_head_checkpoint(dim, seed=seed + 1), genu)
    torch.save(random_head_checkpoint(dim, seed=seed + 2), blend)
    options = {
        "model_path": str(model_dir.resolve()),
        "genuineness_path": str(genu.resolve()),
        "blend_path": str(blend.resolve()),
    }
    if tiny:
        options["window_s"] = 3.0  # the tiny audio tower's window (the real one is 30 s)
    return options
