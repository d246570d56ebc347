"""The 40 Empathic-Insight-Voice-Plus emotion heads, and how a source's emotion name finds its
head: case, spaces and punctuation folded, then LAION's three folder renames.

Head names: the published head files ``model_<Name>_best.pth`` of laion/Empathic-Insight-
Voice-Plus, as config/voice_acting/emotions.tsv lists them. Renames: LAION-AI/laion-moss-
local-1.5-voice-acting-4.55b SYNTHETIC_DATA_RECIPE.md section 1b."""

from __future__ import annotations

import re

EMOTION_HEADS = (
    "Affection", "Amusement", "Anger", "Astonishment_Surprise", "Awe", "Bitterness",
    "Concentration", "Confusion", "Contemplation", "Contempt", "Contentment", "Disappointment",
    "Disgust", "Distress", "Doubt", "Elation", "Embarrassment", "Emotional_Numbness",
    "Fatigue_Exhaustion", "Fear", "Helplessness", "Hope_Enthusiasm_Optimism",
    "Impatience_and_Irritability", "Infatuation", "Interest",
    "Intoxication_Altered_States_of_Consciousness", "Jealousy_&_Envy", "Longing",
    "Malevolence_Malice", "Pain", "Pleasure_Ecstasy", "Pride", "Relief", "Sadness",
    "Sexual_Lust", "Shame", "Sourness", "Teasing", "Thankfulness_Gratitude", "Triumph",
)  # fmt: skip


def fold(name: str) -> str:
    """``Jealousy & Envy`` and ``Jealousy_&_Envy`` -> ``jealousy_envy`` (as bestofn.backends.
    empathic folds a sheet's ei_head)."""
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


# voice-acting-prompts folder (and DramaBox emotion) names that differ from their head's
RENAMES = {
    "hope_optimism": "Hope_Enthusiasm_Optimism",
    "intoxication_altered_states": "Intoxication_Altered_States_of_Consciousness",
    "jealousy_envy": "Jealousy_&_Envy",
}
_BY_FOLD = {fold(h): h for h in EMOTION_HEADS} | RENAMES


def head_for(name: str) -> str | None:
    """The head of a source's emotion name; None when none matches."""
    return _BY_FOLD.get(fold(name))


def emotion_id(head: str) -> str:
    """The emotions sheet's id of a head (``Jealousy_&_Envy`` -> ``Jealousy_Envy``), as
    config/voice_acting/emotions.tsv names them."""
    return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_.-]+", "_", head)).strip("_")
