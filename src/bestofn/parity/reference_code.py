"""A copy of the published MOSS code (OpenMOSS/MOSS-TTS), imported for the comparisons that
check our engines against it (``bestofn parity``, ``bench generate``), and the verdict line
those checks print. Never imported by the product: the product runs the published code only
through ``trust_remote_code`` (moss-hf)."""

from __future__ import annotations

import hashlib
import importlib
import sys
import types
from pathlib import Path


def import_reference_module(ref_dir: Path, prefix: str):
    """``modeling_moss_tts`` of a reference code folder copy, imported as a package named
    ``prefix`` + a hash of the folder, without running its __init__ (which imports the
    processor and torchaudio, not needed here)."""
    name = prefix + hashlib.sha1(str(ref_dir.resolve()).encode()).hexdigest()[:8]
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(ref_dir)]
        sys.modules[name] = pkg
    return importlib.import_module(f"{name}.modeling_moss_tts")


def load_reference_class(ref_dir: Path):
    """The reference model class of a copy of moss_tts_local_v1.5/."""
    return import_reference_module(ref_dir, "_moss_local_reference_").MossTTSLocalModel


def report(ok: bool, lines: list, what: str) -> int:
    """Print the check lines and the verdict line ``parity: PASS|FAIL (what)``; exit code."""
    for line in lines:
        print("  " + line)
    print(f"parity: {'PASS' if ok else 'FAIL'} ({what})")
    return 0 if ok else 1


def flag(good: bool) -> str:
    return "ok" if good else "MISMATCH"
