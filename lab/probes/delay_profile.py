"""Where a MOSS-TTS Delay decode step spends its time (docs/bench/delay_gpu.sh runs it with
PROFILE=1, the default on cuda).

Same checkpoint, prompt and budget as lab.probes.delay_bench. After one full generate (which
captures every kv_len bucket's CUDA graph), it prints, per step:

- ``step``: the engine's own captured step, per kv_len bucket (CUDA events around each replay);
- ``backbone``: the row embedding + the backbone step alone (its own CUDA graph);
- ``heads+sampling``: text head, 32 codebook heads, sampling and counters alone (own graph);
- ``floor``: the bytes a step must read (weights used per step + this bucket's K/V) at the
  given HBM bandwidth;
- the prefill, once per distinct prompt (what the engine does) and once per row;
- the top 15 kernels by GPU time over 10 replays of the largest bucket's step (torch.profiler).

On cpu (a smoke test of this script) the same pieces run eagerly, timed with perf_counter, and
the table lists CPU ops.

    PYTHONPATH=src python3 -m lab.probes.delay_profile --out OUT [--size real|tiny]
        [--device cuda|cpu] [--batch 64] [--seconds 15] [--replays 10] [--work DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

from lab.probes.delay_bench import ROOT, TEXT, delay_checkpoint


class Timer:
    """ms per call of fn: CUDA events around each call on cuda, perf_counter on cpu."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def __call__(self, fn, n: int, before=None) -> float:
        total = 0.0
        for _ in range(n):
            if before is not None:
                before()
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                total += a.elapsed_time(b)
            else:
                t0 = time.perf_counter()
                fn()
                total += (time.perf_counter() - t0) * 1e3
        return total / n


def capture(fn, device: str):
    """fn as a replayable CUDA graph on cuda (one warm-up call first), fn itself on cpu."""
    if not device.startswith("cuda"):
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def kernel_table(fn, n: int, device: str, rows: int = 15) -> str:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(ProfilerActivity.CUDA)
    fn()
    with profile(activities=acts) as prof:
        for _ in range(n):
            fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    avg = prof.key_averages()
    for key in ("self_device_time_total", "self_cuda_time_total", "self_cpu_time_total"):
        if not device.startswith("cuda") and key != "self_cpu_time_total":
            continue
        try:
            return avg.table(sort_by=key, row_limit=rows, max_name_column_width=90)
        except (AttributeError, KeyError, ValueError):
            continue
    return avg.table(row_limit=rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bestofn-delay"))
    ap.add_argument("--size", choices=["real", "tiny"], default="real")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--hbm-tb-s", type=float, default=4.8, help="bandwidth for the floor")
    ap.add_argument("--reference-code", type=Path, default=ROOT / ".ref" / "moss_tts_delay")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import bestofn.moss.delay as delay
    from bestofn.moss.delay import load_delay_model
    from bestofn.moss.delay_engine import DelayBudget, MossDelayEngine
    from bestofn.moss.delay_prompt import DelayPromptBuilder
    from bestofn.moss.sampling import SamplingParams

    dev = args.device
    cuda = dev.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    code = args.reference_code if args.reference_code.is_dir() else None
    ckpt = delay_checkpoint(args.work, args.size, code)
    model = load_delay_model(ckpt, device=dev, dtype=dtype)
    cfg = model.config
    builder = DelayPromptBuilder.from_tokenizer_json(ckpt / "tokenizer.json", cfg)
    rows = builder.rows(TEXT, language="English")
    start = torch.full((1, 1 + cfg.n_vq), cfg.audio_pad_code, dtype=torch.long)
    start[0, 0] = cfg.audio_start_token_id
    ids = torch.cat([rows, start]).unsqueeze(0).expand(args.batch, -1, -1).contiguous()
    B, T = ids.shape[:2]
    frames = round(args.seconds * 12.5)
    p = SamplingParams(temperature=1.7, top_p=0.8, top_k=25, text_temperature=1.5)
    budget = DelayBudget(max_frames=frames, min_frames=frames)
    seeds = list(range(1000, 1000 + B))
    timer = Timer(dev)
    lines = [
        f"MOSS-TTS Delay {args.size} ({dtype}) step profile, "
        f"{torch.cuda.get_device_name() if cuda else 'cpu'}, "
        f"{datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}",
        f"batch {B}, prompt {T} rows, {frames} frames, torch {torch.__version__}",
        f"command: {' '.join([sys.executable, *sys.argv])}",
    ]
    result: dict = {"batch": B, "prompt_rows": T, "frames": frames, "steps": {}}

    engine = MossDelayEngine(model)
    t0 = time.perf_counter()
    out = engine.generate(ids, None, seeds, budget, p)  # warm-up: every bucket's graph
    if cuda:
        torch.cuda.synchronize()
    lines.append(f"warm-up generate {time.perf_counter() - t0:.2f} s, {out.frames} steps")
    t0 = time.perf_counter()
    out = engine.generate(ids, None, seeds, budget, p)
    if cuda:
        torch.cuda.synchronize()
    gen_s = time.perf_counter() - t0
    lines.append(f"generate {gen_s:.3f} s = {gen_s / B:.4f} s/clip, {out.frames} steps")
    result["generate_s"] = gen_s
    s = max(engine._states.values(), key=lambda st: st.batch == B)
    cache = s.cache

    # ---- prefill: once per distinct prompt (the engine) and once per row -------------------
    dev_ids, dev_mask = ids.to(dev), torch.ones(B, T, dtype=torch.bool, device=dev)

    def prefill():
        model.prefill(dev_ids, dev_mask, cache, last_only=True)

    with torch.inference_mode():
        prefill()
        shared = timer(prefill, 2)
        real_distinct = delay.distinct_prompts
        delay.distinct_prompts = lambda i, m: (torch.arange(len(i)), torch.arange(len(i)))
        try:
            prefill()
            per_row = timer(prefill, 2)
        finally:
            delay.distinct_prompts = real_distinct
    lines.append(f"prefill: {shared:.1f} ms once per distinct prompt, {per_row:.1f} ms per row")
    result["prefill_ms"] = {"shared": shared, "per_row": per_row}

    # ---- per step, per kv_len bucket --------------------------------------------------------
    weights = sum(
        t.numel() * t.element_size()
        for n, t in model.named_parameters()
        if n not in ("embed_tokens.weight", "text_head", "audio_embed")
    )
    kv_elem = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * B * (2 if cuda else 4)
    buckets = sorted({key[-1] for key in s.graphs}) if cuda else [s.max_len]
    key_for = {key[-1]: key for key in s.graphs}
    x_static = torch.zeros(B, cfg.hidden_size, dtype=dtype, device=dev)
    h_static = torch.zeros(B, cfg.hidden_size, dtype=dtype, device=dev)
    lines.append(
        f"{'kv_len':>6} {'step ms':>8} {'backbone':>9} {'heads+smp':>9} {'floor ms':>8}"
        f"   (floor: {weights / 1e9:.1f} GB weights + K/V at {args.hbm_tb_s} TB/s)"
    )
    with torch.inference_mode():
        for L in buckets:
            start_idx = max(T, L - 64)  # the bucket's own slots: writes stay below L

            def rewind(i=start_idx):
                cache.write_idx.fill_(i)
                cache.pos.fill_(i)

            if cuda:
                step = s.graphs[key_for[L]].replay
            else:

                def step(L=L):
                    engine._step(s, p, budget, L)

            def backbone(L=L):
                x_static.copy_(model.embed_rows(s.row).to(dtype))
                h_static.copy_(model.backbone_step(x_static, s.alive, cache, L))

            def heads():
                engine._heads_and_sampling(s, p, budget, h_static)

            rewind()
            backbone_fn = capture(lambda: (rewind(), backbone()), dev)
            heads_fn = capture(heads, dev)
            n = args.replays
            ms_step = timer(step, n, before=rewind)
            ms_backbone = timer(backbone_fn, n)
            ms_heads = timer(heads_fn, n)
            floor = (weights + kv_elem * L) / (args.hbm_tb_s * 1e12) * 1e3
            lines.append(
                f"{L:>6} {ms_step:>8.2f} {ms_backbone:>9.2f} {ms_heads:>9.2f} {floor:>8.2f}"
            )
            result["steps"][L] = {
                "step_ms": ms_step,
                "backbone_ms": ms_backbone,
                "heads_sampling_ms": ms_heads,
                "floor_ms": floor,
            }
        L = buckets[-1]

        def one(L=L):
            cache.write_idx.fill_(max(T, L - 64))
            cache.pos.fill_(max(T, L - 64))
            if cuda:
                s.graphs[key_for[L]].replay()
            else:
                engine._step(s, p, budget, L)

        table = kernel_table(one, args.replays, dev)
    lines.append(f"top kernels over {args.replays} replays of the kv_len {L} step:")
    lines.append(table)
    text = "\n".join(lines) + "\n"
    (args.out / "delay_profile.txt").write_text(text)
    (args.out / "delay_profile.json").write_text(json.dumps(result, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
