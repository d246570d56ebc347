"""A random STAND-IN for the MOSS-Audio-Tokenizer-v2 codec, as a remote-code directory.

The real v2 modeling code is published only next to its weights on the model hub, so the codec
directory written here holds our own small model with the v2 interface
(``remote/moss_codec/modeling_random_codec.py``: code embeddings, one linear layer, upsampling
to 3840 samples per frame, 48 kHz stereo). Both MOSS backends load it exactly as the real one
(``AutoModel.from_pretrained(dir, trust_remote_code=True)``); its decode cost is not v2's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bestofn.fakes import check_size

REMOTE_CODE = Path(__file__).parent / "remote" / "moss_codec" / "modeling_random_codec.py"
N_VQ = 12
CODEBOOK = {"tiny": 64, "real": 1024}  # the real v2 codebooks hold 1024 codes
CODE_DIM = {"tiny": 8, "real": 256}

STAND_IN_NOTE = """\
# RANDOM STAND-IN for MOSS-Audio-Tokenizer-v2

Written by `bestofn fake-weights` / `bestofn.fakes.moss_codec.write`. This is NOT the
MOSS-Audio-Tokenizer-v2 codec: `modeling_random_codec.py` is a small random model with the v2
interface (48 kHz stereo, {n_vq} codebooks of {codebook} codes, 3840 samples per frame). Audio
decoded with it is noise, and its decode time is not the real codec's.
"""


def write(out_dir, size: str = "tiny", seed: int = 0) -> Path:
    """Write the stand-in codec directory (config.json, remote code, model.safetensors)."""
    import torch
    from transformers import AutoConfig, AutoModel

    check_size(size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REMOTE_CODE, out / REMOTE_CODE.name)
    config = {
        "model_type": "bestofn_random_codec",
        "architectures": ["RandomCodecModel"],
        "auto_map": {
            "AutoConfig": "modeling_random_codec.RandomCodecConfig",
            "AutoModel": "modeling_random_codec.RandomCodecModel",
        },
        "bestofn_stand_in": "random weights, NOT MOSS-Audio-Tokenizer-v2 (see STAND-IN.md)",
        "n_vq": N_VQ,
        "codebook_size": CODEBOOK[size],
        "code_dim": CODE_DIM[size],
        "sampling_rate": 48000,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "STAND-IN.md").write_text(STAND_IN_NOTE.format(n_vq=N_VQ, codebook=CODEBOOK[size]))
    cfg = AutoConfig.from_pretrained(str(out), trust_remote_code=True, local_files_only=True)
    torch.manual_seed(seed)
    AutoModel.from_config(cfg, trust_remote_code=True).save_pretrained(str(out))
    return out
