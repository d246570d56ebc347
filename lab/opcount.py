"""Ops per decode frame, unfused vs fused local loop: a CPU proxy for the GPU's kernel chain.

On the GPU a frame is one CUDA graph, and its time at small batch is the length of the chain of
dependent kernels in it. On a machine without a GPU the closest observable is the chain of aten
ops one eager frame step runs. torch.profiler records them; we count, per frame:

- ``ops``: aten ops called from Python (what the model code asks for);
- ``kernels``: aten ops that do work themselves: not a view/metadata op (view, slice,
  transpose, expand, empty, ...) and not a wrapper whose work is all in ops under it (linear ->
  addmm, ``to`` -> copy_); addmm counts as two (bias copy, GEMM). Roughly one kernel launch each
  on the GPU in eager mode, i.e. nodes of the captured graph.

``python -m lab.opcount`` prints both for the whole frame step and for its local loop
(stop head + 12 codebooks), tiny and real-shaped (one backbone layer, real local transformer and
heads), unfused (runtime fused: false: the local loop piece by piece, the backbone with
separate K/V writes and separate residual/norm kernels) and fused. Compiled variants
(``--compiled``) count what runs after torch.compile (Inductor's C++ kernels on CPU show up as
one op each).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import platform
import sys
from collections import Counter

import torch

from bestofn.fakes.moss import always_continue_, random_state_dict, tiny_config
from bestofn.moss.checkpoint import model_from_state_dict
from bestofn.moss.config import MossLocalConfig, local_v15_config
from bestofn.moss.engine import MossLocalEngine
from bestofn.moss.sampling import SamplingParams

# ops that launch no kernel (views, metadata, allocation, no-op casts)
NO_KERNEL = {
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::unsqueeze", "aten::squeeze",
    "aten::slice", "aten::select", "aten::transpose", "aten::t", "aten::permute",
    "aten::expand", "aten::as_strided", "aten::unflatten", "aten::flatten", "aten::alias",
    "aten::detach", "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::to",
    "aten::_to_copy_noop", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
    "aten::result_type", "aten::contiguous", "aten::split", "aten::chunk", "aten::unbind",
    "aten::narrow", "aten::split_with_sizes", "aten::view_as", "aten::numpy_T",
    "aten::_reshape_alias",
}  # fmt: skip
# ops that do work themselves and also call a kernel op (addmm copies the bias, then the GEMM)
SELF_WORK = {"aten::addmm", "aten::baddbmm", "aten::addmv"}


def _is_op(e) -> bool:
    return e.name.startswith("aten::") or e.name.startswith(("cpp_fused", "triton_", "graph_"))


def count_ops(fn, n: int = 3, cuda: bool = False) -> dict:
    """Profile ``fn()`` n times; per-call counts of top-level ops and kernel-like ops (on CUDA:
    the kernels the GPU ran)."""
    from torch.profiler import ProfilerActivity, profile

    fn()  # warm-up (lazy tables, compiled code)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(n):
            fn()
        if cuda:
            torch.cuda.synchronize()
    if cuda:
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        names = Counter(e.name[:60] for e in kernels)
        return {
            "ops": sum(1 for e in prof.events() if _is_op(e) and e.cpu_parent is None) / n,
            "kernels": len(kernels) / n,
            "top_kernels": {k: v / n for k, v in names.most_common(12)},
        }
    events = [e for e in prof.events() if _is_op(e)]
    top = [e for e in events if e.cpu_parent is None or not _is_op(e.cpu_parent)]
    leaf = [
        e
        for e in events
        if e.name not in NO_KERNEL
        and (e.name in SELF_WORK or all(c.name in NO_KERNEL for c in e.cpu_children if _is_op(c)))
    ]
    names = Counter(e.name for e in leaf)
    return {
        "ops": len(top) / n,
        "kernels": len(leaf) / n,
        "top_kernels": {k: v / n for k, v in names.most_common(12)},
    }


def one_layer_real_config() -> MossLocalConfig:
    """The real v1.5 widths (backbone layer, local transformer, 12 x 1024 heads) with one
    backbone layer and a small text vocabulary (the per-frame op chain does not depend on
    either; the backbone's ops per frame are 36 x one layer's)."""
    c = dataclasses.replace(local_v15_config(), num_layers=1, vocab_size=1024)
    t = tiny_config(vocab_size=1024)
    ids = {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.name.endswith("_id")}
    return dataclasses.replace(c, **ids)


def build(cfg: MossLocalConfig, batch: int, prompt_len: int, frames: int):
    sd = random_state_dict(cfg, seed=0, std=0.02)
    always_continue_(sd["local_transformer.ln_f.bias"], sd["local_text_lm_head.weight"])
    model = model_from_state_dict(cfg, sd, dtype=torch.float32)
    ids = torch.full((batch, prompt_len, 1 + cfg.n_vq), cfg.audio_pad_code)
    ids[..., 0] = torch.arange(prompt_len) % 200
    ids[:, -1, 0] = cfg.audio_start_token_id
    return model, ids


@torch.inference_mode()
def frame_counts(model, ids, params: SamplingParams, fused: bool, compiled: bool) -> dict:
    """Counts for one frame step and for its local loop alone, after a few real frames."""
    model.set_fused(fused)
    model.eager_steps()
    engine = MossLocalEngine(model, use_cuda_graphs=False, compile=compiled)
    try:
        B, T, _ = ids.shape
        frames = 8
        engine.generate(ids, None, list(range(B)), frames, params)  # fills caches, warms up
        s = engine._state_for(B, T, frames)
        kv_len = min(s.max_len, -(-(T + frames) // 64) * 64)
        p = model.audio_embed
        h = torch.randn(B, model.config.hidden_size, dtype=p.dtype, device=p.device)
        cuda = p.device.type == "cuda"

        def step():
            s.cache.write_idx.fill_(T + 2)  # stay inside the cache whatever the repeat count
            engine._frame_step(s, params, kv_len)

        return {
            "frame": count_ops(step, cuda=cuda),
            "local_loop": count_ops(lambda: engine._heads_and_sampling(s, params, h), cuda=cuda),
        }
    finally:
        model.set_fused(True)
        model.eager_steps()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.opcount", description=__doc__)
    ap.add_argument("--shapes", default="tiny,real-1layer")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--compiled", action="store_true", help="also count torch.compile'd paths")
    ap.add_argument("--details", action="store_true", help="most frequent kernels per path")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    print(f"# bestofn opcount  {datetime.datetime.now(datetime.UTC).isoformat()}")
    print(f"# command: python -m lab.opcount {' '.join(argv or sys.argv[1:])}")
    print(
        f"# host: {platform.machine()} {platform.processor() or ''}; torch {torch.__version__}; "
        f"fp32 on CPU (eager; 'compiled' rows: torch.compile); batch {args.batch}; "
        f"sampling = model card (T 1.7, top-p 0.8, top-k 25)"
    )
    params = SamplingParams()
    if args.compiled:  # Inductor's C++ kernels appear in the profile as one op each
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    print("| shape | path | ops/frame | kernels/frame | local loop ops | local loop kernels |")
    print("|---|---|---:|---:|---:|---:|")
    for shape in [s for s in args.shapes.split(",") if s]:
        cfg = tiny_config(vocab_size=264) if shape == "tiny" else one_layer_real_config()
        model, ids = build(cfg, args.batch, args.prompt_len, 8)
        variants = [("unfused", False, False), ("fused", True, False)]
        if args.compiled:
            variants += [("unfused compiled", False, True), ("fused compiled", True, True)]
        for name, fused, compiled in variants:
            r = frame_counts(model, ids, params, fused, compiled)
            f, loc = r["frame"], r["local_loop"]
            print(
                f"| {shape} | {name} | {f['ops']:.0f} | {f['kernels']:.0f} | {loc['ops']:.0f} "
                f"| {loc['kernels']:.0f} |"
            )
            if args.details:
                print(f"#   {shape} {name} local loop kernels: {loc['top_kernels']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
