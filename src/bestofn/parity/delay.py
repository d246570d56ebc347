"""`bestofn parity --reference-code <copy of moss_tts_delay/>`: our Delay engine against the
published MOSS-TTS Delay code on the same checkpoint (``bestofn parity`` dispatches here when
the reference folder holds ``MossTTSDelayModel``).

Checks, on left-padded prompts of different lengths (most end in audio_start, so the audio
block starts at once; one ends in plain text, so the text channel is sampled too):
1. prefill: text-head logits at every real position and codebook logits at the last one,
   within a relative tolerance (fp32 both sides);
2. greedy decode: every generated row (text token + 32 delayed codes) identical, step by step,
   and the de-delayed codes identical;
3. seeded sampled decode (text T 1.5 / top-k 50, audio T 1.7 / top-k 5 / top-p 0.8): the
   reference's ``sample_token`` is replaced for the call by one that draws each row's random
   number from ``take_uniform(seed, step * 64 + j)`` (j = 0 text, 1 + k codebook k), the
   numbers our engine draws; the filtering is ours in both (the same rule).
On cuda, 2. and 3. run again through the CUDA-graph path. Repetition penalty stays 1.0 (the
model card's value): the published penalty pools the whole batch's history across codebooks,
which per-take seeds cannot reproduce; ours is per take and per codebook.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bestofn.moss.delay import MossDelayConfig, load_delay_model, undo_delay
from bestofn.moss.delay_engine import DelayBudget, MossDelayEngine
from bestofn.moss.published_draws import DelayDraws
from bestofn.moss.sampling import SamplingParams
from bestofn.parity.reference_code import flag, import_reference_module, report

RTOL = 1e-4


def load_reference_module(ref_dir: Path):
    """The reference modeling module, imported as a package from the folder copy."""
    return import_reference_module(ref_dir, "_moss_delay_reference_")


def make_prompts(cfg: MossDelayConfig, lengths: list[int], text_rows=(), seed: int = 0):
    """Random text prompts, left-padded; rows in ``text_rows`` end in plain text, the others
    in audio_start (the published generate's continuation rule starts their audio at once)."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    ids = torch.full((B, T, 1 + cfg.n_vq), cfg.audio_pad_code, dtype=torch.long)
    ids[..., 0] = cfg.pad_token_id
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate(lengths):
        ids[b, T - n :, 0] = torch.randint(0, 5000, (n,), generator=g)
        ids[b, T - n, 0] = cfg.im_start_token_id
        if b not in text_rows:
            ids[b, -1, 0] = cfg.audio_start_token_id
        mask[b, T - n :] = True
    return ids, mask


@torch.inference_mode()
def run_parity(ckpt_dir: Path, ref_dir: Path, steps: int, device: str = "cpu"):
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    mod = load_reference_module(ref_dir)
    attn = "sdpa" if device.startswith("cuda") else "eager"
    ref = mod.MossTTSDelayModel.from_pretrained(
        str(ckpt_dir), attn_implementation=attn, dtype=torch.float32
    )
    ref = ref.to(device).eval()
    fast = load_delay_model(ckpt_dir, device=device, dtype=torch.float32)
    engines = [("", MossDelayEngine(fast, use_cuda_graphs=False, compile=False))]
    if device.startswith("cuda"):
        engines.append(
            (" (CUDA graph)", MossDelayEngine(fast, use_cuda_graphs=True, compile=False))
        )
    ok, lines = True, []
    for lengths, text_rows in (([9, 6, 12, 7], (1,)), ([10, 10], ())):
        lines.append(f"prompts of lengths {lengths} (rows ending in text: {list(text_rows)}):")
        good, more = _compare(mod, ref, fast, engines, lengths, text_rows, steps, device)
        ok &= good
        lines += ["  " + line for line in more]
    return ok, lines


def _close(name, r, f):
    finite = torch.isfinite(r)
    same_inf = torch.equal(finite, torch.isfinite(f))
    scale = r[finite].abs().max().item()
    err = (r[finite].float() - f[finite].float()).abs().max().item()
    good = same_inf and err <= RTOL * max(1.0, scale)
    return good, f"{name}: max|diff|={err:.3e} (scale {scale:.2f}, tol {RTOL:g}x) {flag(good)}"


def _compare(mod, ref, fast, engines, lengths, text_rows, steps, device):
    cfg = fast.config
    ids, mask = make_prompts(cfg, lengths, text_rows)
    ids, mask = ids.to(device), mask.to(device)
    lines, ok = [], True

    # 1. prefill
    out = ref(input_ids=ids, attention_mask=mask)
    eng = engines[0][1]
    state = eng._state_for(ids.shape[0], ids.shape[1], steps)
    state.cache.reset()
    h = fast.prefill(ids, mask, state.cache)
    for name, r, f in [
        ("prefill text logits", out.logits[0][mask], fast.text_logits(h)[mask]),
        ("last-row codebook logits", torch.stack(out.logits[1:], 1)[:, :, -1],
         fast.audio_logits(h[:, -1])),
    ]:  # fmt: skip
        good, line = _close(name, r, f)
        ok &= good
        lines.append(line)

    # 2. greedy, 3. seeded sampled
    greedy = SamplingParams(do_sample=False)
    sampled = SamplingParams(temperature=1.7, top_p=0.8, top_k=5, text_temperature=1.5,
                             text_top_p=1.0, text_top_k=50)  # fmt: skip
    seeds = [101 + 7 * b for b in range(ids.shape[0])]
    for label, p in (("greedy", greedy), ("sampled (T 1.7, top-k 5, top-p 0.8), seeded", sampled)):
        kw = dict(text_temperature=0.0, audio_temperature=0.0) if not p.do_sample else dict(
            text_temperature=1.5, text_top_p=1.0, text_top_k=50, audio_temperature=1.7,
            audio_top_p=0.8, audio_top_k=5)  # fmt: skip
        original = mod.sample_token, mod.tqdm
        mod.sample_token, mod.tqdm = DelayDraws(seeds), lambda it, **_: it  # no bar
        try:
            ref_out = ref.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, **kw)
        finally:
            mod.sample_token, mod.tqdm = original
        ref_rows = [rows[start:] for start, rows in _starts(ref_out)]
        n_ref = ref_rows[0].shape[0]
        for tag, engine in engines:
            s, n_ours = engine.run(ids, mask, seeds, DelayBudget.exact(steps), p, max_steps=steps)
            hist = s.history[:, :n_ours].cpu()
            rows_same = all(
                n_ours >= n_ref and torch.equal(hist[b, :n_ref], r.cpu())
                for b, r in enumerate(ref_rows)
            )
            codes_same = all(
                torch.equal(undo_delay(hist[b, :n_ref, 1:]), undo_delay(r[:, 1:].cpu()))
                for b, r in enumerate(ref_rows)
            )
            audio = [int((r[:, 1] != cfg.audio_pad_code).sum()) for r in ref_rows]
            good = rows_same and codes_same
            ok &= good
            lines.append(
                f"{label}{tag}: {n_ref} steps, rows {'identical' if rows_same else 'DIFFER'}, "
                f"de-delayed codes {'identical' if codes_same else 'DIFFER'} "
                f"(codebook-0 codes per row {audio}) {flag(good)}"
            )
    return ok, lines


def _starts(ref_out):
    """(prompt rows the reference output keeps before the generated ones, its rows)."""
    for start_length, rows in ref_out:
        yield int(start_length), rows


def delay_parity_main(args, tmp: Path) -> int:
    """Called by ``bestofn.parity.local.parity_main`` with its parsed arguments."""
    from bestofn.fakes.moss import write_safetensors
    from bestofn.fakes.moss_delay import published_config, random_state_dict, tiny_config

    if args.checkpoint is None:
        import json

        cfg = tiny_config()
        ckpt = tmp / "tiny-delay"
        ckpt.mkdir(parents=True)
        (ckpt / "config.json").write_text(json.dumps(published_config(cfg), indent=1))
        write_safetensors(ckpt, random_state_dict(cfg, seed=0).items(), torch.float32)
        what = "tiny random Delay checkpoint"
    else:
        ckpt, what = args.checkpoint, str(args.checkpoint)
    ok, lines = run_parity(ckpt, args.reference_code, args.frames, args.device)
    return report(
        ok,
        lines,
        f"moss-fast Delay vs reference on {what}, {args.device}; prefill "
        f"rtol {RTOL:g}, greedy and seeded sampled rows must be identical",
    )
