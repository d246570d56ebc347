"""One table of every production backend's published weights: Hugging Face repo, pinned
revision, the files used (allow patterns) and the folder under the config's ``weights_root``.

The folders are those of config/recipes/*.yaml and of ``bestofn fake-weights`` (the same
layout, random weights). Sources (public pages and code seen through the search tools; more in
docs/notes/*.md):

- MOSS-TTS-Local-Transformer-v1.5 and its codec MOSS-Audio-Tokenizer-v2: OpenMOSS/MOSS-TTS
  moss_tts_local_v1.5/README.md (the checkpoint and "Audio tokenizer" rows),
  docs/notes/moss-facts.md.
- MOSS-TTS v1.5 Delay (8B) and its 24 kHz codec: HF OpenMOSS-Team/MOSS-TTS-v1.5 (tagged
  moss_tts_delay), OpenMOSS/MOSS-Audio-Tokenizer (v1, 24 kHz), docs/notes/moss-facts.md.
- Sidon: facebook/w2v-bert-2.0 + sarulab-speech/sidon_raw_weight (adapter + decoder state
  dict), docs/notes/sidon-parakeet-facts.md.
- Parakeet: nvidia/parakeet-tdt-0.6b-v3, one ``.nemo`` archive (docs/notes/sidon-parakeet-facts.md).
- VoiceCLAP: laion/voiceclap-commercial (remote code + safetensors); its two heads come from
  laion/voiceclap-commercial-genuineness and laion/voiceclap-commercial-vocalburst-blend and
  land in one folder, ``voiceclap-heads`` (docs/notes/scorers-facts.md).
- Empathic-Insight: laion/BUD-E-Whisper (encoder) + laion/Empathic-Insight-Voice-Plus (59
  ``model_<Name>_best.pth`` heads, 55 of them 295 MB), docs/notes/scorers-facts.md.
- Speaker similarity: microsoft/wavlm-base-plus-sv (config.json, preprocessor_config.json,
  weights; bestofn.backends.speaker says why WavLM and not speechbrain's ECAPA).
- Audiobox Aesthetics (optional scorer): facebook/audiobox-aesthetics, config.json +
  model.safetensors as the package's ``from_pretrained`` reads them (PyPI audiobox-aesthetics
  0.0.4, model/aes.py; docs/notes/scorers-facts.md).

Revisions: the commit each entry is fetched at, where public material pins one (full shas,
each seen pinned the same way in several unrelated public files; docs/notes/weights-revisions.md
lists them): nvidia/parakeet-tdt-0.6b-v3, facebook/w2v-bert-2.0, microsoft/wavlm-base-plus-sv.
For the others no public source seen gives a full commit sha (the one short sha seen,
Empathic-Insight-Voice-Plus 441d220 in its README history, is not a revision the hub resolves):
their ``revision`` is ``UNKNOWN``, fetch takes the repo's default branch and says so, and the
lock records the commit it resolved (``bestofn weights fetch --lock`` fetches that commit on
another machine).
Sizes: None where no public source states them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

UNKNOWN = "unknown"  # no public commit sha seen: fetch uses the default branch and says so
# the public pins (docs/notes/weights-revisions.md)
PARAKEET_V3 = "6d590f77001d318fb17a0b5bf7ee329a91b52598"
W2V_BERT_2 = "da985ba0987f70aaeb84a80f2851cfac8c697a7b"
WAVLM_BASE_PLUS_SV = "feb593a6c23c1cc3d9510425c29b0a14d2b07b1e"
GB = 10**9


@dataclass(frozen=True)
class WeightEntry:
    name: str  # what `bestofn weights fetch --only` takes
    repo_id: str  # Hugging Face model repo
    revision: str  # commit sha, or UNKNOWN
    allow_patterns: tuple[str, ...]  # the files the backend reads
    folder: str  # under weights_root; several entries may share one (VoiceCLAP's heads)
    size_bytes: int | None  # None: not stated by a public source
    backend: str  # the config backend that reads it
    note: str = ""

    @property
    def pinned(self) -> bool:
        return self.revision != UNKNOWN


MANIFEST: tuple[WeightEntry, ...] = (
    WeightEntry(
        "moss-tts-local", "OpenMOSS-Team/MOSS-TTS-Local-Transformer-v1.5", UNKNOWN,
        ("*.json", "*.safetensors", "*.py", "*.txt", "*.jinja"),
        "MOSS-TTS-Local-Transformer-v1.5", None, "moss-fast",
        "one bf16 model.safetensors, ~5B parameters counted with tied heads (third-party port)",
    ),
    WeightEntry(
        "moss-audio-tokenizer-v2", "OpenMOSS-Team/MOSS-Audio-Tokenizer-v2", UNKNOWN,
        ("*.json", "*.safetensors", "*.py"), "MOSS-Audio-Tokenizer-v2", None, "moss-fast",
        "fp32, the published 2.1 B architecture (about 8.5 GB at that size)",
    ),
    WeightEntry(
        "moss-tts-delay", "OpenMOSS-Team/MOSS-TTS-v1.5", UNKNOWN,
        ("*.json", "*.safetensors", "*.py", "*.txt", "*.jinja"), "MOSS-TTS-Delay-v1.5", None,
        "moss-fast", "the 8B Delay generator (Qwen3-8B backbone, 32 codebooks)",
    ),
    # LAION's voice-acting fine-tunes, the generators of config/recipes/{emotions,clone}.yaml
    # (Local) and delay.yaml (Delay), in their base's published layout (docs/notes/recipes.md)
    WeightEntry(
        "moss-tts-local-voice-acting", "laion/moss-tts-local-transformer-4.55b-voice-acting",
        UNKNOWN, ("*.json", "*.safetensors", "*.py", "*.txt", "*.jinja"),
        "moss-tts-local-transformer-4.55b-voice-acting", None, "moss-fast",
        "alternative generator: moss_tts_local, a merged rank-256 LoRA; codec: the v2 one",
    ),
    WeightEntry(
        "moss-tts-delay-voice-acting", "laion/moss-tts-v1.5-8b-voice-acting", UNKNOWN,
        ("*.json", "*.safetensors", "*.py", "*.txt", "*.jinja"), "moss-tts-v1.5-8b-voice-acting",
        None, "moss-fast", "alternative generator: moss_tts_delay, 32 codebooks; 24 kHz codec",
    ),
    WeightEntry(
        "moss-audio-tokenizer", "OpenMOSS-Team/MOSS-Audio-Tokenizer", UNKNOWN,
        ("*.json", "*.safetensors", "*.py"), "MOSS-Audio-Tokenizer", None, "moss-fast",
        "the 24 kHz codec of MOSS-TTS Delay",
    ),
    WeightEntry(
        "w2v-bert-2.0", "facebook/w2v-bert-2.0", W2V_BERT_2,
        ("config.json", "model.safetensors", "preprocessor_config.json"), "w2v-bert-2.0", None,
        "sidon", "Sidon's base encoder (its first 8 layers are used)",
    ),
    WeightEntry(
        "sidon", "sarulab-speech/sidon_raw_weight", UNKNOWN,
        ("adapter_config.json", "adapter_model.safetensors", "decoder_state_dict.pt"),
        "sidon_raw_weight", None, "sidon", "peft LoRA adapter + DAC decoder state dict",
    ),
    WeightEntry(
        "parakeet", "nvidia/parakeet-tdt-0.6b-v3", PARAKEET_V3, ("parakeet-tdt-0.6b-v3.nemo",),
        "parakeet-tdt-0.6b-v3", None, "parakeet",
    ),
    WeightEntry(
        "voiceclap", "laion/voiceclap-commercial", UNKNOWN,
        ("*.json", "*.py", "*.safetensors", "*.txt"), "voiceclap-commercial", None, "voiceclap",
        "110M dual-tower CLAP, loaded through its remote code",
    ),
    WeightEntry(
        "voiceclap-genuineness", "laion/voiceclap-commercial-genuineness", UNKNOWN,
        ("genu_commercial_best.pt",), "voiceclap-heads", None, "voiceclap",
    ),
    WeightEntry(
        "voiceclap-blend", "laion/voiceclap-commercial-vocalburst-blend", UNKNOWN,
        ("blend_head_commercial.pt",), "voiceclap-heads", None, "voiceclap",
    ),
    WeightEntry(
        "bud-e-whisper", "laion/BUD-E-Whisper", UNKNOWN, ("*.json", "*.txt", "*.safetensors"),
        "BUD-E-Whisper", None, "empathic-insight", "a Whisper-Small fine-tune (the encoder)",
    ),
    WeightEntry(
        "empathic-insight", "laion/Empathic-Insight-Voice-Plus", UNKNOWN, ("model_*_best.pth",),
        "Empathic-Insight-Voice-Plus", 55 * 295 * 10**6, "empathic-insight",
        "59 heads; the 55 full-sequence ones are 295 MB each (HF file pages), the 4 pooled "
        "quality heads are small (size not stated: the total is a lower bound)",
    ),
    WeightEntry(
        "wavlm-speaker", "microsoft/wavlm-base-plus-sv", WAVLM_BASE_PLUS_SV,
        ("config.json", "preprocessor_config.json", "*.safetensors", "pytorch_model.bin"),
        "wavlm-base-plus-sv", None, "wavlm-speaker",
        "WavLMForXVector; the published folder may hold pytorch_model.bin (the loader reads it)",
    ),
    WeightEntry(
        "audiobox-aesthetics", "facebook/audiobox-aesthetics", UNKNOWN,
        ("config.json", "model.safetensors", "checkpoint.pt"), "audiobox-aesthetics", None,
        "audiobox-aesthetics",
        "optional scorer; WavLM-Base + four axis heads; the hub export (config.json + "
        "model.safetensors) and the package's checkpoint.pt: which the repo holds is unknown, "
        "the loader reads either (safetensors first)",
    ),
)  # fmt: skip

BY_NAME = {e.name: e for e in MANIFEST}


class UnknownWeights(ValueError):
    pass


def select(names) -> list[WeightEntry]:
    """The entries named (all for none); an unknown name raises, listing the known ones."""
    if not names:
        return list(MANIFEST)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise UnknownWeights(
            f"unknown weights {', '.join(map(repr, unknown))}; known: {', '.join(BY_NAME)}"
        )
    return [BY_NAME[n] for n in dict.fromkeys(names)]


def entries_in_folder(folder: str) -> list[WeightEntry]:
    return [e for e in MANIFEST if e.folder == folder]


def folder_of(relative: str) -> str | None:
    """The manifest folder a path relative to the weights root lies in (its first part)."""
    parts = PurePosixPath(relative).parts
    return parts[0] if parts and any(e.folder == parts[0] for e in MANIFEST) else None


def entries_for_config(config: dict) -> list[WeightEntry]:
    """The entries whose folder a config's model paths name (relative to ``weights_root``, or
    absolute paths under it), in manifest order."""
    from bestofn.weights.paths import relative_weight_paths

    folders = {folder_of(rel) for rel in relative_weight_paths(config)}
    return [e for e in MANIFEST if e.folder in folders]
