"""`python -m lab.bench codec`: MOSS-Audio-Tokenizer (``--version v1``, the 24 kHz codec of
MOSS-TTS Delay, or ``v2``, the 48 kHz stereo codec of MOSS-TTS-Local) decode, seconds per
clip, in one run:

- our batched decode (``bestofn.moss.codec.tokenizer``) at ``--batch`` clips per call in each
  of ``--dtypes`` (fp32, bf16, fp8; fp8 only where the GPU has fp8 matmuls, else the row says
  why it was refused; fp8w: fp8-stored weights upcast to bf16 per layer), from codes in to
  numpy audio out (host copies count); the non-fp32 rows once per ``--kernels`` (the decoder's
  eager or compiled pieces) and each row once per ``--decode-batches`` (clips per forward
  pass); ``--profile`` adds each row's top ops of one call;
- one clip at a time: the published processor's path (``decode(codes[nq, 1, T],
  chunk_duration=8)``, as the processors' ``decode_audio_codes`` call it, per clip) when
  ``--reference-code`` holds the published modelling code (v1: OpenMOSS/MOSS-Audio-Tokenizer;
  v2: the copy vendored in vLLM-Omni, which also gets a row for its one-shot batched decode,
  ``decode(codes[nq, B, T], padding_mask)``; on CUDA that code runs under bf16 autocast); our
  own fp32 decode with batch 1 always;
- per row: peak device memory (CUDA; weights included), decode-weight bytes, and the SNR of
  the audio against our fp32 batched decode of the same codes.

Random codes on random weights (``bestofn.fakes.moss_audio_tokenizer`` for v1,
``bestofn.fakes.moss_codec`` for v2; ``--size real`` is the published architecture) unless
``--codec-dir`` names a checkpoint. The cost does not depend on the code values. Every clip is
``--seconds`` long (15 s = 188 frames); v2 decodes ``--n-vq`` 12 codebooks by default, as
MOSS-TTS-Local does.

    python -m lab.bench codec --size real --device cuda --batch 64 --out codec.json
    python -m lab.bench codec --version v2 --size real --dtypes fp32,bf16 --out v2.json
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

from lab.kernel_profile import top_ops

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


def _profile(codec, clips, device: str, top: int = 25) -> list[str]:
    """One decode call under torch.profiler: the ``top`` ops by device time, as table lines
    (where a decode's time goes: GEMMs, attention, the elementwise passes)."""
    lines = top_ops(lambda: codec.decode(clips), device, top)
    print("\n".join(lines), flush=True)
    return lines


def _chunk_duration(cfg: dict) -> float:
    """The processor's 8 s, or the longest whole-frame chunk the checkpoint allows."""
    rate, hop = int(cfg["sampling_rate"]), int(cfg["downsample_rate"])
    limit = min(8.0, float(cfg.get("causal_transformer_context_duration", 10.0)))
    frames = max(1, int(limit * rate / hop + 1e-9))
    return frames * hop / rate


def _reference_model(codec_dir: Path, ref_code: Path, device: str, work: Path, version="v1"):
    """The published model (fp32) from ``codec_dir``'s weights + the published code, or the
    reason it could not be loaded."""
    if version == "v2":
        from bestofn.parity.codec import REF_FILES as V2_FILES
        from bestofn.parity.codec import load_reference

        missing = [f for f in V2_FILES if not (ref_code / f).is_file()]
        if missing:
            return None, f"{ref_code} lacks {', '.join(missing)}"
        try:
            return load_reference(ref_code, codec_dir, device).eval(), None
        except Exception as e:  # noqa: BLE001 - reported in the table, the rest still runs
            return None, f"vendored v2 code failed to load: {type(e).__name__}: {e}"
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


def _chunk_note() -> str:
    from bestofn.moss.stream import CHUNK_FRAMES, FIRST_CHUNK_FRAMES, OVERLAP_FRAMES

    return f"first {FIRST_CHUNK_FRAMES} frames, then {CHUNK_FRAMES}; left overlap {OVERLAP_FRAMES}"


def _stream_chunks(codec, clips, exact: bool) -> list[np.ndarray]:
    """Every clip decoded in the chunks ``bestofn serve`` emits (all clips' chunks in one call
    per step): ``exact``, the new frames through the codec's stream decoder (per-request
    caches, what serve runs for our codecs); else windows with the left overlap."""
    from bestofn.moss.stream import CHUNK_FRAMES, FIRST_CHUNK_FRAMES, OVERLAP_FRAMES, decode_window

    T = min(int(c.shape[0]) for c in clips)
    parts: list[list[np.ndarray]] = [[] for _ in clips]
    sd = codec.stream_decoder(len(clips)) if exact else None
    for slot in range(len(clips) if exact else 0):
        sd.reset(slot)
    emitted = 0
    while emitted < T:
        end = min(T, emitted + (FIRST_CHUNK_FRAMES if emitted == 0 else CHUNK_FRAMES))
        if exact:
            out = sd.decode({i: c[emitted:end] for i, c in enumerate(clips)})
            audios = [out[i] for i in range(len(clips))]
        else:
            w0 = max(0, emitted - OVERLAP_FRAMES)
            audios = decode_window(codec, [c[w0:end] for c in clips], [emitted - w0] * len(clips))
        for part, a in zip(parts, audios, strict=True):
            part.append(a)
        emitted = end
    return [np.concatenate(p) for p in parts]


def _max_diff(ref: list[np.ndarray], out: list[np.ndarray]) -> float:
    return max(float(np.abs(r - o.reshape(r.shape)).max()) for r, o in zip(ref, out, strict=True))


def _reference_decode(model, clips, device, chunk=None) -> list[np.ndarray]:
    """The published decode: codes [nq, B, T] + padding mask (one clip when ``chunk``)."""
    T = max(int(c.shape[0]) for c in clips)
    codes = torch.zeros(clips[0].shape[1], len(clips), T, dtype=torch.long)
    mask = torch.zeros(len(clips), T, dtype=torch.bool)
    for i, c in enumerate(clips):
        codes[:, i, : c.shape[0]] = c.T
        mask[i, : c.shape[0]] = True
    with torch.no_grad():
        res = model.decode(
            codes.to(device), padding_mask=mask.to(device), return_dict=True,
            chunk_duration=chunk,
        )  # fmt: skip
        audio = res.audio.float().cpu().numpy()  # [B, channels, S]
    return [audio[i, :, : int(n)].T.copy() for i, n in enumerate(res.audio_lengths.tolist())]


def _reference_rows(model, clips, n1, cfg, device, args, add, reference_audio) -> None:
    """The published code's rows: v2's one-shot batched decode, then (both versions) the
    processor's path, one clip at a time with ``chunk_duration``."""
    # on CUDA the vendored v2 decode runs under bf16 autocast (its own choice); on CPU fp32
    precision = "bf16-autocast" if args.version == "v2" and device.startswith("cuda") else "fp32"

    def snr(audio):
        if reference_audio is None:
            return None
        return _snr_db(reference_audio[: len(audio)], audio)

    if args.version == "v2":
        _mem_start(device)
        t, audio = _timed(lambda: _reference_decode(model, clips, device), device, args.repeats)
        add("published one-shot batched", len(clips), precision, s_per_clip=t / len(clips),
            s_per_call=t, peak_gib=_mem_peak_gib(device), snr_db=snr(audio))  # fmt: skip
    chunk = _chunk_duration(cfg)
    _mem_start(device)
    t, audio = _timed(
        lambda: [_reference_decode(model, [c], device, chunk)[0] for c in clips[:n1]],
        device,
        args.repeats,
    )
    # differs from one-shot decoding by design: a streamed chunk's steps see fewer past steps
    # than the window (a ring cache of `context` entries; see docs/notes/moss-facts.md)
    add("published processor path", 1, precision, s_per_clip=t / n1, clips_timed=n1,
        chunk_duration=chunk, peak_gib=_mem_peak_gib(device), snr_db=snr(audio))  # fmt: skip


def run(args) -> dict:
    from bestofn.fakes import moss_audio_tokenizer, moss_codec
    from bestofn.moss.codec.tokenizer import AudioTokenizerError, MossAudioTokenizer
    from bestofn.ops.ab import is_random_checkpoint

    device = args.device
    v2 = args.version == "v2"
    fake = moss_codec if v2 else moss_audio_tokenizer
    work = Path(args.work or tempfile.mkdtemp(prefix="bestofn-codec-bench-"))
    if args.codec_dir:
        codec_dir = Path(args.codec_dir)
    else:
        codec_dir = work / f"MOSS-Audio-Tokenizer{'-v2' if v2 else ''}-{args.size}"
        if not (codec_dir / "config.json").is_file():
            t0 = time.perf_counter()
            fake.write(codec_dir, args.size, seed=0)
            took = time.perf_counter() - t0
            print(f"random {args.size} checkpoint written to {codec_dir} in {took:.0f} s")
    cfg = json.loads((codec_dir / "config.json").read_text())
    q = cfg["quantizer_kwargs"]
    n_vq = args.n_vq or (12 if v2 else int(q["num_quantizers"]))
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
        "version": args.version,
        "size": None if args.codec_dir else args.size,
        "clips": args.batch,
        "seconds_per_clip": frames * cfg["downsample_rate"] / cfg["sampling_rate"],
        "frames_per_clip": frames,
        "n_vq": n_vq,
        "repeats": args.repeats,
        # a --codec-dir may be random too (fake-weights' codec): say what its markers say
        "random_weights": is_random_checkpoint(codec_dir),
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

    eager_bf16 = None  # the audio of the first eager bf16 row: compiled rows compare to it
    for dtype in args.dtypes.split(","):
        for kernels in ["eager"] if dtype == "fp32" else args.kernels.split(","):
            for per_call in [int(b) for b in args.decode_batches.split(",")]:
                name = f"ours batched ({kernels})"
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
                        decode_batch_size=per_call,
                        kernels=kernels,
                    )
                    load_s = time.perf_counter() - t0
                except AudioTokenizerError as e:
                    add(name, per_call, dtype, status=f"refused: {e}")
                    continue
                t0 = time.perf_counter()
                codec.decode(clips[:per_call])  # the first call compiles (compiled kernels)
                _sync(device)
                first_s = time.perf_counter() - t0
                t, audio = _timed(lambda codec=codec: codec.decode(clips), device, args.repeats)
                if reference_audio is None and dtype == "fp32":
                    reference_audio = audio
                if eager_bf16 is None and dtype == "bf16" and kernels == "eager":
                    eager_bf16 = audio
                prof = _profile(codec, clips[:per_call], device) if args.profile else None
                add(
                    name,
                    per_call,
                    dtype,
                    kernels=codec.kernels,
                    s_per_clip=t / len(clips),
                    s_per_call=t * per_call / len(clips),
                    load_s=load_s,
                    first_call_s=first_s,
                    peak_gib=_mem_peak_gib(device),
                    weight_gib=codec.weight_bytes() / 2**30,
                    snr_db=_snr_db(reference_audio, audio) if reference_audio is not None else None,
                    snr_vs_eager_bf16_db=_snr_db(eager_bf16, audio)
                    if eager_bf16 is not None and audio is not eager_bf16
                    else None,
                    profile=prof,
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
    # the chunks `bestofn serve` decodes (bestofn.moss.stream) against the one-shot fp32
    # decode: exact (per-request caches, serve's path for our codecs; fp32 shows the chunking
    # alone, bf16 serve's default precision) and the overlap windows other codecs get
    ref = reference_audio[:n1] if reference_audio is not None else None
    for name, exact, dtype in (
        ("ours serve stream (exact)", True, "fp32"),
        ("ours serve stream (exact)", True, "bf16"),
        ("ours overlap-window chunks", False, "fp32"),
    ):
        _mem_start(device)
        stream = MossAudioTokenizer(codec_dir, device=device, compute_dtype=dtype, n_vq=n_vq,
                                    decode_batch_size=args.batch)  # fmt: skip
        t, audio = _timed(
            lambda s=stream, e=exact: _stream_chunks(s, clips[:n1], e), device, args.repeats
        )
        add(name, n1, dtype, s_per_clip=t / n1, clips_timed=n1,
            peak_gib=_mem_peak_gib(device), chunks=_chunk_note(),
            snr_db=_snr_db(ref, audio) if ref else None,
            max_abs_diff=_max_diff(ref, audio) if ref else None)  # fmt: skip
        del stream
    del single

    if args.reference_code:
        _mem_start(device)
        model, why = _reference_model(
            codec_dir, Path(args.reference_code), device, work, args.version
        )
        if model is None:
            add("published processor path", 1, "fp32", status=f"not run: {why}")
        else:
            _reference_rows(model, clips, n1, cfg, device, args, add, reference_audio)
            del model
    return {"meta": meta, "rows": rows}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m lab.bench codec", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--codec-dir", help="a MOSS-Audio-Tokenizer checkpoint (default: random weights)"
    )
    p.add_argument(
        "--size", default="real", choices=("tiny", "real"), help="random checkpoint size"
    )
    p.add_argument(
        "--version", default="v1", choices=("v1", "v2"),
        help="v1: the 24 kHz codec of MOSS-TTS Delay; v2: the 48 kHz stereo codec of Local",
    )  # fmt: skip
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
        "--kernels",
        default="eager,compiled",
        help="codec_kernels of the batched non-fp32 rows (eager, compiled; compiled is refused "
        "off CUDA, and the row says why)",
    )
    p.add_argument(
        "--decode-batches",
        default=None,
        help="decode_batch_size of the batched rows, comma-separated (default: --batch); the "
        "rows decode --batch clips in calls of that many (the workflow's default is 16)",
    )
    p.add_argument(
        "--profile", action="store_true", help="each batched row: the top ops of one call"
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="clip length (default 15; tiny v1: 0.04 s = 60 frames, its hop is 16 samples; "
        "tiny v2: 2 s = 25 frames)",
    )
    p.add_argument("--n-vq", type=int, default=None, help="codebooks (default: v1 all, v2 12)")
    p.add_argument("--one-clip-n", type=int, default=8, help="clips timed one at a time")
    p.add_argument("--repeats", type=int, default=3, help="timed calls after one warm-up (median)")
    p.add_argument(
        "--reference-code", help="the published modelling code (e.g. .ref/moss_audio_tokenizer)"
    )
    p.add_argument("--out", help="write the rows and run metadata as JSON here")
    args = p.parse_args(argv)
    args.argv = "python -m lab.bench codec " + " ".join(argv)
    args.decode_batches = args.decode_batches or str(args.batch)
    if args.seconds is None:
        tiny = args.size == "tiny" and not args.codec_dir
        args.seconds = (2.0 if args.version == "v2" else 0.04) if tiny else 15.0
    result = run(args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"wrote {args.out}")
    return 0
