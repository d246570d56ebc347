"""`python -m bestofn.bench codec`: MOSS-Audio-Tokenizer decode, seconds per clip, in one run:

- our batched decode (``bestofn.moss.audio_tokenizer``) at ``--batch`` clips per call in each
  of ``--dtypes`` (fp32, bf16, fp8; fp8 only where the GPU has fp8 matmuls, else the row says
  why it was refused; fp8w: fp8-stored weights upcast to bf16 per layer), from codes in to
  numpy audio out (host copies count);
- one clip at a time: the published processor's path (``decode(codes[nq, 1, T],
  chunk_duration=8)``, fp32, as ``MossTTSDelayProcessor.decode_audio_codes`` calls it, per
  clip) when ``--reference-code`` holds the published modelling code and transformers loads
  it; our own fp32 decode with batch 1 always;
- per row: peak device memory (CUDA; weights included), decode-weight bytes, and the SNR of
  the audio against our fp32 batched decode of the same codes.

Random codes on random weights (``bestofn.fakes.moss_audio_tokenizer``, ``--size real`` is the
published architecture) unless ``--codec-dir`` names a checkpoint. The cost does not depend on
the code values. Every clip is ``--seconds`` long (15 s = 188 frames).

    python -m bestofn.bench codec --size real --device cuda --batch 64 --out codec.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REF_FILES = (
    "__init__.py",
    "configuration_moss_audio_tokenizer.py",
    "modeling_moss_audio_tokenizer.py",
)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device: str, repeats: int) -> tuple[float, object]:
    out = fn()  # warm-up: kernels, allocator, caches
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def _snr_db(ref: list[np.ndarray], out: list[np.ndarray]) -> float:
    num = sum(float((r.astype(np.float64) ** 2).sum()) for r in ref)
    den = sum(
        float(((r.astype(np.float64) - o.reshape(r.shape)) ** 2).sum())
        for r, o in zip(ref, out, strict=True)
    )
    return float("inf") if den == 0 else 10 * math.log10(num / den)


def _mem_start(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _mem_peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def _chunk_duration(cfg: dict) -> float:
    """The processor's 8 s, or the longest whole-frame chunk the checkpoint allows."""
    rate, hop = int(cfg["sampling_rate"]), int(cfg["downsample_rate"])
    limit = min(8.0, float(cfg.get("causal_transformer_context_duration", 10.0)))
    frames = max(1, int(limit * rate / hop + 1e-9))
    return frames * hop / rate


def _reference_model(codec_dir: Path, ref_code: Path, device: str, work: Path):
    """The published model (fp32) from ``codec_dir``'s weights + the published code, or the
    reason it could not be loaded."""
    missing = [f for f in REF_FILES if not (ref_code / f).is_file()]
    if missing:
        return None, f"{ref_code} lacks {', '.join(missing)}"
    try:
        from transformers import AutoModel
    except ImportError as e:
        return None, f"transformers not importable ({e})"
    d = work / "reference"
    d.mkdir(parents=True, exist_ok=True)
    for f in codec_dir.iterdir():  # link the weights, copy the small files
        if f.suffix == ".safetensors":
            (d / f.name).unlink(missing_ok=True)
            (d / f.name).symlink_to(f.resolve())
        elif f.is_file():
            shutil.copyfile(f, d / f.name)
    for f in REF_FILES:
        shutil.copyfile(ref_code / f, d / f)
    try:
        model = AutoModel.from_pretrained(str(d), trust_remote_code=True, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - reported in the table, the rest still runs
        return None, f"published code failed to load: {type(e).__name__}: {e}"
    return model.to(device).eval(), None


def run(args) -> dict:
    from bestofn.fakes import moss_audio_tokenizer as fake
    from bestofn.moss.audio_tokenizer import AudioTokenizerError, MossAudioTokenizer

    device = args.device
    work = Path(args.work or tempfile.mkdtemp(prefix="bestofn-codec-bench-"))
    if args.codec_dir:
        codec_dir = Path(args.codec_dir)
    else:
        codec_dir = work / f"MOSS-Audio-Tokenizer-{args.size}"
        if not (codec_dir / "config.json").is_file():
            t0 = time.perf_counter()
            fake.write(codec_dir, args.size, seed=0)
            took = time.perf_counter() - t0
            print(f"random {args.size} checkpoint written to {codec_dir} in {took:.0f} s")
    cfg = json.loads((codec_dir / "config.json").read_text())
    q = cfg["quantizer_kwargs"]
    n_vq = args.n_vq or int(q["num_quantizers"])
    frames = round(args.seconds * cfg["sampling_rate"] / cfg["downsample_rate"])
    g = torch.Generator().manual_seed(0)
    clips = [
        torch.randint(0, int(q["codebook_size"]), (frames, n_vq), generator=g)
        for _ in range(args.batch)
    ]
    meta = {
        "bench": "codec",
        "command": args.argv,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "device": torch.cuda.get_device_name()
        if device.startswith("cuda")
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "codec_dir": str(codec_dir),
        "size": None if args.codec_dir else args.size,
        "clips": args.batch,
        "seconds_per_clip": frames * cfg["downsample_rate"] / cfg["sampling_rate"],
        "frames_per_clip": frames,
        "n_vq": n_vq,
        "repeats": args.repeats,
        "random_weights": not bool(args.codec_dir),
    }
    rows: list[dict] = []
    reference_audio = None

    def add(name, batch, dtype, **kw):
        row = {"path": name, "batch": batch, "dtype": dtype, **kw}
        rows.append(row)
        s = row.get("s_per_clip")
        print(
            f"{name:<28} batch {batch:>3} {dtype:<5} "
            + (f"{s:.4f} s/clip" if s is not None else row.get("status", ""))
            + (f"  peak {row['peak_gib']:.2f} GiB" if row.get("peak_gib") is not None else "")
            + (f"  SNR {row['snr_db']:.1f} dB" if row.get("snr_db") is not None else ""),
            flush=True,
        )

    for dtype in args.dtypes.split(","):
        _mem_start(device)
        try:
            t0 = time.perf_counter()
            # fp8w: fp8-stored weights upcast per layer to bf16 (memory dial, any device)
            compute, weights = ("bf16", "fp8") if dtype == "fp8w" else (dtype, None)
            codec = MossAudioTokenizer(
                codec_dir,
                device=device,
                compute_dtype=compute,
                weight_dtype=weights,
                n_vq=n_vq,
                decode_batch_size=args.batch,
            )
            load_s = time.perf_counter() - t0
        except AudioTokenizerError as e:
            add("ours batched", args.batch, dtype, status=f"refused: {e}")
            continue
        t, audio = _timed(lambda codec=codec: codec.decode(clips), device, args.repeats)
        if reference_audio is None and dtype == "fp32":
            reference_audio = audio
        add(
            "ours batched",
            args.batch,
            dtype,
            s_per_clip=t / len(clips),
            s_per_call=t,
            load_s=load_s,
            peak_gib=_mem_peak_gib(device),
            weight_gib=codec.weight_bytes() / 2**30,
            snr_db=_snr_db(reference_audio, audio) if reference_audio is not None else None,
        )
        del codec, audio
    if reference_audio is None:
        print("(no fp32 row: SNRs below are not computed)")

    n1 = min(args.one_clip_n, len(clips))
    _mem_start(device)
    single = MossAudioTokenizer(
        codec_dir, device=device, compute_dtype="fp32", n_vq=n_vq, decode_batch_size=1
    )
    t, audio = _timed(lambda s=single: [s.decode([c])[0] for c in clips[:n1]], device, args.repeats)
    add(
        "ours one clip at a time",
        1,
        "fp32",
        s_per_clip=t / n1,
        clips_timed=n1,
        peak_gib=_mem_peak_gib(device),
        snr_db=_snr_db(reference_audio[:n1], audio) if reference_audio is not None else None,
    )
    del single

    if args.reference_code:
        _mem_start(device)
        model, why = _reference_model(codec_dir, Path(args.reference_code), device, work)
        if model is None:
            add("published processor path", 1, "fp32", status=f"not run: {why}")
        else:
            chunk = _chunk_duration(cfg)

            def one_at_a_time():
                out = []
                with torch.no_grad():
                    for c in clips[:n1]:
                        codes = c.T[:, None, :].to(device)
                        mask = torch.ones(1, c.shape[0], dtype=torch.bool, device=device)
                        res = model.decode(
                            codes, padding_mask=mask, return_dict=True, chunk_duration=chunk
                        )
                        n = int(res.audio_lengths[0])
                        out.append(res.audio[0, 0, :n].to(torch.float32).cpu().numpy())
                return out

            t, audio = _timed(one_at_a_time, device, args.repeats)
            add(
                "published processor path",
                1,
                "fp32",
                s_per_clip=t / n1,
                clips_timed=n1,
                chunk_duration=chunk,
                peak_gib=_mem_peak_gib(device),
                # differs from one-shot decoding after the first chunk by design: a streamed
                # chunk's first steps see fewer past steps (see docs/notes/moss-facts.md)
                snr_db=_snr_db(reference_audio[:n1], audio)
                if reference_audio is not None
                else None,
            )
            del model
    return {"meta": meta, "rows": rows}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bestofn.bench codec", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--codec-dir", help="a MOSS-Audio-Tokenizer checkpoint (default: random weights)"
    )
    p.add_argument(
        "--size", default="real", choices=("tiny", "real"), help="random checkpoint size"
    )
    p.add_argument(
        "--work", help="where the random checkpoint is written/reused (default: a temp dir)"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--dtypes",
        default="fp32,bf16,fp8,fp8w",
        help="fp32, bf16, fp8 (fp8 matmuls), fp8w (fp8-stored weights, bf16 compute); fp32 first",
    )
    p.add_argument("--batch", type=int, default=64, help="clips per batched call")
    p.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="clip length (default 15; tiny: 0.04 s = 60 frames, its hop is 16 samples)",
    )
    p.add_argument("--n-vq", type=int, default=None, help="codebooks (default: all)")
    p.add_argument("--one-clip-n", type=int, default=8, help="clips timed one at a time")
    p.add_argument("--repeats", type=int, default=3, help="timed calls after one warm-up (median)")
    p.add_argument(
        "--reference-code", help="the published modelling code (e.g. .ref/moss_audio_tokenizer)"
    )
    p.add_argument("--out", help="write the rows and run metadata as JSON here")
    args = p.parse_args(argv)
    args.argv = "python -m bestofn.bench codec " + " ".join(argv)
    if args.seconds is None:
        args.seconds = 0.04 if args.size == "tiny" and not args.codec_dir else 15.0
    result = run(args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"wrote {args.out}")
    return 0
