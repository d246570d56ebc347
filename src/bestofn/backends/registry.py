"""Backends chosen by name in config. Entries are import paths, so naming a backend
never imports the heavy libraries of the others (nemo, transformers, onnxruntime...)."""

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
        "whisper-asr": "bestofn.backends.whisper_asr:WhisperASRScorer",
        "resemblyzer": "bestofn.backends.resemblyzer_sim:ResemblyzerScorer",
        "dnsmos": "bestofn.backends.dnsmos:DNSMOSScorer",
        "parakeet": "bestofn.backends.parakeet:ParakeetScorer",
        "voiceclap": "bestofn.backends.voiceclap:VoiceCLAPScorer",
        "empathic-insight": "bestofn.backends.empathic:EmpathicInsightScorer",
    },
}

ROLE_BASE = {"generator": Generator, "restorer": Restorer, "scorer": Scorer}


class UnknownBackend(ValueError):
    pass


def backend_class(role: str, name: str) -> type:
    try:
        target = REGISTRY[role][name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY.get(role, {})))
        raise UnknownBackend(f"unknown {role} backend {name!r}; known: {known}") from None
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not issubclass(cls, ROLE_BASE[role]):
        raise TypeError(f"{target} is not a {ROLE_BASE[role].__name__}")
    return cls


def build(role: str, name: str, options: dict | None = None, device: str = "cpu"):
    """Instantiate backend ``name`` for ``role`` with its config ``options``."""
    return backend_class(role, name)(device=device, **(options or {}))
