"""Backends: one adapter per model family, chosen by name in the config (registry.py) or by an
import path ``package.module:Class``. Each adapter carries its facts (rate, weights, columns);
its module declares its name, role and published weights (``BACKENDS``, ``PUBLISHED_WEIGHTS``).

base.py             the three roles: Generator, Restorer, Scorer
registry.py         finds the backends from those declarations, read without importing a module
                    (naming one backend imports no other's libraries)
loading.py          every backend of a config built at once, in threads, with a load report

generators          piper.py (embedded default), moss_fast.py (our engine), moss_hf.py and
                    moss_hf_delay.py (the published MOSS-TTS code, Local and Delay; what they share:
                    moss_hf_common.py)
restorers           resample.py (embedded default: pass-through, soxr), sidon/ (Sidon)
scorers             duration.py, whisper_asr.py (embedded ASR), parakeet.py (production ASR),
                    dnsmos.py, resemblyzer_sim.py, voiceclap.py, empathic.py
"""
