"""Speaker similarity with resemblyzer's GE2E encoder (weights ship in the package).

``speaker_sim``: cosine between the take and the group's reference voice. Without a reference,
the take is compared with the centroid of its group (a consistency score), and
``speaker_ref`` says which was used."""

from __future__ import annotations

import contextlib
import os
import warnings

import numpy as np

from bestofn.backends.base import Scorer
from bestofn.util.audio import load_audio
from bestofn.util.spec import GroupSpec

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {"resemblyzer": {"role": "scorer", "class": "ResemblyzerScorer"}}


@contextlib.contextmanager
def _torch_threads(n: int):
    """torch's intra-op thread count set to ``n`` (0: left alone) for the block, then restored."""
    import torch

    before = torch.get_num_threads()
    if n and n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n and n != before:
            torch.set_num_threads(before)


class ResemblyzerScorer(Scorer):
    name = "resemblyzer"
    table_weights = "GE2E encoder in the `resemblyzer` package"
    table_options = (
        "runtime `threads` (torch threads while embedding, default 1); columns `speaker_sim`, "
        "`speaker_ref` (`reference` or `group_centroid` when the group has no reference "
        "voice)"
    )
    columns = {"speaker_sim": "DOUBLE", "speaker_ref": "VARCHAR"}
    reference_columns = frozenset({"speaker_sim"})
    better = {"speaker_sim": "higher"}
    input_sample_rate = 16000

    def __init__(self, device: str = "cpu", threads: int = 1):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pkg_resources deprecation from webrtcvad
            from resemblyzer import VoiceEncoder, preprocess_wav
        self._preprocess = preprocess_wav
        self.encoder = VoiceEncoder("cuda" if device.startswith("cuda") else "cpu", verbose=False)
        self._reference_cache: dict[tuple[str, float], np.ndarray] = {}
        # GE2E is a 3-layer LSTM of 256 units: steps too small to split over cores. With torch's
        # default of one thread per core each step waits for the other core; on a busy 2-core
        # machine 8 takes took 0.93 s with 2 threads and 0.35 s with 1, with identical output.
        self.threads = int(threads)

    def embed(self, audio16k: np.ndarray) -> np.ndarray:
        wav = self._preprocess(audio16k, source_sr=16000)
        if wav.size < 1600:  # VAD removed (almost) everything: embed the raw take instead
            wav = audio16k
        with _torch_threads(self.threads):
            return self.encoder.embed_utterance(wav)

    def reference(self, path: str) -> np.ndarray:
        # Reference voices are encoded once per process, keyed by path and mtime.
        key = (path, os.path.getmtime(path))
        if key not in self._reference_cache:
            audio, _ = load_audio(path, sample_rate=16000)
            self._reference_cache[key] = self.embed(audio)
        return self._reference_cache[key]

    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec):
        embeddings = np.stack([self.embed(a) for a in audios])
        if spec.reference_audio:
            target, label = self.reference(spec.reference_audio), "reference"
        else:
            target, label = embeddings.mean(axis=0), "group_centroid"
        target = target / (np.linalg.norm(target) + 1e-9)
        norms = np.linalg.norm(embeddings, axis=1) + 1e-9
        sims = embeddings @ target / norms
        return {"speaker_sim": sims.astype(float).tolist(), "speaker_ref": [label] * len(audios)}

    def provenance(self) -> dict:
        return {"backend": self.name, "model": "resemblyzer GE2E pretrained.pt (package)"}
