"""VoiceCLAP with random weights, in laion/voiceclap-commercial's published folder layout.

The published modelling code (``modeling_voiceclap.py``) is not in any public source we could
read, so the remote code written here is ours, built from the published description
(``remote/voiceclap``; docs/notes/scorers-facts.md): a Whisper-small-style audio tower and a
MiniLM-L6-shaped text tower, each mean-pooled and projected into a 768-d joint space, with the
API LAION's own code calls (``encode_waveform(wav)``, ``encode_text(input_ids,
attention_mask)``). UNKNOWN, and our choice here: the key names inside the towers, the audio
projection's hidden width. On disk (``write``), the published file set:

    voiceclap-commercial/   config.json (model_type voiceclap-small, auto_map),
                            configuration_voiceclap.py, modeling_voiceclap.py,
                            model.safetensors, preprocessor_config.json (WhisperFeatureExtractor),
                            tokenizer.json, tokenizer_config.json (a BERT WordPiece tokenizer;
                            its vocabulary is made up), RANDOM_WEIGHTS.md
    voiceclap-heads/        genu_commercial_best.pt, blend_head_commercial.pt (torch.save dicts:
                            arch, state_dict f1/f2, mu and sd as numpy arrays)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from bestofn.backends.voiceclap import BLEND_RANGE, GENUINENESS_RANGE, RegressionHead
from bestofn.fakes import check_size

# `bestofn fake-weights` writes this backend's published checkpoint with ``write`` below
# (bestofn.fakes.weights finds this line)
FAKE_WEIGHTS = "voiceclap"
REMOTE_DIR = Path(__file__).parent / "remote" / "voiceclap"
REMOTE_FILES = ("configuration_voiceclap.py", "modeling_voiceclap.py")
HEAD_HIDDEN = 64
NOTE = """\
# RANDOM weights in the layout of laion/voiceclap-commercial

Written by `bestofn fake-weights` / `bestofn.fakes.voiceclap.write`. The modelling code here is
ours, written from VoiceCLAP's published description (the published code is not public): the
towers' key names and the audio projection's hidden width are unknown and ours. Its scores mean
nothing.
"""


def model_config(tiny: bool = False) -> dict:
    """The VoiceClapConfig fields: real (12 x 768 audio tower, MiniLM-L6 text tower, 768-d joint
    space, 30-s chunks) or tiny (one 16-wide layer per tower, 16-d joint, 3-s chunks)."""
    if not tiny:
        return {}  # the defaults are the published sizes
    return dict(
        n_mels=80, n_ctx=150, n_state=16, n_head=2, n_layer=1,
        text_vocab_size=len(vocabulary(True)),
        text_hidden_size=16, text_num_layers=1, text_num_heads=2, text_intermediate_size=32,
        text_max_positions=64, text_proj_hidden=24, audio_proj_hidden=16, embed_dim=16,
        chunk_seconds=3,
    )  # fmt: skip


def vocabulary(tiny: bool) -> list[str]:
    """A made-up WordPiece vocabulary: BERT's specials, characters, and fillers up to MiniLM's
    30522 entries at real size (the published vocabulary is not ours to ship)."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = [chr(c) for c in range(33, 127)]
    words = ["a", "voice", "calm", "angry", "warm", "loud", "sharp", "speaking", "slowly"]
    vocab = specials + chars + [f"##{c}" for c in chars if c.isalnum()] + words
    if not tiny:
        vocab += [f"[unused{i}]" for i in range(30522 - len(vocab))]
    return vocab


def write_tokenizer(model_dir: Path, tiny: bool) -> None:
    from transformers import BertTokenizerFast

    vocab = model_dir / "vocab.txt"
    vocab.write_text("\n".join(vocabulary(tiny)) + "\n")
    BertTokenizerFast(vocab_file=str(vocab), do_lower_case=True).save_pretrained(model_dir)


def build_model(tiny: bool = False, seed: int = 0):
    """The embedder in memory (the same class the written remote code defines)."""
    from bestofn.fakes.remote.voiceclap.configuration_voiceclap import VoiceClapConfig
    from bestofn.fakes.remote.voiceclap.modeling_voiceclap import VoiceClapModel

    torch.manual_seed(seed)
    return VoiceClapModel(VoiceClapConfig(**model_config(tiny))).eval()


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


def tokenizer(tiny: bool):
    """The made-up BERT tokenizer in memory (written to a temporary folder and read back)."""
    import tempfile

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        write_tokenizer(Path(tmp), tiny)
        return AutoTokenizer.from_pretrained(tmp)


def build(device: str, size: str = "real", **kw):
    """A VoiceCLAPScorer with random towers and heads in memory (real size, or ``size="tiny"``,
    a seconds-on-CPU variant with a 3 s window)."""
    from bestofn.backends.voiceclap import VoiceCLAPScorer

    tiny = check_size(size)
    dtype = kw.pop("dtype", None) or ("bfloat16" if str(device).startswith("cuda") else "float32")
    model = build_model(tiny)
    dim = model.config.embed_dim
    return VoiceCLAPScorer.from_modules(
        model,
        tokenizer(tiny),
        random_head(dim, GENUINENESS_RANGE, seed=1),
        random_head(dim, BLEND_RANGE, seed=2),
        device=device,
        dtype=dtype,
        window_s=kw.pop("window_s", 3.0 if tiny else 30.0),
        **kw,
    )


def write(out_dir, size: str = "tiny", seed: int = 0) -> dict:
    """``out_dir/voiceclap-commercial`` (our remote code + random weights) and
    ``out_dir/voiceclap-heads``; returns the scorer options."""
    from transformers import WhisperFeatureExtractor

    tiny = check_size(size)
    out = Path(out_dir)
    model_dir, heads_dir = out / "voiceclap-commercial", out / "voiceclap-heads"
    model = build_model(tiny, seed)
    model.save_pretrained(model_dir)
    cfg = model.config
    WhisperFeatureExtractor(
        feature_size=cfg.n_mels, sampling_rate=cfg.sample_rate, chunk_length=cfg.chunk_seconds
    ).save_pretrained(model_dir)
    write_tokenizer(model_dir, tiny)
    for name in REMOTE_FILES:
        shutil.copyfile(REMOTE_DIR / name, model_dir / name)
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["VoiceClapModel"]
    config["auto_map"] = {
        "AutoConfig": "configuration_voiceclap.VoiceClapConfig",
        "AutoModel": "modeling_voiceclap.VoiceClapModel",
    }
    config["bestofn_random_weights"] = "our modelling code, random weights (RANDOM_WEIGHTS.md)"
    (model_dir / "config.json").write_text(json.dumps(config, indent=1))
    (model_dir / "RANDOM_WEIGHTS.md").write_text(NOTE)

    heads_dir.mkdir(parents=True, exist_ok=True)
    dim = cfg.embed_dim
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
        options["window_s"] = 3.0  # the tiny audio tower's chunk (the real one is 30 s)
    return options
