"""Random-weight models for tests, benchmarks and `bestofn fake-weights`; never used at run time.

Every builder and bench helper lives here, one module per backend family, so the
runtime modules under ``bestofn.backends`` and ``bestofn.moss`` hold runtime code only. Each
family module offers the same two entry points:

- ``build(device, size="real"|"tiny", ...)``: the backend with random weights in memory, made
  through the backend's ``from_modules`` classmethod (the one way to inject a model);
- ``write(out_dir, size="real"|"tiny", seed=0)``: random weights on disk in the layout of the
  published checkpoint, returning the backend's config options that point at them.

A module whose ``write`` lays out a backend's published checkpoint declares which backend,
``FAKE_WEIGHTS = "<backend>"``: `bestofn fake-weights` finds it there (weights.py) and writes
it with the others.

Modules:

moss.py         MOSS-TTS-Local v1.5: random state dicts, checkpoint dirs, moss-fast / moss-hf
moss_codec.py   MOSS-Audio-Tokenizer-v2 (48 kHz stereo codec), published layout
sidon.py        w2v-BERT 2.0 + Sidon LoRA adapter + DAC decoder
parakeet.py     a FastConformer-TDT NeMo model (.nemo) with a freshly trained tokenizer
whisper.py      Whisper-Small shapes shared by the two Whisper-based scorers
voiceclap.py    VoiceCLAP: our remote code (remote/voiceclap) in the published layout + heads
empathic.py     BUD-E-Whisper encoder dir + Empathic-Insight head files
speaker.py      a WavLMForXVector folder (microsoft/wavlm-base-plus-sv layout)
weights.py      `bestofn fake-weights DIR`: the MOSS writers, every FAKE_WEIGHTS module, and a
                complete production config

Random weights make noise: every score they give is meaningless. They exist to run the real
loading code and the real shapes, in CI (``size="tiny"``) and on GPUs (``size="real"``).
"""

SIZES = ("tiny", "real")


def check_size(size: str) -> bool:
    """True for ``tiny``; a clear error for anything but ``tiny``/``real``."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    return size == "tiny"
