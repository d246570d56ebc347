"""Text normalisation before WER/CER, per the group's language.

"nine" vs "9" or "Hello," vs "hello" is not an error. English text goes through Whisper's
English normaliser (numbers, spellings, contractions). Any other language goes through its
basic normaliser with the accents kept (they spell different words: French "ou" / "où",
Spanish "si" / "sí"), casefolded (German "Straße" = "STRASSE"), with apostrophes and other
punctuation made word breaks (French "c'est" and "c’est" both read "c est"). Both keep
(parentheticals) and [bracket tags] out, as the voice-acting recipe's WER does (LAION-AI/
laion-moss-local-1.5-voice-acting-4.55b SYNTHETIC_DATA_RECIPE.md section 5)."""

from __future__ import annotations

from functools import lru_cache

import jiwer

ENGLISH = "en"


@lru_cache(maxsize=1)
def _english():
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


@lru_cache(maxsize=1)
def _basic():
    from whisper_normalizer.basic import BasicTextNormalizer

    return BasicTextNormalizer(remove_diacritics=False)


def is_english(language: str | None) -> bool:
    """An ISO 639 code (``en``, ``en-GB``) or None: English is the default language."""
    return not language or language.lower().split("-")[0].split("_")[0] in (ENGLISH, "eng")


def normalize_en(text: str) -> str:
    return " ".join(_english()(text or "").split())


def normalize(text: str, language: str | None = ENGLISH) -> str:
    """The words WER counts, for a text in ``language`` (ISO 639-1 code; None: English)."""
    if is_english(language):
        return normalize_en(text)
    return " ".join(_basic()(text or "").casefold().split())


def wer_cer(reference: str, hypothesis: str, language: str | None = ENGLISH) -> tuple[float, float]:
    """WER and CER after normalising both sides. An empty reference scores 0 only if the
    hypothesis is empty too, else 1 (jiwer refuses empty references)."""
    ref, hyp = normalize(reference, language), normalize(hypothesis, language)
    if not ref:
        return (0.0, 0.0) if not hyp else (1.0, 1.0)
    if not hyp:
        return 1.0, 1.0
    return float(jiwer.wer(ref, hyp)), float(jiwer.cer(ref, hyp))


# How far from the transcript's end the text's last words may be and still count as spoken:
# the ASR may add a word or two after them (a breath read as "uh", a repeated burst).
TAIL_SLACK_WORDS = 3


def finished(reference: str, hypothesis: str, language: str | None = ENGLISH) -> bool:
    """The take spoke its text to the end: the text's last three words (normalised; all of them
    when fewer) appear, in order, among the transcript's last three + TAIL_SLACK_WORDS words.
    LAION's voice-acting recipe records this "last-3-words-in-ASR-tail" flag per take to catch
    the truncations a stop token hides (docs/notes/recipes.md). An empty text: finished."""
    last = normalize(reference, language).split()[-3:]
    if not last:
        return True
    tail = iter(normalize(hypothesis, language).split()[-(len(last) + TAIL_SLACK_WORDS) :])
    return all(word in tail for word in last)  # in order: `in` consumes the iterator


def asr_columns(
    reference: str, transcripts: list[str], language: str | None = ENGLISH
) -> dict[str, list]:
    """The columns every ASR scorer writes: transcript, wer, cer, finished."""
    errors = [wer_cer(reference, t, language) for t in transcripts]
    return {
        "transcript": list(transcripts),
        "wer": [w for w, _ in errors],
        "cer": [c for _, c in errors],
        "finished": [finished(reference, t, language) for t in transcripts],
    }
