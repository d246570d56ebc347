"""MOSS-TTS Delay: our engine (moss-fast) against the published ``generate``, same run, same
weights, same prompt, same number of decode steps (docs/bench/delay_gpu.sh runs it).

Both sides decode B copies of one prompt that ends in audio_start (the published rule then
starts the audio block at once). The checkpoint's text head always prefers the gen slot
(``always_continue``), so on both sides every row stays in audio for the whole run; ours is
told min_frames = max_frames = frames (every take exactly that many complete frames, tail
included) and the reference gets exactly as many decode steps as ours ran. Each side: one
untimed warm-up (CUDA-graph capture, cuBLAS init), then REPEATS timed runs.

    PYTHONPATH=src python3 -m lab.probes.delay_bench --out OUT [--size real|tiny]
        [--device cuda|cpu] [--batch 64] [--seconds 15] [--repeats 2] [--work DIR]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path.cwd()  # run from the repository root (the reference copy is in .ref/)
TEXT = (
    "The lighthouse keeper had not seen a ship in eleven days, and on the twelfth morning "
    "he climbed the spiral stairs again, counting every step out loud, hoping that the fog "
    "would lift before the tide turned and the supply boat finally came around the point."
)


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_reset(device):
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak(device):
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def delay_checkpoint(work: Path, size: str, reference_code: Path | None) -> Path:
    """The always-continue Delay checkpoint the Delay benches time, written once under
    ``work``; with ``reference_code``, the published remote code copied in."""
    from bestofn.fakes import moss_delay

    ckpt = work / f"MOSS-TTS-Delay-v1.5-{size}-always-continue"
    if not (ckpt / "config.json").is_file():
        moss_delay.write_model(ckpt, size, seed=0, always_continue=True)
    if reference_code is not None:
        moss_delay.add_remote_code(ckpt, reference_code)
    return ckpt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bestofn-delay"))
    ap.add_argument("--size", choices=["real", "tiny"], default="real")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--reference-code", type=Path, default=ROOT / ".ref" / "moss_tts_delay")
    ap.add_argument("--compile", default="auto", help="torch.compile our pieces: auto|on|off")
    ap.add_argument(
        "--attention",
        default="sdpa,triton",
        help="decode attention variants of ours, timed one after another (the first is 'ours')",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from bestofn.moss.delay import load_delay_model
    from bestofn.moss.delay_engine import DelayBudget, MossDelayEngine
    from bestofn.moss.delay_prompt import DelayPromptBuilder
    from bestofn.moss.sampling import SamplingParams

    dev = args.device
    on_gpu = dev.startswith("cuda")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    t0 = time.perf_counter()
    ckpt = delay_checkpoint(args.work, args.size, args.reference_code)
    write_s = time.perf_counter() - t0
    print(f"checkpoint {ckpt} ready ({write_s:.0f} s)", flush=True)

    frames = round(args.seconds * 12.5)
    p = SamplingParams(temperature=1.7, top_p=0.8, top_k=25, text_temperature=1.5)
    seeds = list(range(1000, 1000 + args.batch))
    results: dict = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([sys.executable, *sys.argv]),
        "host": platform.node(),
        "device": torch.cuda.get_device_name() if on_gpu else platform.processor() or "cpu",
        "torch": torch.__version__,
        "size": args.size,
        "dtype": str(dtype),
        "batch": args.batch,
        "clip_seconds": frames / 12.5,
        "frames": frames,
        "sampling": p.to_dict(),
    }

    # ---- ours ----------------------------------------------------------------------------
    _peak_reset(dev)
    t0 = time.perf_counter()
    model = load_delay_model(ckpt, device=dev, dtype=dtype)
    load_s = time.perf_counter() - t0
    builder = DelayPromptBuilder.from_tokenizer_json(ckpt / "tokenizer.json", model.config)
    rows = builder.rows(TEXT, language="English")
    cfg = model.config
    start = torch.full((1, 1 + cfg.n_vq), cfg.audio_pad_code, dtype=torch.long)
    start[0, 0] = cfg.audio_start_token_id
    rows = torch.cat([rows, start])
    ids = rows.unsqueeze(0).expand(args.batch, -1, -1).contiguous()
    compile_ = {"auto": None, "on": True, "off": False}[args.compile]
    budget = DelayBudget(max_frames=frames, min_frames=frames)
    by_attention = {}
    for attention in args.attention.split(","):
        # the decode attention variants side by side on the same loaded weights
        model.set_paths(decode_attention=attention)  # moss-fast's runtime decode_attention
        engine = MossDelayEngine(model, compile=compile_)
        t0 = time.perf_counter()
        out = engine.generate(ids, None, seeds, budget, p)
        _sync(dev)
        warm_s = time.perf_counter() - t0
        times = []
        for _ in range(args.repeats):
            _sync(dev)
            t0 = time.perf_counter()
            out = engine.generate(ids, None, seeds, budget, p)
            _sync(dev)
            times.append(time.perf_counter() - t0)
        lengths = sorted({int(c.shape[0]) for c in out.codes})
        steps = out.frames
        by_attention[attention] = {
            "engine": "moss-fast Delay (bestofn.moss.delay_engine)",
            "decode_attention": attention,
            "cuda_graphs": engine.use_cuda_graphs,
            "compiled": engine.compiled,
            "load_s": load_s,
            "warmup_s": warm_s,
            "batch_s": times,
            "s_per_clip": min(times) / args.batch,
            "steps": steps,
            "frames_per_clip": lengths,
            "peak_gib": _peak(dev),
            "prompt_rows": int(ids.shape[1]),
        }
        print(f"ours[{attention}]: {by_attention[attention]}", flush=True)
        del engine
        gc.collect()
    ours = next(iter(by_attention.values()))
    results["ours_by_attention"] = by_attention
    results["ours"] = ours
    del model, out
    gc.collect()

    # ---- the published generate (trust_remote_code from the model dir) -------------------
    from transformers import AutoModel

    _peak_reset(dev)
    t0 = time.perf_counter()
    attn = "sdpa" if on_gpu else "eager"
    ref = AutoModel.from_pretrained(
        str(ckpt), trust_remote_code=True, dtype=dtype, attn_implementation=attn
    )
    ref = ref.to(dev).eval()
    load_s = time.perf_counter() - t0
    mask = torch.ones(ids.shape[:2], dtype=torch.bool, device=dev)
    ids_dev = ids.to(dev)
    kw = dict(text_temperature=1.5, text_top_p=1.0, text_top_k=50, audio_temperature=1.7,
              audio_top_p=0.8, audio_top_k=25, audio_repetition_penalty=1.0)  # fmt: skip
    t0 = time.perf_counter()
    ref.generate(input_ids=ids_dev, attention_mask=mask, max_new_tokens=8, **kw)
    _sync(dev)
    warm_s = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
        _sync(dev)
        t0 = time.perf_counter()
        gen = ref.generate(input_ids=ids_dev, attention_mask=mask, max_new_tokens=steps, **kw)
        _sync(dev)
        times.append(time.perf_counter() - t0)
    # each output: (prompt rows it keeps, rows); the generated rows follow those
    made = [r[int(s) :] for s, r in gen]
    ref_frames = sorted({int((r[:, 1] != cfg.audio_pad_code).sum()) for r in made})
    gen_slot = cfg.audio_assistant_gen_slot_token_id
    ref_slots = sorted({int((r[:, 0] == gen_slot).sum()) for r in made})
    reference = {
        "engine": "published MossTTSDelayModel.generate (trust_remote_code)",
        "attn_implementation": attn,
        "load_s": load_s,
        "warmup_s": warm_s,
        "batch_s": times,
        "s_per_clip": min(times) / args.batch,
        "steps": steps,
        "codebook0_codes_per_clip": ref_frames,
        "gen_slot_rows_per_clip": ref_slots,
        "peak_gib": _peak(dev),
    }
    results["reference"] = reference
    results["speedup"] = reference["s_per_clip"] / ours["s_per_clip"]
    print(f"reference: {reference}", flush=True)

    (args.out / "delay_bench.json").write_text(json.dumps(results, indent=1))
    lines = [
        f"MOSS-TTS Delay {args.size} ({dtype}), {results['device']}, {results['date']}",
        f"batch {args.batch}, {frames} frames = {frames / 12.5:.2f} s per clip, {steps} steps",
        f"ours      : {ours['s_per_clip']:.4f} s/clip (batch {min(ours['batch_s']):.2f} s), "
        f"frames/clip {lengths}, peak {ours['peak_gib']} GiB, graphs {engine_flag(ours)}",
        f"reference : {reference['s_per_clip']:.4f} s/clip (batch "
        f"{min(reference['batch_s']):.2f} s), codebook-0 codes/clip {ref_frames}, "
        f"peak {reference['peak_gib']} GiB",
        f"speedup   : {results['speedup']:.1f}x",
        *(
            f"ours[{a}]: {r['s_per_clip']:.4f} s/clip, "
            f"{reference['s_per_clip'] / r['s_per_clip']:.1f}x vs reference"
            for a, r in by_attention.items()
        ),
        f"command   : {results['command']}",
    ]
    (args.out / "delay_bench.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def engine_flag(ours: dict) -> str:
    graphs, compiled = ours["cuda_graphs"], ours["compiled"]
    return f"{'on' if graphs else 'off'}, compile {'on' if compiled else 'off'}"


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")
    sys.exit(main())
