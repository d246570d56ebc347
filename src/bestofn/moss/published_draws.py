"""Per-take draws inside the published MOSS ``generate`` loops (the authors' remote code).

The published loops draw every token of a batch from torch's global RNG, so a take would depend
on its batch neighbours. For one ``generate`` call we replace only the draw: penalty and
filtering stay the published ones, and the random number of a take is ``take_uniform(seed,
step * 64 + j)`` from ``bestofn.moss.sampling``, the numbers our engines draw. So moss-hf gives
a take the same randomness as moss-fast, and ``bestofn parity`` can compare seeded sampling.

- ``LocalDraws``: stands in for MOSS-TTS-Local's ``model._sample_next_token``;
- ``DelayDraws``: stands in for MOSS-TTS Delay's module function ``sample_token``.

Both are product code (moss-hf runs them on every group); the parity checks use them too.
"""

from __future__ import annotations

import sys

import torch

from bestofn.moss.sampling import STEPS_PER_FRAME, sample_tokens, take_uniform


class LocalDraws:
    """Stands in for ``model._sample_next_token`` during one Local ``generate`` call.

    The loop calls it once per frame for the stop head, then once per codebook, always for the
    whole batch and always in that order, so the n-th call is (frame n // (n_vq+1), step
    n % (n_vq+1)). Penalty and filtering are the reference's; only the draw is per take.
    """

    def __init__(self, model, seeds: list[int], n_vq: int, device):
        self.model, self.n_vq, self.calls = model, n_vq, 0
        self.seeds = torch.tensor(seeds, dtype=torch.long, device=device)

    def __call__(self, logits, do_sample, temperature, top_k, top_p, previous_token_ids=None,
                 repetition_penalty=1.0):  # fmt: skip
        frame, step = divmod(self.calls, self.n_vq + 1)
        self.calls += 1
        scores = self.model._apply_repetition_penalty(
            logits.float(), previous_token_ids, repetition_penalty
        )
        if do_sample and float(temperature) <= 0:
            raise ValueError("temperature must be positive when do_sample=True.")
        uniform = take_uniform(self.seeds.to(scores.device), frame * STEPS_PER_FRAME + step)
        return sample_tokens(
            scores,
            uniform,
            temperature=float(temperature),
            top_k=int(top_k or 0),
            top_p=float(1.0 if top_p is None else top_p),
            do_sample=bool(do_sample),
        )


class DelayDraws:
    """Stands in for the published Delay module's ``sample_token`` during one ``generate``. It
    reads which rows (and codebooks) are being sampled from the caller's masks, and draws their
    numbers from the per-take uniforms. ``penalty``: the published penalty function, applied as
    the published ``sample_token`` does (None: a penalty other than 1.0 is refused, because the
    published one pools the whole batch, which per-take seeds cannot reproduce)."""

    def __init__(self, seeds, penalty=None):
        self.seeds = torch.as_tensor(seeds, dtype=torch.long)
        self.penalty = penalty

    def __call__(self, logits, prev_tokens=None, repetition_penalty=1.0, top_p=None,
                 top_k=None, do_sample=True):  # fmt: skip
        if repetition_penalty != 1.0:
            if self.penalty is None:
                raise ValueError("the published Delay penalty pools the batch: not comparable")
            logits = self.penalty(logits, prev_tokens, repetition_penalty)
        # the published generate keeps what is being sampled in its locals, not in arguments
        loc = sys._getframe(1).f_locals
        need = "sampling_text_mask" if prev_tokens is None else "sampling_audio_mask"
        if need not in loc or "time_step" not in loc:
            raise RuntimeError("the published Delay generate changed (no sampling masks found)")
        t, dev = int(loc["time_step"]), logits.device
        if prev_tokens is None:  # text channel
            rows = loc["sampling_text_mask"].nonzero()[:, 0]
            offs = torch.zeros_like(rows)
        elif prev_tokens.dim() == 2:  # codebook 0
            rows = loc["sampling_audio_mask"][:, 0].nonzero()[:, 0]
            offs = torch.ones_like(rows)
        else:  # codebooks 1.., row-major as the boolean index takes them
            nz = loc["sampling_audio_mask"][:, 1:].nonzero()
            rows, offs = nz[:, 0], 2 + nz[:, 1]
        u = take_uniform(self.seeds.to(dev)[rows], t * STEPS_PER_FRAME + offs.to(dev))
        return sample_tokens(logits, u, temperature=1.0, top_k=int(top_k or 0),
                             top_p=float(top_p if top_p is not None else 1.0),
                             do_sample=do_sample)  # fmt: skip
