"""MOSS-TTS-Local-Transformer-v1.5 through its published inference path (``moss-hf``).

The processor and model come from a local checkpoint directory with ``trust_remote_code``
(the code OpenMOSS ships next to the weights), as the model card loads them; the codec
(MOSS-Audio-Tokenizer-v2, 48 kHz stereo, 12 codebooks at 12.5 frames/s) comes from its own
directory through our implementation (``bestofn.moss.codec.load.load_codec``, the one moss-fast
uses; parity-checked against the published v2 code), so the processor is built without one.
This backend is the reference for generation: slower than ``moss-fast``, the authors' code.

What this module adds around the published code, and why:

- N takes of one prompt run as one ``generate`` batch (``batch_size`` rows at a time): the
  prompt is built once and repeated, so every row has the same length and no padding.
- Per-take seeds. The published ``generate`` draws every token of the batch from torch's
  global RNG, so a take would depend on its batch neighbours. We replace only the model's
  draw (``_sample_next_token``, by ``bestofn.moss.published_draws.LocalDraws``): penalty and
  filtering stay the reference's, and the random number of take i at frame f, step s is
  ``take_uniform(seed_i, f * 64 + s)`` from ``bestofn.moss.sampling`` -- the same numbers
  ``moss-fast`` draws, so both engines give a take the same randomness. Take i is
  reproducible from its seed whatever the batch size (up to floating-point differences
  between batch shapes on the GPU).
- Frame budget = words x frames_per_word with a floor and a ceiling (``bestofn.moss.budget``),
  passed as ``max_new_tokens``; a take cut by the budget is flagged ``truncated`` in its meta.
- The reference voice is encoded once per worker and reused as codes (keyed by path, size and
  mtime), instead of re-encoding the wav for every group.
- The codec decodes all takes of a batch in one call (``decode_batch_size`` at a time), bf16
  on the GPU by default, and encodes the reference voice (as the processor prepares it).
- A LoRA adapter (peft directory, option ``lora``) is merged into the weights once and the
  merged checkpoint cached on disk (``bestofn.moss.lora``).
- The processor module imports ``torchaudio`` but this backend only hands it 48 kHz tensors
  and codes. Where torchaudio is not installed (no build matches every torch), the import is
  satisfied while the remote code loads by a small shim that implements the two functions
  the processor could call (``load`` with soundfile, ``functional.resample`` with soxr).

What the Local and Delay paths share (options, checks, prompt, takes, provenance) is in
``bestofn.backends.moss_hf_common``; a Delay checkpoint is handed to
``bestofn.backends.moss_hf_delay``.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np

from bestofn.backends.moss_hf_common import (  # noqa: F401  (DEFAULTS: the backend's options)
    DEFAULTS,
    SAMPLING_KEYS,
    MossHFBase,
    _torchaudio_importable,
    check_checkpoint,
)
from bestofn.moss.published_draws import LocalDraws
from bestofn.util.spec import GroupSpec

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {"moss-hf": {"role": "generator", "class": "MossHFGenerator"}}


def _processor_class(model_dir: Path) -> str:
    """The processor's ``module.Class`` from processor_config.json's auto_map."""
    path = Path(model_dir) / "processor_config.json"
    auto_map = json.loads(path.read_text()).get("auto_map") or {} if path.is_file() else {}
    ref = auto_map.get("AutoProcessor") or "processing_moss_tts.MossTTSLocalProcessor"
    return (ref if isinstance(ref, str) else ref[0]).split("--")[-1]


@contextlib.contextmanager
def _per_take_draws(model, seeds, n_vq, device):
    if not hasattr(model, "_sample_next_token") or not hasattr(model, "_apply_repetition_penalty"):
        raise RuntimeError(
            "moss-hf: the checkpoint's remote code has no _sample_next_token/"
            "_apply_repetition_penalty; per-take seeds cannot be applied to this version"
        )
    draws = LocalDraws(model, seeds, n_vq, device)
    model._sample_next_token = draws  # instance attribute shadows the method
    try:
        yield draws
    finally:
        del model._sample_next_token


class MossHFGenerator(MossHFBase):
    def __new__(cls, device: str = "cpu", **options):
        # A MOSS-TTS Delay checkpoint (config.json model_type moss_tts_delay) runs through
        # its own published code path (bestofn.backends.moss_hf_delay).
        if cls is MossHFGenerator and options.get("model_dir"):
            from bestofn.moss.delay import is_delay_checkpoint

            if is_delay_checkpoint(Path(options["model_dir"]).expanduser()):
                from bestofn.backends.moss_hf_delay import MossHFDelayGenerator

                return MossHFDelayGenerator(device, **options)  # not ours: no __init__ here
        return super().__new__(cls)

    def __init__(self, device: str = "cpu", **options):
        self._configure(device, options)
        self._codec_files = check_checkpoint(
            self.options["codec_dir"], "codec_dir", tokenizer=False
        )
        self.codec_dir = Path(self.options["codec_dir"]).expanduser()
        self._weights_dir()
        self._load()
        self._ref_codes: dict[tuple, object] = {}  # reference voice -> codes, per worker

    # ---- loading ---------------------------------------------------------------------------

    def _load(self):
        import torch
        from transformers import AutoConfig, AutoModel, AutoTokenizer
        from transformers.dynamic_module_utils import get_class_from_dynamic_module
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # per-tensor bars flood worker logs
        dtype, attn = self._resolve_dtype_and_attn()
        if torch.device(self.device).type == "cuda":
            # The model card disables cuDNN SDPA (broken on some CUDA/PyTorch combinations).
            torch.backends.cuda.enable_cudnn_sdp(False)
        # The remote model reads its attention choice from its own config fields.
        config = AutoConfig.from_pretrained(
            str(self.load_dir), trust_remote_code=True, local_files_only=True
        )
        with _torchaudio_importable():  # the processor's class, built without its codec
            cls = get_class_from_dynamic_module(_processor_class(self.load_dir), str(self.load_dir))
        tokenizer = AutoTokenizer.from_pretrained(str(self.load_dir), local_files_only=True)
        self.processor = cls(tokenizer=tokenizer, audio_tokenizer=None, model_config=config)
        config.attn_implementation = attn
        config.local_transformer_attn_implementation = attn
        self.model = AutoModel.from_pretrained(
            str(self.load_dir),
            config=config,
            trust_remote_code=True,
            local_files_only=True,
            dtype=dtype,
        )
        self.model.to(self.device).eval()
        self.config = self.model.config
        self.n_vq = int(self.config.n_vq)
        self.audio_pad = int(self.config.audio_pad_token_id)
        self._load_codec(dtype, attn)

    def _encode_reference(self, audio: np.ndarray, sr: int):
        """Codes [T, n_vq] of a reference clip (frames[, channels]) via our codec, prepared as
        the processor's ``encode_audios_from_wav`` prepares it (mono on both channels,
        -20 dBFS within +-3 dB)."""
        return self.codec.encode(audio, sr)

    # ---- generation ------------------------------------------------------------------------

    def generate_codes(self, spec: GroupSpec, seeds: list[int] | None = None):
        """Codes of every take: (list of [T_i, n_vq] long tensors, truncated flags, budget)."""
        import torch

        seeds = spec.seeds() if seeds is None else list(seeds)
        budget = self.budget.frames(spec.text)
        input_ids, attention_mask = self.prompt(spec)
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        sampling = {k: self.options[k] for k in SAMPLING_KEYS}
        codes, truncated = [], []
        step = max(1, int(self.options["batch_size"]))
        for start in range(0, len(seeds), step):
            chunk = seeds[start : start + step]
            n = len(chunk)
            with torch.inference_mode(), _per_take_draws(self.model, chunk, self.n_vq, self.device):
                outputs = self.model.generate(
                    input_ids=input_ids.expand(n, -1, -1),
                    attention_mask=attention_mask.expand(n, -1),
                    max_new_tokens=budget,
                    **sampling,
                )
            for _, rows in outputs:
                generated = rows[1:, 1:]  # rows after audio_start; audio channels only
                frames = generated[(generated != self.audio_pad).any(dim=1)]
                codes.append(frames.to(torch.long))
                # A take that stopped leaves a pad row behind; one cut by the budget does not.
                truncated.append(generated.shape[0] >= budget and frames.shape[0] >= budget)
        return codes, truncated, budget

    def decode(self, codes: list) -> list[np.ndarray]:
        """Codes -> float32 audio (frames, 2) (or (frames,) if mono), batched through our codec
        (``decode_batch_size`` takes per call, each trimmed to its own frames)."""
        audios = self.codec.decode(codes)
        if self.options["mono"]:
            audios = [a.mean(axis=1) if a.ndim == 2 else a for a in audios]
        return [np.ascontiguousarray(a, dtype=np.float32) for a in audios]
