"""Where the speech service's time goes inside the worker: the product's own streaming render
(``bestofn.core.speech.stream_batch`` on a moss-fast generator, exactly what the worker's
speech batcher calls), with B requests at once, timed in three parts:

- ``decode_loop_s``: inside the continuous decoder (frame steps, the host sync every
  ``STEP_FRAMES`` frames, joins);
- ``codec_s``: the codec's streaming decode of the new frames (CUDA-synchronised);
- the rest (Python around them, the host copies of the audio);

and time to first audio split: ``first_codes_mean_ms`` (a request's first frames on the host)
against ``ttfa_mean_ms`` (its first audio).

No HTTP, no encoding: ``audio_s_per_s`` here is the ceiling of ``bestofn serve`` at that
concurrency; the gap to the served figure is the server's. The first render of each batch size
is a warm-up (compiles, CUDA-graph captures) and is reported apart.

    PYTHONPATH=src python3 -m lab.probes.speech_profile \
        --model-dir W/MOSS-TTS-Local-Transformer-v1.5 --codec-dir W/MOSS-Audio-Tokenizer-v2 \
        --batches 1,64,128 [--stream-modes eager,graphs] [--out FILE]

``--stream-modes``: the codec's streaming decode modes to render with, one after the other in
this process (``bestofn.moss.codec.stream``: ``graphs`` is the product's default on CUDA).
``--admit-tokens none,4096``: one render per ``runtime.speech_admit_tokens`` value, side by side
(``admit_s``: the joins' prefill and frame 0, inside ``decode_loop_s``).
CPU smoke: ``--device cpu --batches 1,2`` on ``bestofn fake-weights --size tiny``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from lab.probes import write_rows

TEXT = "The train leaves at nine, so please be on time and bring the tickets with you."


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _spec(text: str, seed: int, i: int = 0):
    from bestofn.util.spec import GroupSpec

    return GroupSpec(emotion="calm", prompt_id=f"p{i}", text=text, n_takes=1, base_seed=seed)


def render(gen, batch: int, device: str, seed0: int, mode: str | None = None,
           text: str = TEXT, admit_tokens: int | None = None) -> dict:  # fmt: skip
    """One ``stream_batch`` of ``batch`` requests, timed by part; ``mode``: the streaming
    decode's (None: the product's default); ``admit_tokens``: moss-fast's
    ``runtime.speech_admit_tokens`` for this render."""
    from bestofn.core import speech
    from bestofn.moss import continuous

    timers = {"decode_loop_s": 0.0, "codec_s": 0.0, "admit_s": 0.0}
    decoder = continuous.decoder_for(gen.engine)
    codec = gen._codec()
    real_run, real_stream = decoder.run, getattr(codec, "stream_decoder", None)
    real_admit, real_tokens = decoder._admit, gen.options.get("speech_admit_tokens")

    def timed_admit(*a, **k):  # prefill of the joiners and their frame 0 (inside decode_loop_s)
        _sync(device)
        t0 = time.perf_counter()
        out = real_admit(*a, **k)
        _sync(device)
        timers["admit_s"] += time.perf_counter() - t0
        return out

    def timed_run(*a, **k):
        it = real_run(*a, **k)
        while True:
            t0 = time.perf_counter()
            try:
                block = next(it)
            except StopIteration:
                return
            finally:
                timers["decode_loop_s"] += time.perf_counter() - t0
            now = time.perf_counter() - start[0]
            for u in block:  # the request's first frames on the host (before the codec)
                if u.codes.shape[0] and u.key not in first_codes:
                    first_codes[u.key] = now
            yield block

    def timed_stream(slots, asked=None):  # this render's mode, else the product's
        streamer = real_stream(slots, mode or asked)
        inner = streamer.decode

        def decode(new):
            _sync(device)
            t0 = time.perf_counter()
            out = inner(new)
            _sync(device)
            timers["codec_s"] += time.perf_counter() - t0
            return out

        streamer.decode = decode
        return streamer

    decoder.run, decoder._admit = timed_run, timed_admit
    gen.options["speech_admit_tokens"] = admit_tokens
    if real_stream is not None:
        codec.stream_decoder = timed_stream
    specs = [_spec(text, seed0 + i, i) for i in range(batch)]
    first: dict[int, float] = {}
    first_codes: dict[int, float] = {}
    start = [0.0]
    samples = 0
    try:
        _sync(device)
        t0 = start[0] = time.perf_counter()
        for i, audio, _last in speech.stream_batch(gen, specs):
            if isinstance(audio, BaseException):
                raise audio
            a = np.asarray(audio)
            if a.shape[0] and i not in first:
                first[i] = time.perf_counter() - t0
            samples += a.shape[0]
        wall = time.perf_counter() - t0
    finally:
        decoder.run, decoder._admit = real_run, real_admit
        gen.options["speech_admit_tokens"] = real_tokens
        if real_stream is not None:
            codec.stream_decoder = real_stream
    audio_s = samples / gen.sample_rate
    rest = wall - timers["decode_loop_s"] - timers["codec_s"]
    return {
        "batch": batch,
        "admit_tokens": admit_tokens,
        "stream_mode": getattr(getattr(codec, "_stream", None), "mode", None),
        "wall_s": round(wall, 4),
        "audio_s": round(audio_s, 2),
        "audio_s_per_s": round(audio_s / wall, 1) if wall else None,
        "ttfa_mean_ms": round(1000 * sum(first.values()) / max(1, len(first)), 1),
        # to the first frames on the host: prefill, joins and steps; the rest of TTFA is the
        # codec's first chunk and the batch's other chunks decoded in the same calls
        "first_codes_mean_ms": round(
            1000 * sum(first_codes.values()) / max(1, len(first_codes)), 1
        ),
        **{k: round(v, 4) for k, v in timers.items()},
        "other_s": round(rest, 4),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--codec-dir", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="1,64,128")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--stream-modes", default="", help="e.g. eager,graphs (default: the product's)")
    ap.add_argument("--admit-tokens", default="",
                    help="e.g. none,4096: one render per runtime.speech_admit_tokens value, side "
                         "by side (default: the config's default)")  # fmt: skip
    ap.add_argument("--text", default=TEXT, help="every request's text (its length: the frames)")
    ap.add_argument("--out", help="write the rows as JSON lines here too")
    args = ap.parse_args(argv)
    from bestofn.backends import registry

    opts = {"model_dir": args.model_dir, "codec_dir": args.codec_dir}
    t0 = time.perf_counter()
    gen = registry.build("generator", "moss-fast", opts, device=args.device)
    print(json.dumps({"load_s": round(time.perf_counter() - t0, 2)}), flush=True)
    rows = []
    modes = [m for m in args.stream_modes.split(",") if m] or [None]
    admits = [None if a == "none" else int(a) for a in args.admit_tokens.split(",") if a] or [
        gen.options.get("speech_admit_tokens")
    ]
    print(json.dumps({"prompt_rows": int(gen.prompt(_spec(args.text, 0)).shape[0])}), flush=True)
    for b in (int(x) for x in args.batches.split(",")):
        for mode in modes:
            for admit in admits:
                kw = dict(mode=mode, text=args.text, admit_tokens=admit)
                # compiles and captures: a batch size's first render, and each budget's (a
                # burst admitted over several syncs grows the decode state through other shapes)
                rows.append({**render(gen, b, args.device, 10_000, **kw), "warmup": True})
                print(json.dumps(rows[-1]), flush=True)
                for r in range(args.repeats):
                    rows.append(render(gen, b, args.device, seed0=1000 * r, **kw))
                    print(json.dumps(rows[-1]), flush=True)
    if args.out:
        write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
