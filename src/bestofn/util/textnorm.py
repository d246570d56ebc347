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


# How far from the transcript's end the text's last words may be and still count as spoken:
# the ASR may add a word or two after them (a breath read as "uh", a repeated burst).
TAIL_SLACK_WORDS = 3


def finished(reference: str, hypothesis: str) -> bool:
    """The take spoke its text to the end: the text's last three words (normalised; all of them
    when fewer) appear, in order, among the transcript's last three + TAIL_SLACK_WORDS words.
    LAION's voice-acting recipe records this "last-3-words-in-ASR-tail" flag per take to catch
    the truncations a stop token hides (docs/notes/recipes.md). An empty text: finished."""
    last = normalize_en(reference).split()[-3:]
    if not last:
        return True
    tail = iter(normalize_en(hypothesis).split()[-(len(last) + TAIL_SLACK_WORDS) :])
    return all(word in tail for word in last)  # in order: `in` consumes the iterator


def asr_columns(reference: str, transcripts: list[str]) -> dict[str, list]:
    """The columns every ASR scorer writes: transcript, wer, cer, finished."""
    errors = [wer_cer(reference, t) for t in transcripts]
    return {
        "transcript": list(transcripts),
        "wer": [w for w, _ in errors],
        "cer": [c for _, c in errors],
        "finished": [finished(reference, t) for t in transcripts],
    }
