"""The speech service's streaming codec decode against the workflow's one-shot decode, on the
same codec and the same audio: milliseconds per audio-second of each, and the top ops of one
streaming call; and, per streaming mode, how far two clips streamed in chunks and joined lie
from their one-shot decode (``vs_one_shot_max_rel``: float rounding only where the path is
right on that device: about 1e-6 with ``--dtype fp32``, 1e-2 in bf16, the default).

The service decodes each request's new frames as they come (``StreamDecoder.decode``: each
request's new steps attend to its own ring of cached keys and values,
``bestofn.moss.codec.stream``), the workflow a whole take at once (``Codec.decode``). Requests
are mid-stream (their caches full), as at a busy service's steady state. Random codes; the cost
does not depend on them.

    PYTHONPATH=src:. python3 -m lab.probes.stream_codec --codec-dir W/MOSS-Audio-Tokenizer-v2 \\
        --requests 128 --frames 16 [--modes graphs,eager] [--profile 18] [--out FILE]

CPU smoke: ``--device cpu --requests 2 --frames 4 --modes eager`` on a tiny fake-weights tree.
"""

from __future__ import annotations

import argparse
import json
import time

from lab.probes import write_rows

FRAME_S = 0.08  # MOSS codec frames: 12.5 a second


def _timed(fn, device: str, repeats: int) -> float:
    import torch

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    fn()  # warm-up: graph capture, compiled kernels
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - t0) / repeats


def _joined_error(codec, stream, frames: int, gen) -> float:
    """Two clips streamed from a fresh start in chunks of ``frames`` (4 first, as the service's
    first chunk), joined, against their one-shot decode: the largest difference over the
    largest sample (float rounding only, if the streaming path is right on this device)."""
    import numpy as np
    import torch

    size = codec.config.codebook_size
    lengths = (3 * frames + 5, 9)[: stream.slots]
    clips = [torch.randint(0, size, (n, codec.n_vq), generator=gen) for n in lengths]
    whole = codec.decode(clips)
    parts: dict[int, list] = {slot: [] for slot in range(len(clips))}
    for slot in parts:
        stream.reset(slot)
    done = [0] * len(clips)
    while any(d < len(c) for d, c in zip(done, clips, strict=True)):
        new = {}
        for slot, clip in enumerate(clips):
            end = min(len(clip), done[slot] + (4 if done[slot] == 0 else frames))
            if end > done[slot]:
                new[slot], done[slot] = clip[done[slot] : end], end
        for slot, audio in stream.decode(new).items():
            parts[slot].append(audio)
    worst = 0.0
    for slot, ref in enumerate(whole):
        got = np.concatenate(parts[slot])
        worst = max(worst, float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-12)))
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codec-dir", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--frames", type=int, default=16, help="new frames a request per call")
    ap.add_argument("--seen", type=int, default=64, help="frames each request decoded before")
    ap.add_argument("--modes", default="graphs,eager", help="StreamDecoder modes")
    ap.add_argument("--n-vq", type=int, default=12, help="codebooks (MOSS-TTS-Local: 12)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"),
                    help="the codec's weights and compute (fp32: the joined check is exact to "
                         "about 1e-6)")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", type=int, default=0, help="top ops of one eager streaming call")
    ap.add_argument("--out", help="write the rows as JSON lines here too")
    args = ap.parse_args(argv)
    import torch

    from bestofn.moss.codec.load import load_codec

    codec = load_codec(args.codec_dir, args.device, n_vq=args.n_vq, weight_dtype=args.dtype,
                       compute_dtype=args.dtype)  # fmt: skip
    B, F, size = args.requests, args.frames, codec.config.codebook_size
    gen = torch.Generator().manual_seed(0)
    new = {s: torch.randint(0, size, (F, codec.n_vq), generator=gen) for s in range(B)}
    audio_s = B * F * FRAME_S
    rows = []
    for mode in [m for m in args.modes.split(",") if m]:
        stream = codec.stream_decoder(B, mode)

        def call(stream=stream):
            for s in range(B):  # mid-stream: each request's window of the past is full
                stream.frames[s] = args.seen
            stream.decode(new)

        dt = _timed(call, args.device, args.repeats)
        rows.append({"path": f"stream {mode}", "requests": B, "frames": F, "s_per_call": dt,
                     "ms_per_audio_s": 1000 * dt / audio_s,
                     "vs_one_shot_max_rel": _joined_error(codec, stream, F, gen)})  # fmt: skip
    # the one-shot decode of the same audio length: each request's seen + new frames whole, the
    # cost counted per audio-second as above
    whole = [torch.randint(0, size, (args.seen + F, codec.n_vq), generator=gen) for _ in range(B)]
    dt = _timed(lambda: codec.decode(whole), args.device, args.repeats)
    rows.append({"path": "one-shot", "requests": B, "frames": args.seen + F, "s_per_call": dt,
                 "ms_per_audio_s": 1000 * dt / (B * (args.seen + F) * FRAME_S)})  # fmt: skip
    for r in rows:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))
    if args.profile:
        from lab.kernel_profile import top_ops

        stream = codec.stream_decoder(B, "eager")
        print("\n".join(top_ops(lambda: stream.decode(new), args.device, args.profile)))
    if args.out:
        write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
