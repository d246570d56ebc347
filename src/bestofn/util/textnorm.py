"""English text normalisation before WER/CER.

"nine" vs "9" or "Hello," vs "hello" is not an error."""

from __future__ import annotations

from functools import lru_cache

import jiwer


@lru_cache(maxsize=1)
def _normalizer():
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def normalize_en(text: str) -> str:
    return " ".join(_normalizer()(text or "").split())


def wer_cer(reference: str, hypothesis: str) -> tuple[float, float]:
    """WER and CER after normalising both sides. An empty reference scores 0 only if the
    hypothesis is empty too, else 1 (jiwer refuses empty references)."""
    ref, hyp = normalize_en(reference), normalize_en(hypothesis)
    if not ref:
        return (0.0, 0.0) if not hyp else (1.0, 1.0)
    if not hyp:
        return 1.0, 1.0
    return float(jiwer.wer(ref, hyp)), float(jiwer.cer(ref, hyp))


def asr_columns(reference: str, transcripts: list[str]) -> dict[str, list]:
    """The columns every ASR scorer writes: transcript, wer, cer."""
    errors = [wer_cer(reference, t) for t in transcripts]
    return {
        "transcript": list(transcripts),
        "wer": [w for w, _ in errors],
        "cer": [c for _, c in errors],
    }
