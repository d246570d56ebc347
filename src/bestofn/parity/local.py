"""`bestofn parity`: moss-fast against the published reference code on the same checkpoint.

Checks, on a batch of left-padded prompts of different lengths:
1. prefill: backbone hidden states at every real position, and the first frame's stop-head and
   codebook-0 logits, within a stated tolerance;
2. greedy decode: identical codes and identical stop frames for every row.
Without a checkpoint it builds a tiny random one in the published layout, so the check covers
the real loading path (config.json + safetensors key names, tied heads) of both sides.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from bestofn.fakes.moss import random_state_dict, save_checkpoint, tiny_config
from bestofn.moss.checkpoint import load_model
from bestofn.moss.config import MossLocalConfig
from bestofn.moss.engine import MossLocalEngine
from bestofn.moss.published_draws import LocalDraws
from bestofn.moss.sampling import SamplingParams
from bestofn.parity.reference_code import flag, load_reference_class, report

# fp32 on both sides; the two implementations order float ops differently (fused projections,
# GQA without expansion), so we allow a small relative error, not bit equality.
RTOL = 1e-4


def make_prompts(cfg: MossLocalConfig, lengths: list[int], seed: int = 0):
    """Random text-token prompts (left-padded, ending in audio_start), model input format."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    ids = torch.full((B, T, 1 + cfg.n_vq), cfg.audio_pad_code, dtype=torch.long)
    ids[..., 0] = cfg.pad_token_id
    mask = torch.zeros(B, T, dtype=torch.bool)
    top = min(cfg.vocab_size, 5000, min(cfg.pad_token_id, cfg.im_start_token_id))
    for b, n in enumerate(lengths):
        ids[b, T - n :, 0] = torch.randint(0, top, (n,), generator=g)
        ids[b, T - n, 0] = cfg.im_start_token_id
        ids[b, -1, 0] = cfg.audio_start_token_id
        mask[b, T - n :] = True
    return ids, mask


def reference_codes(gen_rows: torch.Tensor, cfg: MossLocalConfig) -> torch.Tensor:
    """Codes of the frames the reference generated (rows after audio_start with the slot token)."""
    rows = gen_rows[1:]
    keep = rows[:, 0] == cfg.audio_assistant_slot_token_id
    return rows[keep, 1:]


@torch.inference_mode()
def run_parity(
    ckpt_dir: Path, ref_dir: Path, frames: int, device: str = "cpu"
) -> tuple[bool, list]:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    RefModel = load_reference_class(ref_dir)
    attn = "sdpa" if device.startswith("cuda") else "eager"
    ref = RefModel.from_pretrained(str(ckpt_dir), attn_implementation=attn, dtype=torch.float32)
    ref = ref.to(device).eval()
    fast = load_model(ckpt_dir, device=device, dtype=torch.float32)
    ok, lines = True, []
    # left-padded prompts of different lengths, then equal lengths (the no-padding fast path)
    for lengths in ([9, 6, 12, 7], [10, 10]):
        lines.append(f"prompts of lengths {lengths}:")
        good, more = _compare(ref, fast, lengths, frames, device)
        ok &= good
        lines += ["  " + line for line in more]
    return ok, lines


def _compare(ref, fast, lengths, frames, device):
    cfg = fast.config
    ids, mask = make_prompts(cfg, lengths)
    ids, mask = ids.to(device), mask.to(device)
    lines, ok = [], True

    # 1. prefill
    r_hidden = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    engine = MossLocalEngine(fast, use_cuda_graphs=False)
    state = engine._state_for(ids.shape[0], ids.shape[1], frames)
    state.cache.reset()
    f_hidden = fast.prefill(ids, mask, state.cache)
    scale = r_hidden[mask].abs().max().item()
    err = (r_hidden[mask] - f_hidden[mask]).abs().max().item()
    good = err <= RTOL * max(1.0, scale)
    ok &= good
    lines.append(
        f"prefill hidden: max|diff|={err:.3e} (scale {scale:.2f}, tol {RTOL:g}x) {flag(good)}"
    )

    r_local, _ = ref._decode_local_hidden_states_with_cache(r_hidden[:, -1:, :])
    r_stop = ref.local_text_lm_head(r_local[:, -1])
    r_cb0 = ref.audio_lm_heads[0](r_local[:, -1])
    f_local = fast.local_step(f_hidden[:, -1], 0, state.local)
    for name, r, f in [
        ("stop-head logits", r_stop, fast.stop_logits(f_local)),
        ("codebook-0 logits", r_cb0, fast.audio_logits(f_local, 0)),
    ]:
        scale = r.abs().max().item()
        err = (r.float() - f.float()).abs().max().item()
        good = err <= RTOL * max(1.0, scale)
        ok &= good
        lines.append(f"{name}: max|diff|={err:.3e} (scale {scale:.2f}) {flag(good)}")

    # 2. greedy decode
    ref_out = ref.generate(
        input_ids=ids, attention_mask=mask, max_new_frames=frames, do_sample=False
    )
    greedy = SamplingParams(do_sample=False)
    runs = [("", engine)]
    if device.startswith("cuda"):  # also the CUDA-graph path
        runs.append((" (CUDA graph)", MossLocalEngine(fast, use_cuda_graphs=True)))
    for label, eng in runs:
        fast_out = eng.generate(ids, mask, [0] * ids.shape[0], frames, greedy)
        for b, (_, rows) in enumerate(ref_out):
            rc = reference_codes(rows, cfg)
            fc = fast_out.codes[b]
            same = rc.shape == fc.shape and torch.equal(rc, fc.to(rc.device))
            ok &= same
            lines.append(
                f"greedy row {b}{label}: reference {rc.shape[0]} frames, moss-fast "
                f"{fc.shape[0]} frames, codes {'identical' if same else 'DIFFER'} {flag(same)}"
            )
    good, more = _sampled_compare(ref, fast, engine, ids, mask, frames)
    return ok & good, lines + more


def _sampled_compare(ref, fast, engine, ids, mask, frames):
    """Sampled decode (temperature, top-k, top-p, repetition penalty) with per-take seeds:
    the same seeds must give the same codes on both sides."""
    cfg = fast.config
    p = SamplingParams(temperature=1.7, top_p=0.8, top_k=5, repetition_penalty=1.3)
    seeds = [101 + 7 * b for b in range(ids.shape[0])]
    ref._sample_next_token = LocalDraws(ref, seeds, cfg.n_vq, ids.device)
    try:
        ref_out = ref.generate(
            input_ids=ids, attention_mask=mask, max_new_frames=frames, do_sample=True,
            audio_temperature=p.temperature, audio_top_p=p.top_p, audio_top_k=p.top_k,
            audio_repetition_penalty=p.repetition_penalty,
        )  # fmt: skip
    finally:
        del ref._sample_next_token
    fast_out = engine.generate(ids, mask, seeds, frames, p)
    same = [
        torch.equal(reference_codes(rows, cfg), fast_out.codes[b].to(rows.device))
        for b, (_, rows) in enumerate(ref_out)
    ]
    n = [len(c) for c in fast_out.codes]
    line = (
        f"sampled decode (T 1.7, top-k 5, top-p 0.8, penalty 1.3), per-take seeds: "
        f"{sum(same)}/{len(same)} rows identical, frames {n} {flag(all(same))}"
    )
    return all(same), [line]


def parity_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bestofn parity", description=__doc__)
    ap.add_argument(
        "--reference-code",
        type=Path,
        help="copy of moss_tts_local_v1.5/, moss_tts_delay/, or the MOSS-Audio-Tokenizer-v2 "
        "code (audio_tokenizer_v2.py + configuration_moss_audio_tokenizer_v2.py)",
    )
    ap.add_argument("--checkpoint", type=Path, help="real checkpoint dir (default: tiny random)")
    ap.add_argument(
        "--frames", type=int, default=24, help="frames (Delay: generated rows) to compare"
    )
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)

    if args.reference_code is None:
        print(
            "parity: SKIPPED (no --reference-code DIR given: a copy of the public "
            "OpenMOSS/MOSS-TTS moss_tts_local_v1.5/ folder is needed to compare against)"
        )
        return 0
    from bestofn.parity.codec import is_v2_codec_code

    if is_v2_codec_code(args.reference_code):  # the MOSS-Audio-Tokenizer-v2 code: the codec
        from bestofn.parity.codec import codec_parity_main

        with tempfile.TemporaryDirectory() as tmp:
            return codec_parity_main(args, Path(tmp))
    if not (args.reference_code / "modeling_moss_tts.py").exists():
        print(f"parity: FAIL ({args.reference_code}/modeling_moss_tts.py not found)")
        return 2
    try:
        import transformers  # noqa: F401
    except ImportError:
        print(
            "parity: FAIL (the reference code needs `transformers`: "
            "pip install transformers==5.0.0)"
        )
        return 2

    from bestofn.fakes.moss_delay import is_delay_code

    if is_delay_code(args.reference_code):  # a copy of moss_tts_delay/: the Delay engine
        from bestofn.parity.delay import delay_parity_main

        with tempfile.TemporaryDirectory() as tmp:
            return delay_parity_main(args, Path(tmp))
    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint is None:
            cfg = tiny_config(vocab_size=264)
            ckpt = save_checkpoint(Path(tmp) / "tiny", cfg, random_state_dict(cfg, seed=0))
            what = "tiny random checkpoint"
        else:
            ckpt, what = args.checkpoint, str(args.checkpoint)
        ok, lines = run_parity(ckpt, args.reference_code, args.frames, args.device)
    return report(
        ok,
        lines,
        f"moss-fast vs reference on {what}; prefill rtol {RTOL:g}, "
        f"greedy and seeded sampled codes must be identical",
    )


if __name__ == "__main__":
    sys.exit(parity_main())
