"""WER normalisation per language, on real sentences: English keeps Whisper's English rules;
French, Spanish and German keep their accents (they spell other words), fold case (ß),
treat straight and curly apostrophes alike, and ignore punctuation, (cues) and [tags]."""

import pytest

from bestofn.util.textnorm import asr_columns, normalize, wer_cer


def test_english_is_unchanged():
    assert wer_cer("It is nine o'clock.", "it is 9 o'clock", "en") == (0.0, 0.0)
    assert (
        normalize("(SIGH) Hoist the sails, we leave at dawn!") == "hoist the sails we leave at dawn"
    )


@pytest.mark.parametrize(
    "language, reference, hypothesis",
    [
        ("fr", "Non... c'est pas possible. C'est un os. Un vrai.",
         "non c’est pas possible c’est un os un vrai"),  # straight vs curly apostrophe
        ("fr", "(Voix brisée) Tu m’as appris à nager, tu te souviens ?",
         "tu m'as appris à nager tu te souviens"),
        ("es", "¡Mira esto! ¿Qué necesitas? [pausa] Dime... ¿estás bien así?",
         "mira esto qué necesitas dime estás bien así"),
        ("de", "Weißt du was? Es schmeckt... wie alte Asche.",
         "WEISST DU WAS, ES SCHMECKT WIE ALTE ASCHE"),  # ß casefolds to ss
    ],
)  # fmt: skip
def test_other_languages_match_when_only_the_writing_differs(language, reference, hypothesis):
    assert wer_cer(reference, hypothesis, language) == (0.0, 0.0)


@pytest.mark.parametrize(
    "language, reference, hypothesis, wrong",
    [
        ("fr", "Où est la clé ?", "ou est la clé", 1),  # "où" (where) is not "ou" (or)
        ("es", "Sí, él lo sabe.", "si el lo sabe", 2),  # "sí" (yes), "él" (he)
        ("de", "Ich hab dich, schön.", "ich hab dich schon", 1),  # "schön" is not "schon"
    ],
)
def test_accents_are_words(language, reference, hypothesis, wrong):
    n = len(normalize(reference, language).split())
    assert wer_cer(reference, hypothesis, language)[0] == pytest.approx(wrong / n)


def test_english_rules_would_hide_those_errors():
    """Why non-English text is not run through the English normaliser: it strips accents."""
    assert wer_cer("Où est la clé ?", "ou est la cle", "en")[0] == 0.0
    assert wer_cer("Où est la clé ?", "ou est la cle", "fr")[0] > 0.0


def test_the_asr_columns_take_the_language():
    cols = asr_columns("Ça va, ça vient.", ["ça va ça vient", "ca va ca vient"], "fr")
    assert cols["wer"] == [0.0, 0.5]  # "ca" twice for "ça"
