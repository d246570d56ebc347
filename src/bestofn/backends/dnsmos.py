"""DNSMOS (P.835 sig/bak/ovrl + P.808) with the ONNX models shipped in the ``speechmos`` package.

Our own batched wrapper: every 9.01 s window (1 s hop) of every take in the group goes through
each ONNX model in one call, instead of one session.run per window per take."""

from __future__ import annotations

import os

import numpy as np

from bestofn.backends.base import Scorer
from bestofn.spec import GroupSpec

SR = 16000
WINDOW = int(9.01 * SR)
# Polynomials mapping raw P.835 outputs to MOS, published with DNSMOS (non-personalised).
_POLY_SIG = np.poly1d([-0.08397278, 1.22083953, 0.0052439])
_POLY_BAK = np.poly1d([-0.13166888, 1.60915514, -0.39604546])
_POLY_OVR = np.poly1d([-0.06766283, 1.11546468, 0.04602535])


def windows(audio: np.ndarray) -> np.ndarray:
    """DNSMOS windows of one take: loop short audio to one window, then 1 s hops."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.size == 0:
        audio = np.zeros(1, dtype=np.float32)
    while audio.size < WINDOW:
        audio = np.concatenate([audio, audio])
    n = int(np.floor(audio.size / SR) - 9.01) + 1
    n = max(n, 1)
    return np.stack([audio[i * SR : i * SR + WINDOW] for i in range(n)])


class DNSMOSScorer(Scorer):
    name = "dnsmos"
    columns = {
        "dnsmos_sig": "DOUBLE",
        "dnsmos_bak": "DOUBLE",
        "dnsmos_ovrl": "DOUBLE",
        "dnsmos_p808": "DOUBLE",
    }
    input_sample_rate = SR

    def __init__(self, device: str = "cpu", model_dir: str | None = None, threads: int = 0):
        import onnxruntime as ort

        if model_dir is None:
            import speechmos

            model_dir = os.path.join(os.path.dirname(speechmos.__file__), "dnsmos_models")
        self.model_dir = model_dir
        paths = [os.path.join(model_dir, f) for f in ("sig_bak_ovr.onnx", "model_v8.onnx")]
        for p in paths:
            if not os.path.isfile(p):
                raise FileNotFoundError(
                    f"dnsmos: model_dir {model_dir} lacks {os.path.basename(p)}"
                )
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        self.p835 = ort.InferenceSession(paths[0], opts, providers=["CPUExecutionProvider"])
        self.p808 = ort.InferenceSession(paths[1], opts, providers=["CPUExecutionProvider"])

    @staticmethod
    def _mel(window: np.ndarray) -> np.ndarray:
        import librosa

        mel = librosa.feature.melspectrogram(
            y=window[:-160], sr=SR, n_fft=321, hop_length=160, n_mels=120
        )
        return ((librosa.power_to_db(mel, ref=np.max) + 40) / 40).T

    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec):
        per_take = [windows(np.clip(a, -1, 1)) for a in audios]
        batch = np.concatenate(per_take)
        raw = self.p835.run(None, {"input_1": batch})[0]
        mels = np.stack([self._mel(w) for w in batch]).astype(np.float32)
        p808 = self.p808.run(None, {"input_1": mels})[0][:, 0]
        sig, bak, ovr = _POLY_SIG(raw[:, 0]), _POLY_BAK(raw[:, 1]), _POLY_OVR(raw[:, 2])
        out = {c: [] for c in self.columns}
        start = 0
        for w in per_take:
            sl = slice(start, start + len(w))
            start += len(w)
            out["dnsmos_sig"].append(float(sig[sl].mean()))
            out["dnsmos_bak"].append(float(bak[sl].mean()))
            out["dnsmos_ovrl"].append(float(ovr[sl].mean()))
            out["dnsmos_p808"].append(float(p808[sl].mean()))
        return out

    def provenance(self) -> dict:
        return {"backend": self.name, "model_dir": self.model_dir, "models": "speechmos DNSMOS"}
