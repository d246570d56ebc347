"""Backends chosen by name in config. Entries are import paths, so naming a backend
never imports the heavy libraries of the others (nemo, transformers, onnxruntime...).

A config may also name its own backend by import path, ``package.module:Class`` (a plugin:
any importable class deriving from the role's base class in ``bestofn.backends.base``)."""

from __future__ import annotations

import importlib

from bestofn.backends.base import Generator, Restorer, Scorer

REGISTRY: dict[str, dict[str, str]] = {
    "generator": {
        "piper": "bestofn.backends.piper:PiperGenerator",
        "moss-hf": "bestofn.backends.moss_hf:MossHFGenerator",
        "moss-fast": "bestofn.backends.moss_fast:MossFastGenerator",
    },
    "restorer": {
        "identity": "bestofn.backends.resample:IdentityRestorer",
        "resample": "bestofn.backends.resample:ResampleRestorer",
        "sidon": "bestofn.backends.sidon:SidonRestorer",
    },
    "scorer": {
        "duration": "bestofn.backends.duration:DurationScorer",
        "volume": "bestofn.backends.volume:VolumeScorer",
        "whisper-asr": "bestofn.backends.whisper_asr:WhisperASRScorer",
        "resemblyzer": "bestofn.backends.resemblyzer_sim:ResemblyzerScorer",
        "wavlm-speaker": "bestofn.backends.speaker:SpeakerScorer",
        "dnsmos": "bestofn.backends.dnsmos:DNSMOSScorer",
        "parakeet": "bestofn.backends.parakeet:ParakeetScorer",
        "voiceclap": "bestofn.backends.voiceclap:VoiceCLAPScorer",
        "empathic-insight": "bestofn.backends.empathic:EmpathicInsightScorer",
        "audiobox-aesthetics": "bestofn.backends.audiobox:AudioboxAestheticsScorer",
    },
}

# What a backend imports when it is built, beyond its own module: "module" or
# "module:Attr,Attr" (a lazy package's attributes import their modules). bestofn.backends.loading
# imports these in one thread while other backends read their weights, IN THIS ORDER (not the
# config's). The builds that need them run one at a time (PARALLEL_BUILD, below), so the order
# keeps that one-at-a-time lane busy while the long import runs: Empathic-Insight first (its
# transformers import is short, its build long), then Parakeet (NeMo's long import overlaps
# that build; ledger figure worker_start.first_group_load_s), Sidon, VoiceCLAP, the speaker
# model. A
# backend with no entry (moss-fast, duration, piper) imports nothing here and builds at once.
PRELOAD: dict[str, tuple[str, ...]] = {
    "empathic-insight": ("transformers:WhisperFeatureExtractor,WhisperModel",),
    "parakeet": ("omegaconf", "nemo.collections.asr.models:ASRModel"),
    "sidon": (
        "safetensors.torch",
        "transformers:Wav2Vec2BertConfig,Wav2Vec2BertModel,SeamlessM4TFeatureExtractor",
    ),
    "voiceclap": ("transformers:AutoModel",),
    "wavlm-speaker": ("transformers:WavLMForXVector,Wav2Vec2FeatureExtractor",),
    "audiobox-aesthetics": ("safetensors.torch", "transformers:WavLMModel"),
    "whisper-asr": ("faster_whisper",),
}

# Backends whose build may run beside another's (bestofn.backends.loading): they construct
# nothing under torch's process-wide defaults (moss-fast builds on the meta device and casts
# explicitly; the others hold no torch modules). Every other build runs one at a time, because
# transformers' ``from_pretrained`` sets torch's default dtype for the whole process while it
# builds (``local_torch_dtype``) and patches ``torch.nn.init``: a module built in another thread
# meanwhile takes that dtype, and two such loads interleaved can leave it set. On the H200 that
# gave VoiceCLAP bfloat16 heads (a dtype error) and Parakeet an illegal memory access.
PARALLEL_BUILD = frozenset({"moss-fast", "duration", "volume", "identity", "resample", "piper"})

ROLE_BASE = {"generator": Generator, "restorer": Restorer, "scorer": Scorer}


class UnknownBackend(ValueError):
    pass


def is_plugin(name: str) -> bool:
    """A backend named by import path (``package.module:Class``) rather than a short name."""
    return ":" in name


def check_name(role: str, name: str) -> None:
    """Raise UnknownBackend for a short name that is not registered (imports nothing)."""
    if not is_plugin(name) and name not in REGISTRY.get(role, {}):
        known = ", ".join(sorted(REGISTRY.get(role, {})))
        raise UnknownBackend(
            f"unknown {role} backend {name!r}; known: {known}, or your own class as "
            "'package.module:Class'"
        )


def backend_class(role: str, name: str) -> type:
    check_name(role, name)
    target = name if is_plugin(name) else REGISTRY[role][name]
    module_name, _, attr = target.partition(":")
    if is_plugin(name):
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise UnknownBackend(
                f"{role} backend {name!r}: cannot import {module_name}: {e}"
            ) from None
        if not attr or not hasattr(module, attr):
            raise UnknownBackend(f"{role} backend {name!r}: module {module_name} has no {attr!r}")
        cls = getattr(module, attr)
    else:
        cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, ROLE_BASE[role])):
        raise UnknownBackend(f"{role} backend {target} is not a {ROLE_BASE[role].__name__}")
    return cls


def build(role: str, name: str, options: dict | None = None, device: str = "cpu"):
    """Instantiate backend ``name`` for ``role`` with its config ``options``. A scorer's
    ``resampler`` (runtime) is the pipeline's, not the constructor's: set on the instance and
    added to its provenance (the resampled input can change its scores)."""
    options = dict(options or {})
    if role != "scorer":
        return backend_class(role, name)(device=device, **options)
    from bestofn.backends.base import resolve_resampler

    resampler = resolve_resampler(options.pop("resampler", None), device)
    scorer = backend_class(role, name)(device=device, **options)
    scorer.resampler = resampler
    own = scorer.provenance
    scorer.provenance = lambda: {**own(), "resampler": scorer.resampler}  # as it runs now
    return scorer
