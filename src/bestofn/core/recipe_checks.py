"""Two checks of how a config uses its models, run when a plan is built (so `bestofn check`, the
workflow and every command that plans say it before any GPU work):

- **Speaker floors only where a reference exists.** A speaker scorer (``wavlm-speaker``'s
  ``spk_sim``, ``resemblyzer``'s ``speaker_sim``) compares a take with its group's reference
  voice, or, when the group has none, with the centroid of the group's own takes. A filter on
  that column then gates how *typical* a take is, not whose voice it is: the plan refuses it,
  naming the groups without a reference. A score that uses it is a note (ranking by typicality
  may be meant).
- **Raw output for 48 kHz-native generators.** Sidon takes its input to 16 kHz and vocodes it to
  48 kHz; on a generator that already makes 48 kHz (MOSS-TTS-Local with codec v2) that round
  trip removes the real 8-16 kHz band. LAION's voice-acting recipe keeps such output raw and
  runs Sidon only on the 24 kHz Delay model (LAION-AI/laion-moss-local-1.5-voice-acting-4.55b
  SYNTHETIC_DATA_RECIPE.md section 4; docs/notes/recipes.md). A note, naming the file that
  states the rate.
"""

from __future__ import annotations

import json
from pathlib import Path

WIDEBAND_HZ = 48000  # a generator at this rate or above has nothing for Sidon to extend
SHOWN_GROUPS = 8  # groups named in the message; the rest counted


def speaker_gate(selection: dict, groups: dict, models: dict) -> tuple[list[str], list[str]]:
    """(errors, notes) of a selection that uses a speaker column (a scorer's
    ``reference_columns``: the group's centroid without a reference voice) for groups with no
    reference voice. ``groups``: (emotion, prompt_id) -> GroupSpec."""
    from bestofn.backends.registry import backend_class
    from bestofn.select.held_out import referenced_columns

    speaker_columns = {
        column: entry["backend"]
        for entry in models.get("scorers", [])
        for column in backend_class("scorer", entry["backend"]).reference_columns
    }
    if not selection or not speaker_columns:
        return [], []
    blind = sorted(f"{e}/{p}" for (e, p), spec in groups.items() if not spec.reference_audio)
    if not blind:
        return [], []
    named = ", ".join(blind[:SHOWN_GROUPS])
    if len(blind) > SHOWN_GROUPS:
        named += f" and {len(blind) - SHOWN_GROUPS} more"
    errors, notes = [], []
    for field, bucket in (("filter", errors), ("score", notes)):
        sql = selection.get(field)
        if not sql:
            continue
        used = sorted(c for c in referenced_columns(sql, field) if c in speaker_columns)
        for column in used:
            what = (
                f"config selection.{field} uses {column} ({speaker_columns[column]}), but "
                f"{len(blind)} group(s) have no reference voice: {named}. Without one, "
                f"{column} is the similarity to the group's own centroid (how typical a take "
                "is), not to a voice"
            )
            if field == "filter":
                what += (
                    "; give those groups a reference_audio (emotions or prompts sheet), or drop "
                    f"the {column} clause (config/README.md, 'Recipes')"
                )
            bucket.append(what)
    return errors, notes


def _rate(path: Path) -> int | None:
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    for section in (cfg, cfg.get("quantizer_kwargs"), cfg.get("quantizer_config")):
        if isinstance(section, dict):
            for key in ("sampling_rate", "sample_rate"):
                if section.get(key) is not None:
                    return int(section[key])
    return None


def generator_rate(generator: dict) -> tuple[str, int] | None:
    """(the file, its rate) of a codec-based generator's output, from ``codec_dir`` or
    ``model_dir`` config.json (paths already resolved); None when no file states it."""
    options = generator.get("options") or {}
    for key in ("codec_dir", "model_dir"):
        if options.get(key):
            path = Path(options[key]) / "config.json"
            rate = _rate(path)
            if rate is not None:
                return str(path), rate
    return None


def restorer_notes(models: dict) -> list[str]:
    from bestofn.backends.registry import backend_class

    restorer = models.get("restorer") or {}
    heard = restorer and backend_class("restorer", restorer["backend"]).input_sample_rate
    if not heard:
        return []
    found = generator_rate(models.get("generator") or {})
    if found is None or found[1] < WIDEBAND_HZ:
        return []
    path, rate = found
    khz = heard / 1000
    return [
        f"config models.restorer: {restorer['backend']} restores a {rate} Hz generator ({path} "
        f"states its rate): its {khz:g} kHz input drops the take's real {khz / 2:g}-{khz:g} kHz "
        "band and its vocoder makes it again. LAION's voice-acting recipe keeps 48 kHz-native "
        "output raw and uses Sidon only for the 24 kHz Delay model; remove models.restorer "
        "(config/recipes/emotions.yaml does)"
    ]
