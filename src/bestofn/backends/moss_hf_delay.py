"""MOSS-TTS v1.5 Delay (8B) through its published code (``moss-hf`` on a Delay checkpoint).

``MossHFGenerator`` hands a checkpoint whose config.json says ``model_type: moss_tts_delay``
to this class (both derive from ``bestofn.backends.moss_hf_common.MossHFBase``). The model,
its prompt processor and its ``generate`` are the published ones, loaded from the checkpoint
directory with ``trust_remote_code`` (moss_tts_delay/: modeling, configuration, processing,
inference_utils). What is ours around them:

- per-take seeds: the published ``generate`` draws with torch's global RNG through the
  module function ``sample_token``; for the call it is replaced by
  ``bestofn.moss.published_draws.DelayDraws`` (the same per-take uniforms as moss-fast's
  Delay engine; the published penalty function still applies a penalty other than 1.0);
- frame budget: ``max_new_tokens`` = budget + n_vq + 1 rows (audio_start, frames, the delay
  tail, audio_end); a take is its first audio block, de-delayed with the processor's
  ``apply_de_delay_pattern``, complete frames only; no audio_end in time = truncated;
- the codec: ``bestofn.moss.codec.load.load_codec(codec_dir)`` (MOSS-Audio-Tokenizer, 24 kHz,
  32 quantizers), not the processor's, so the remote codec code is not needed.
The prompt goes through the published processor (chat template, text normalizer, delayed
reference codes), built without its codec (``audio_tokenizer=None``).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np

from bestofn.backends.moss_hf_common import (
    SAMPLING_KEYS,
    MossHFBase,
    _torchaudio_importable,
)
from bestofn.moss.delay import DELAY_TEXT_TEMPERATURE
from bestofn.moss.published_draws import DelayDraws
from bestofn.util.spec import GroupSpec


class MossHFDelayGenerator(MossHFBase):
    def __init__(self, device: str = "cpu", **options):
        self._configure(device, options, text_temperature=DELAY_TEXT_TEMPERATURE)
        o = self.options
        if not o["codec_dir"] or not (Path(o["codec_dir"]).expanduser() / "config.json").is_file():
            raise FileNotFoundError(
                f"moss-hf: {o['codec_dir']}/config.json not found (config field: codec_dir)"
            )
        self.codec_dir = Path(o["codec_dir"]).expanduser()
        self._weights_dir()
        self._load()
        self._ref_codes: dict[tuple, object] = {}

    def _load(self):
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        dtype, attn = self._resolve_dtype_and_attn()
        if torch.device(self.device).type == "cuda":
            torch.backends.cuda.enable_cudnn_sdp(False)
        with _torchaudio_importable():
            self.model = AutoModel.from_pretrained(
                str(self.load_dir), trust_remote_code=True, local_files_only=True, dtype=dtype,
                attn_implementation=attn,
            )  # fmt: skip
        self.model.to(self.device).eval()
        self.module = sys.modules[type(self.model).__module__]
        Processor = getattr(self.model, "Processor", None)
        if Processor is None:
            raise RuntimeError(
                f"moss-hf: {self.load_dir}/processing_moss_tts.py did not import (the published "
                "Delay processor is needed for the prompt)"
            )
        tokenizer = AutoTokenizer.from_pretrained(str(self.load_dir), local_files_only=True)
        self.processor = Processor(tokenizer=tokenizer, audio_tokenizer=None,
                                   model_config=self.model.config)  # fmt: skip
        package = self.module.__name__.rsplit(".", 1)[0]
        utils = sys.modules[f"{package}.inference_utils"]
        self.penalty = utils.apply_repetition_penalty_delay_pattern
        self.config = self.model.config
        self.n_vq = int(self.config.n_vq)
        self.audio_pad = int(self.config.audio_pad_code)
        self._load_codec(dtype, attn)

    # reference_codes (cached per file) and prompt (the processor's user message): inherited

    def _encode_reference(self, audio, sr: int):
        return self.codec.encode(audio, sr)  # our codec: the processor is built without one

    @contextlib.contextmanager
    def _draws(self, seeds):
        original = self.module.sample_token
        self.module.sample_token = DelayDraws(seeds, penalty=self.penalty)
        try:
            yield
        finally:
            self.module.sample_token = original

    def generate_codes(self, spec: GroupSpec, seeds: list[int] | None = None):
        import torch

        seeds = spec.seeds() if seeds is None else list(seeds)
        budget = self.budget.frames(spec.text)
        input_ids, attention_mask = self.prompt(spec)
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        sampling = {k: self.options[k] for k in SAMPLING_KEYS if k != "do_sample"}
        if not self.options["do_sample"]:
            sampling.update(text_temperature=0.0, audio_temperature=0.0)
        c = self.config
        codes, truncated = [], []
        step = max(1, int(self.options["batch_size"]))
        for start in range(0, len(seeds), step):
            chunk = seeds[start : start + step]
            n = len(chunk)
            with torch.inference_mode(), self._draws(chunk):
                outputs = self.model.generate(
                    input_ids=input_ids.expand(n, -1, -1),
                    attention_mask=attention_mask.expand(n, -1),
                    max_new_tokens=budget + self.n_vq + 1,
                    **sampling,
                )
            for kept, rows in outputs:
                rows = rows[int(kept) :].cpu()  # the generated rows
                hit = (rows[:, 0] == c.audio_start_token_id).nonzero()
                begin = int(hit[0]) + 1 if len(hit) else rows.shape[0]
                end_hit = (rows[begin:, 0] == c.audio_end_token_id).nonzero()
                end = begin + int(end_hit[0]) if len(end_hit) else rows.shape[0]
                seg = rows[begin:end, 1:]
                frames = (
                    self.processor.apply_de_delay_pattern(seg)
                    if seg.shape[0] >= self.n_vq
                    else seg[:0]
                )
                full = (frames != self.audio_pad).all(dim=1).long().cumprod(0).sum()
                codes.append(frames[: int(full)].to(torch.long))
                truncated.append(not len(end_hit))
        return codes, truncated, budget

    def decode(self, codes: list) -> list[np.ndarray]:
        audios = self.codec.decode(codes)
        if self.options["mono"]:
            audios = [a.mean(axis=1) if a.ndim == 2 else a for a in audios]
        return [np.asarray(a, dtype=np.float32) for a in audios]
