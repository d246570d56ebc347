"""`python -m lab.bench generate`: moss-fast vs the reference generate, same run, same weights.

Random weights at the real MOSS-TTS-Local-Transformer-v1.5 shape (bf16), fixed frame count (the
stop head is set so no row stops early), generation only (no codec). Reports s/clip, frames/s,
peak memory, and the HBM bandwidth floor (weights + KV bytes that one frame must read).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch

from bestofn.fakes.moss import always_continue_, random_state_dict, tiny_config
from bestofn.moss.checkpoint import model_from_state_dict
from bestofn.moss.config import MossLocalConfig, local_v15_config
from bestofn.moss.engine import MossLocalEngine
from bestofn.moss.sampling import SamplingParams
from bestofn.parity.local import make_prompts
from bestofn.parity.reference_code import load_reference_class

HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}


def bandwidth_floor_s(cfg: MossLocalConfig, batch: int, prompt: int, frames: int, bw: float):
    """Lower bound for one batch: every frame reads the backbone weights once, the local
    transformer weights n_vq times, the audio heads once each, and the live KV cache."""
    H, inner = cfg.hidden_size, cfg.intermediate_size
    attn = (
        H * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim + cfg.num_heads * cfg.head_dim * H
    )
    backbone = cfg.num_layers * (attn + 3 * H * inner)
    local = cfg.local_layers * (4 * H * H + 2 * H * cfg.local_inner)
    heads = cfg.n_vq * cfg.audio_vocab * H
    weight_bytes = 2 * (backbone + cfg.n_vq * local + heads)
    kv_per_token = 2 * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim  # K+V, bf16
    mean_len = prompt + frames / 2
    kv_bytes = batch * mean_len * kv_per_token
    return frames * (weight_bytes + kv_bytes) / bw, weight_bytes, kv_bytes


def build_models(cfg: MossLocalConfig, ref_dir: Path | None, device: str, dtype):
    """Reference model (if its code is given) with random weights, and moss-fast with the SAME
    weights. The stop head is made to always continue so every run has exactly `frames` frames."""
    torch.manual_seed(0)
    sd, ref = None, None
    if ref_dir is not None:
        try:
            ref, sd = _build_reference(cfg, ref_dir, device, dtype)
        except Exception as e:  # keep measuring moss-fast; say why the reference is missing
            print(f"# reference could not be built: {type(e).__name__}: {e}")
            ref_dir = None
    if ref_dir is None:
        sd = {k: v.to(device) for k, v in random_state_dict(cfg, std=0.02).items()}
        always_continue_(sd["local_transformer.ln_f.bias"], sd["local_text_lm_head.weight"])
    fast = model_from_state_dict(cfg, sd, device=device, dtype=dtype)
    return ref, fast


def _build_reference(cfg, ref_dir, device, dtype):
    import transformers

    transformers.utils.logging.set_verbosity_error()
    RefModel = load_reference_class(ref_dir)
    hf = cfg.to_hf_dict()
    hf["attn_implementation"] = "sdpa"
    with torch.device(device):
        ref = RefModel(RefModel.config_class(**hf)).to(dtype).eval()
    always_continue_(ref.local_transformer.ln_f.bias, ref.local_text_lm_head.weight)
    return ref, ref.state_dict()


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_reset(device):
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device):
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")


def time_fast(engine, ids, frames, params, repeats, device):
    seeds = list(range(ids.shape[0]))
    _peak_reset(device)
    t0 = time.perf_counter()
    out = engine.generate(ids, None, seeds, frames, params)  # includes graph capture
    _sync(device)
    first = time.perf_counter() - t0
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        out = engine.generate(ids, None, [s + 1000 * (r + 1) for s in seeds], frames, params)
        _sync(device)
        times.append(time.perf_counter() - t0)
    n = {len(c) for c in out.codes}
    return min(times), first, _peak_gib(device), n


def time_reference(ref, ids, frames, params, device):
    mask = torch.ones(ids.shape[:2], dtype=torch.bool, device=ids.device)
    kw = dict(
        max_new_frames=frames,
        do_sample=True,
        audio_temperature=params.temperature,
        audio_top_p=params.top_p,
        audio_top_k=params.top_k,
        audio_repetition_penalty=params.repetition_penalty,
    )
    _peak_reset(device)
    _sync(device)
    t0 = time.perf_counter()
    out = ref.generate(input_ids=ids, attention_mask=mask, **kw)
    _sync(device)
    dt = time.perf_counter() - t0
    n = {int((rows[1:, 0] != ref.config.pad_token_id).sum()) for _, rows in out}
    return dt, _peak_gib(device), n


def graph_check(engine, ids, frames, params):
    """Graph replay must give exactly what eager execution gives (same seeds)."""
    seeds = list(range(ids.shape[0]))
    g = engine.generate(ids, None, seeds, frames, params).codes
    engine.use_cuda_graphs = False
    try:
        e = engine.generate(ids, None, seeds, frames, params).codes
    finally:
        engine.use_cuda_graphs = True
    same = sum(torch.equal(a, b) for a, b in zip(g, e, strict=True))
    return same, len(g)


def _attention(variant: str) -> str:
    """The decode attention of a variant: its '-triton' / '-sdpa' suffix, else the default
    (auto: triton on CUDA)."""
    return next((a for a in ("triton", "sdpa") if f"-{a}" in variant), "auto")


def _set_paths(model, variant: str) -> None:
    """The kernel paths a variant names, on the model (moss-fast's runtime options fused,
    decode_attention, local_attention; model.py and local_loop.py say why each exists)."""
    model.set_paths(
        fused="-unfused" not in variant,
        decode_attention=_attention(variant),
        local_attention="sdpa" if "-localsdpa" in variant else "auto",
    )


def profile_step(engine, batch, prompt_len, frames, params, replays=20):
    """Where a frame's time goes: graph-replay time per frame (decode only, no prefill) vs
    the GPU time of its kernels (profiled eagerly); the gap is launch/scheduling overhead."""
    from torch.profiler import ProfilerActivity, profile

    s = engine._state_for(batch, prompt_len, frames)
    kv_len = s.max_len
    graph = next((g for k, g in s.graphs.items() if k[-1] == kv_len), None)
    out = {}
    if graph is not None:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(replays // 2):
            graph.replay()
        torch.cuda.synchronize()
        out["replay_ms_per_frame"] = 1000 * (time.perf_counter() - t0) / (replays // 2)
    engine.use_cuda_graphs = False
    n = 4
    with (
        torch.inference_mode(),
        profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof,
    ):
        for _ in range(n):
            engine._frame_step(s, params, kv_len)
        torch.cuda.synchronize()
    engine.use_cuda_graphs = True
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    dev_us = sum(getattr(e, "device_time", 0.0) or 0.0 for e in kernels)
    out["kernels_per_frame"] = len(kernels) / n
    out["kernel_ms_per_frame"] = dev_us / 1000 / n
    print(
        f"# profile batch {batch}, kv_len {kv_len}: graph replay "
        f"{out.get('replay_ms_per_frame', float('nan')):.2f} ms/frame; "
        f"{out['kernels_per_frame']:.0f} kernels/frame, GPU kernel time "
        f"{out['kernel_ms_per_frame']:.2f} ms/frame"
    )
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40)
    print("\n".join("#   " + line for line in table.splitlines()))
    return out


def profile_ops(fast, cfg, batch, prompt_len, params, dev) -> list[dict]:
    """Ops (CPU) or kernels (CUDA) per eager frame step and per local loop, unfused vs fused,
    eager and compiled (no CUDA graph: the kernels a captured graph would hold)."""
    from lab.opcount import frame_counts

    ids, _ = make_prompts(cfg, [prompt_len] * batch)
    out = []
    cuda = dev.startswith("cuda")
    unit = "kernels" if cuda else "kernel-like ops"
    # compiled on CPU: Inductor C++ compiles take minutes there; `python -m lab.opcount
    # --compiled` does it on request
    for compiled in (False, True) if cuda else (False,):
        for fused in (False, True):
            name = f"{'compiled' if compiled else 'eager'}{'' if fused else '-unfused'}"
            try:
                r = frame_counts(fast, ids.to(dev), params, fused, compiled)
            except Exception as e:  # the timings above stand on their own
                print(f"# profile-ops {name} failed: {type(e).__name__}: {e}")
                continue
            f, loc = r["frame"], r["local_loop"]
            print(
                f"# profile-ops batch {batch} {name:>16}: frame step {f['ops']:.0f} ops, "
                f"{f['kernels']:.0f} {unit}; local loop {loc['ops']:.0f} ops, "
                f"{loc['kernels']:.0f} {unit}"
            )
            out.append({"engine": f"profile-ops[{name}]", "batch": batch, **r})
    fast.set_fused(True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.bench generate", description=__doc__)
    ap.add_argument("--batches", default="64,16,128")
    ap.add_argument("--reference-batches", default="64,16,128")
    ap.add_argument("--frames", type=int, default=188)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--reference-code", type=Path, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="tiny config (CPU smoke test)")
    ap.add_argument(
        "--variants",
        default="compiled,compiled-unfused,eager",
        help="moss-fast variants: compiled (torch.compile + CUDA graph), eager (CUDA graph only); "
        "a '-triton' / '-sdpa' suffix the decode attention as the "
        "split-K Triton kernel (bestofn.moss.decode_kernel) / SDPA instead of the default "
        "(auto: the Triton kernel on CUDA); "
        "a '-unfused' suffix runs the pre-fusion paths (local loop piece by piece, backbone "
        "without the K+V and residual+norm fusions; as moss-fast's runtime fused: false); the "
        "second and later variants run at the first batch size only; a '-localsdpa' suffix "
        "runs the local transformer's attention through SDPA (as runtime local_attention: "
        "sdpa) instead of the default (auto: float32 reductions on CUDA)",
    )
    ap.add_argument(
        "--compile-mode",
        default=None,
        help="the Inductor mode of the compiled variants (as moss-fast's runtime compile_mode), "
        "e.g. max-autotune-no-cudagraphs; default: torch's",
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--profile", action="store_true", help="kernel breakdown at the first batch")
    ap.add_argument(
        "--profile-ops",
        action="store_true",
        help="ops (CPU) / kernels (CUDA) per frame step and per local loop, fused vs unfused, "
        "at the first batch size (moss/opcount.py)",
    )
    args = ap.parse_args(argv)

    dtype = getattr(torch, args.dtype)
    cfg = tiny_config(vocab_size=264) if args.tiny else local_v15_config()
    dev = args.device
    gpu = torch.cuda.get_device_name() if dev.startswith("cuda") else platform.processor() or "cpu"
    bw = next((v for k, v in HBM_BYTES_PER_S.items() if k in gpu), float("nan"))
    print(f"# bestofn bench generate  {datetime.datetime.now(datetime.UTC).isoformat()}")
    print(f"# command: python -m lab.bench generate {' '.join(argv or sys.argv[1:])}")
    print(
        f"# device: {gpu}; torch {torch.__version__}; dtype {args.dtype}; frames {args.frames}; "
        f"prompt {args.prompt_len} tokens; "
        f"shape: {'tiny' if args.tiny else 'MOSS-TTS-Local-v1.5 4B'}"
    )
    if dev.startswith("cuda"):
        torch.backends.cuda.enable_cudnn_sdp(False)  # as the reference README advises
    t0 = time.perf_counter()
    ref, fast = build_models(cfg, args.reference_code, dev, dtype)
    print(
        f"# models built in {time.perf_counter() - t0:.1f} s (reference: "
        f"{'yes' if ref is not None else 'not given'})"
    )
    variants = [v for v in args.variants.split(",") if v]
    params = SamplingParams()  # model-card settings: T 1.7, top-p 0.8, top-k 25, penalty 1.0
    rows = []
    batches = [int(b) for b in args.batches.split(",") if b]
    plan = [(variants[0], b) for b in batches] + [(v, batches[0]) for v in variants[1:]]
    engines = {}
    for variant, batch in plan:
        compiled = variant.split("-")[0] == "compiled"
        _set_paths(fast, variant)
        if variant not in engines:
            fast.eager_steps()
            engines[variant] = MossLocalEngine(
                fast, compile=compiled, compile_mode=args.compile_mode
            )
        engine = engines[variant]
        if compiled:
            fast.compile_steps(args.compile_mode)
        else:
            fast.eager_steps()
        ids, _ = make_prompts(cfg, [args.prompt_len] * batch)
        ids = ids.to(dev)
        best, first, peak, n = time_fast(engine, ids, args.frames, params, args.repeats, dev)
        floor, wbytes, kvbytes = bandwidth_floor_s(cfg, batch, args.prompt_len, args.frames, bw)
        row = _row(f"moss-fast[{variant}]", batch, best, args.frames, peak, n)
        row.update(
            first_call_s=first,
            floor_s_per_batch=floor,
            floor_ms_per_frame_step=1000 * floor / args.frames,
        )
        rows.append(row)
        _print(row)
        ref_batches = [int(b) for b in args.reference_batches.split(",") if b]
        if ref is not None and variant == variants[0] and batch in ref_batches:
            dt, peak, n = time_reference(ref, ids, args.frames, params, dev)
            row = _row("reference", batch, dt, args.frames, peak, n)
            rows.append(row)
            _print(row)
            print(f"  speed-up at batch {batch}: {dt / best:.1f}x")
    engine = engines[variants[0]]
    first_compiled = variants[0].split("-")[0] == "compiled"
    _set_paths(fast, variants[0])
    if first_compiled:
        fast.compile_steps(args.compile_mode)
    if engine.use_cuda_graphs:
        ids, _ = make_prompts(cfg, [args.prompt_len] * 4)
        # 40 frames after the prompt cross a 64-slot KV bucket (two captured graphs).
        same, total = graph_check(engine, ids.to(dev), 40, params)
        print(f"# CUDA-graph replay vs eager, 4 takes x 40 frames, same seeds: {same}/{total} same")
    if args.profile and dev.startswith("cuda"):
        fast.compile_steps(args.compile_mode) if first_compiled else fast.eager_steps()
        try:
            prof = profile_step(engine, batches[0], args.prompt_len, args.frames, params)
            rows.append({"engine": "profile", "batch": batches[0], **prof})
        except Exception as e:  # the timings above stand on their own
            print(f"# profile failed: {type(e).__name__}: {e}")
    if args.profile_ops:
        rows += profile_ops(fast, cfg, batches[0], args.prompt_len, params, dev)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def _row(engine: str, batch: int, seconds: float, frames: int, peak, frames_each) -> dict:
    """The rates every engine row reports, from one timed batch."""
    return {
        "engine": engine,
        "batch": batch,
        "s_per_batch": seconds,
        "s_per_clip": seconds / batch,
        "frames_per_s": batch * frames / seconds,
        "ms_per_frame_step": 1000 * seconds / frames,
        "peak_gib": peak,
        "frames_each": sorted(frames_each),
    }


def _print(r):
    extra = ""
    if "floor_ms_per_frame_step" in r:
        extra = (
            f"  floor {r['floor_ms_per_frame_step']:.2f} ms/frame; "
            f"first call {r['first_call_s']:.2f} s"
        )
    print(
        f"{r['engine']:>19} batch {r['batch']:>4}: {r['s_per_batch']:.3f} s/batch  "
        f"{r['s_per_clip']:.4f} s/clip  {r['frames_per_s']:.0f} frames/s  "
        f"{r['ms_per_frame_step']:.2f} ms/frame-step  peak {r['peak_gib']:.1f} GiB  "
        f"frames {r['frames_each']}{extra}"
    )


if __name__ == "__main__":
    sys.exit(main())
