"""GPU sampling with per-take, counter-based random numbers.

Why counter-based: a stateful ``torch.Generator`` per take cannot live inside one CUDA graph that
samples a whole batch, and a shared generator makes a take depend on its batch neighbours. Here
every random number is a pure hash of (take seed, frame, step), so take i draws exactly the same
uniforms whatever batch it is in, on CPU or GPU, eager or graph-replayed.

The sampling order follows the reference (modeling_moss_tts.py ``_sample_next_token``):
repetition penalty -> temperature -> top-k -> top-p -> draw. Top-p is applied inside the top-k
candidates (as the reference streaming path does), which is the same distribution as filtering
the whole vocabulary. The draw is an inverse-CDF lookup with the take's uniform.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

MASK32 = 0xFFFFFFFF
STEPS_PER_FRAME = 64  # counter = frame * 64 + step; step 0 = stop head, 1.. = codebooks (<= 63)


@dataclass(frozen=True)
class SamplingParams:
    """Defaults: the model card's recommendation for MossTTSLocal-4B v1.5
    (OpenMOSS/MOSS-TTS docs/moss_tts_model_card.md)."""

    temperature: float = 1.7
    top_p: float = 0.8
    top_k: int = 25
    repetition_penalty: float = 1.0
    text_temperature: float = 1.0  # the binary continue/stop head (reference defaults)
    text_top_p: float = 1.0
    text_top_k: int = 50
    do_sample: bool = True

    def __post_init__(self):
        if self.do_sample and (self.temperature <= 0 or self.text_temperature <= 0):
            raise ValueError("temperature must be positive when sampling")
        if not (0.0 < self.top_p <= 1.0 and 0.0 < self.text_top_p <= 1.0):
            raise ValueError("top_p must be in (0, 1]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be positive")

    def to_dict(self) -> dict:
        return asdict(self)


def _hash32(x: torch.Tensor) -> torch.Tensor:
    # A 32-bit integer finalizer computed in int64 so no product overflows (both multipliers are
    # below 2**31 and x below 2**32). Plain tensor ops: works on CPU, CUDA and inside CUDA graphs.
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & MASK32
    return x ^ (x >> 16)


def take_uniform(seeds: torch.Tensor, counter: torch.Tensor | int) -> torch.Tensor:
    """One float32 in (0, 1) per row, a pure function of (seed, counter). seeds: int64 [B]."""
    seed_lo = seeds & MASK32
    seed_hi = (seeds >> 32) & MASK32
    if not torch.is_tensor(counter):
        counter = torch.tensor(counter, dtype=torch.long, device=seeds.device)
    h = _hash32(_hash32(_hash32(counter & MASK32) ^ seed_hi) ^ seed_lo)
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor | float
) -> torch.Tensor:
    """Reference rule on codes already generated in this channel: s<0 -> s*p, else s/p."""
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalized, logits)


def sample_tokens(
    logits: torch.Tensor,
    uniform: torch.Tensor,
    *,
    temperature: torch.Tensor | float,
    top_k: int,
    top_p: torch.Tensor | float,
    do_sample: bool = True,
) -> torch.Tensor:
    """logits: float [B, V]; uniform: [B] in (0,1). Returns int64 [B]. No host sync, no data-
    dependent shapes (top_k is a static int), so it can be captured in a CUDA graph."""
    logits = logits.float()
    if not do_sample:
        return logits.argmax(dim=-1)
    k = logits.shape[-1] if top_k <= 0 else min(int(top_k), logits.shape[-1])
    values, indices = torch.topk(logits, k, dim=-1, sorted=True)
    probs = torch.softmax(values / temperature, dim=-1)
    # top-p: drop a candidate when the mass strictly before it already exceeds top_p (so the
    # first candidate always stays). Same rule as the reference's shifted cumulative mask.
    before = probs.cumsum(dim=-1) - probs
    probs = probs.masked_fill(before > top_p, 0.0)
    cdf = probs.cumsum(dim=-1)
    target = uniform.unsqueeze(-1) * cdf[:, -1:]
    choice = (cdf < target).sum(dim=-1, keepdim=True).clamp_(max=k - 1)
    return indices.gather(-1, choice).squeeze(-1)


def sample_tokens_fused(
    logits: torch.Tensor,
    uniform: torch.Tensor,
    *,
    temperature: torch.Tensor | float,
    top_k: int,
    top_p: torch.Tensor | float,
    do_sample: bool = True,
) -> torch.Tensor:
    """``sample_tokens`` with fewer ops and the same result, bit for bit (tests/
    test_moss_local_loop.py): one cumulative sum instead of two, no masked copy of the
    probabilities, and the inverse-CDF lookup as one ``searchsorted``.

    Why it is the same draw: the candidates are sorted, so the cumulative sum ``cdf`` of the
    unfiltered probabilities is nondecreasing and top-p keeps a prefix of them. On that prefix
    it equals the filtered cumulative sum (the dropped ones only come after), and its last kept
    value is the filtered total. Every dropped candidate has ``cdf >= total >= u * total``, so
    counting ``cdf < u * total`` over all k counts exactly the kept ones ``sample_tokens``
    counts."""
    logits = logits.float()
    if not do_sample:
        return logits.argmax(dim=-1)
    k = logits.shape[-1] if top_k <= 0 else min(int(top_k), logits.shape[-1])
    values, indices = torch.topk(logits, k, dim=-1, sorted=True)
    probs = torch.softmax(values / temperature, dim=-1)
    cdf = probs.cumsum(dim=-1)
    total = (cdf * (cdf - probs <= top_p)).amax(dim=-1, keepdim=True)  # x1 kept, x0 dropped
    choice = torch.searchsorted(cdf, uniform.unsqueeze(-1) * total).clamp_(max=k - 1)
    return indices.gather(-1, choice).squeeze(-1)
