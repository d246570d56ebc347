"""`bestofn parity --reference-code DIR` with DIR a copy of the MOSS-Audio-Tokenizer-v2 code as
vendored in vLLM-Omni (``audio_tokenizer_v2.py`` + ``configuration_moss_audio_tokenizer_v2.py``
from ``vllm_omni/model_executor/models/moss_tts/``, zzehli/vllm-omni@10906e3): our v2 codec
(``bestofn.moss.codec.tokenizer``) against that code on the same checkpoint.

Without ``--checkpoint`` the checkpoint is a tiny random v2 one written as ``bestofn
fake-weights`` writes it (``bestofn.fakes.moss_codec``), so the check covers the published
layout too: the reference is built from our config.json and loads our safetensors (v2 key
names mapped to its module names the way vLLM-Omni's loader maps them; no key may be missing
or left over). Checks:

1. decode, fp32, a batch of right-padded clips of different lengths (12 codebooks): max |diff|
   of every clip's samples within ``FP32_TOL`` x max |audio|;
2. decode, ours in bf16 against the reference in fp32: max |diff| and SNR stated, SNR at
   least ``BF16_MIN_SNR_DB`` (where this device runs bf16; else said so);
3. encode (fp32), a batch of stereo clips of different lengths: identical codes and lengths.
4. (information) the reference's one-clip chunked decode (``chunk_duration``) against its own
   one-shot decode.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch

REF_FILES = ("audio_tokenizer_v2.py", "configuration_moss_audio_tokenizer_v2.py")
FP32_TOL = 1e-5  # max |ours - reference| / max |reference|, per clip
BF16_MIN_SNR_DB = 20.0
N_VQ = 12  # what MOSS-TTS-Local decodes
# v2 checkpoint names -> the vendored module's names (the rest load as they are; the attention
# projections `self_attn.in_proj` / `out_proj` are mapped by the module's own load hook)
RENAMES = ((".ffn.0.", ".linear1."), (".ffn.2.", ".linear2."))


def is_v2_codec_code(ref_dir) -> bool:
    return all((Path(ref_dir) / f).is_file() for f in REF_FILES)


def reference_module(ref_dir: Path):
    """``audio_tokenizer_v2`` of a copy, imported as a package (its relative import works)."""
    name = (
        "_moss_codec_v2_reference_" + hashlib.sha1(str(ref_dir.resolve()).encode()).hexdigest()[:8]
    )
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(ref_dir)]
        sys.modules[name] = pkg
    return importlib.import_module(f"{name}.audio_tokenizer_v2")


def load_reference(ref_dir: Path, codec_dir: Path, device: str = "cpu"):
    """The vendored v2 model built from ``codec_dir/config.json`` with its safetensors, fp32."""
    from bestofn.moss.codec.checkpoint import Checkpoint

    mod = reference_module(Path(ref_dir))
    cfg_cls = importlib.import_module(
        mod.__name__.rsplit(".", 1)[0] + ".configuration_moss_audio_tokenizer_v2"
    )
    raw = json.loads((Path(codec_dir) / "config.json").read_text())
    model = mod.MossAudioTokenizerModel(cfg_cls.MossAudioTokenizerConfig(**raw)).eval()
    ck = Checkpoint(Path(codec_dir))
    state = {}
    for key in ck.where:
        name = key
        for a, b in RENAMES:
            name = name.replace(a, b)
        state[name] = ck.get(key)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(
            f"{codec_dir}: the reference found missing keys {missing[:5]} and unexpected keys "
            f"{unexpected[:5]}: our checkpoint is not in the published v2 layout"
        )
    return model.to(device)


def _clips(lengths, codebook, seed=0, n_vq=N_VQ):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, codebook, (n, n_vq), generator=g) for n in lengths]


def reference_decode(model, clips, device="cpu", chunk_duration=None) -> list[np.ndarray]:
    """The reference's batched one-shot decode (or one clip with ``chunk_duration``):
    codes [nq, B, T] + padding mask -> per clip (S, channels) float32."""
    T = max(int(c.shape[0]) for c in clips)
    grid = torch.zeros(clips[0].shape[1], len(clips), T, dtype=torch.long)
    mask = torch.zeros(len(clips), T, dtype=torch.bool)
    for i, c in enumerate(clips):
        grid[:, i, : len(c)] = c.T
        mask[i, : len(c)] = True
    with torch.no_grad():
        out = model.decode(
            grid.to(device), padding_mask=mask.to(device), return_dict=True,
            chunk_duration=chunk_duration,
        )  # fmt: skip
    return [
        out.audio[i, :, : int(out.audio_lengths[i])].float().T.cpu().numpy()
        for i in range(len(clips))
    ]


def snr_db(ref: np.ndarray, x: np.ndarray) -> float:
    den = float(((ref.astype(np.float64) - x) ** 2).sum())
    return (
        float("inf")
        if den == 0
        else float(10 * np.log10((ref.astype(np.float64) ** 2).sum() / den))
    )


def run_codec_parity(codec_dir: Path, ref_dir: Path, device: str = "cpu") -> tuple[bool, list]:
    from bestofn.moss.codec.tokenizer import MossAudioTokenizer

    model = load_reference(ref_dir, codec_dir, device)
    ours = MossAudioTokenizer(codec_dir, device=device, compute_dtype="fp32", n_vq=N_VQ)
    codebook = ours.config.codebook_size
    lengths = [40, 25, 7, 33]
    clips = _clips(lengths, codebook, seed=1)
    theirs = reference_decode(model, clips, device)
    mine = ours.decode(clips)
    lines, ok = [], True
    worst = 0.0
    for a, b in zip(theirs, mine, strict=True):
        if a.shape != b.shape:
            ok = False
            lines.append(f"decode fp32: shape {b.shape}, reference {a.shape}  MISMATCH")
            continue
        worst = max(worst, float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30)))
    good = worst <= FP32_TOL
    ok &= good
    lines.append(
        f"decode fp32, clips of {lengths} frames x {N_VQ} codebooks: max |diff| / max |audio| "
        f"{worst:.2e} (tolerance {FP32_TOL:g})  {'ok' if good else 'MISMATCH'}"
    )

    bf16 = MossAudioTokenizer(codec_dir, device=device, compute_dtype="bf16", n_vq=N_VQ)
    if bf16.dtype != torch.bfloat16:
        lines.append(f"decode bf16: not run (this device computes in {bf16.dtype})")
    else:
        low = bf16.decode(clips)
        snr = min(snr_db(a, b) for a, b in zip(theirs, low, strict=True))
        diff = max(float(np.abs(a - b).max()) for a, b in zip(theirs, low, strict=True))
        mad = float(np.mean([np.abs(a - b).mean() for a, b in zip(theirs, low, strict=True)]))
        good = snr >= BF16_MIN_SNR_DB
        ok &= good
        lines.append(
            f"decode ours bf16 vs reference fp32: min SNR {snr:.1f} dB (at least "
            f"{BF16_MIN_SNR_DB:g}), max |diff| {diff:.2e}, mean |diff| {mad:.2e} (PCM full "
            f"scale 1)  {'ok' if good else 'MISMATCH'}"
        )

    g = torch.Generator().manual_seed(4)
    hop = ours.hop
    n_samples = [12 * hop + 100, 5 * hop, 3 * hop + 7]
    wavs = [0.1 * torch.randn(2, n, generator=g) for n in n_samples]
    with torch.no_grad():
        enc = model.batch_encode([w.to(device) for w in wavs], num_quantizers=N_VQ)
    S = max(n_samples)
    padded = torch.stack([torch.nn.functional.pad(w, (0, S - w.shape[1])).T for w in wavs])
    codes, code_lengths = ours.encode_padded(padded, torch.tensor(n_samples))
    same_len = code_lengths.cpu().tolist() == enc.audio_codes_lengths.cpu().tolist()
    same = same_len and all(
        torch.equal(codes[i, :n].cpu(), enc.audio_codes[:, i, :n].T.cpu())
        for i, n in enumerate(code_lengths.tolist())
    )
    ok &= same
    lines.append(
        f"encode fp32, stereo clips of {n_samples} samples: code lengths "
        f"{code_lengths.tolist()}, codes {'identical' if same else 'DIFFER'}  "
        f"{'ok' if same else 'MISMATCH'}"
    )

    # the published one-clip path: chunks of the largest whole-frame duration <= 8 s allowed
    clip = clips[0]
    chunk_frames = min(8 * 125 // 10, len(clip) // 3)
    chunk = chunk_frames * hop / ours.sample_rate
    try:
        chunked = reference_decode(model, [clip], device, chunk_duration=chunk)[0]
        lines.append(
            f"(info) reference chunked decode ({chunk_frames}-frame chunks) vs its one-shot: "
            f"SNR {snr_db(theirs[0], chunked):.1f} dB, first chunk max |diff| "
            f"{np.abs(theirs[0][: chunk_frames * hop] - chunked[: chunk_frames * hop]).max():.1e}"
        )
    except Exception as e:  # noqa: BLE001 - information only
        lines.append(f"(info) reference chunked decode not run: {type(e).__name__}: {e}")
    return ok, lines


def codec_parity_main(args, tmp: Path) -> int:
    from bestofn.fakes import moss_codec
    from bestofn.parity.reference_code import report

    if args.checkpoint is None:
        codec_dir = moss_codec.write(tmp / "MOSS-Audio-Tokenizer-v2", "tiny", seed=0)
        what = "tiny random v2 checkpoint (bestofn fake-weights layout)"
    else:
        codec_dir, what = args.checkpoint, str(args.checkpoint)
    ok, lines = run_codec_parity(Path(codec_dir), Path(args.reference_code), args.device)
    return report(ok, lines, f"MOSS-Audio-Tokenizer-v2 ours vs vLLM-Omni's vendored code on {what}")
