"""DNSMOS (P.835 sig/bak/ovrl + P.808) with the ONNX models shipped in the ``speechmos`` package.

The windows and the arithmetic are those of speechmos' reference (``speechmos.dnsmos.run``): a
take shorter than 9.01 s is doubled until it is at least that long, cut into 9.01 s windows at
1 s hops (skipping the hops the reference skips, see :func:`window_starts`), and each score is
the mean over the take's windows. Two things keep it cheap:

- **Bounded memory.** At most ``batch_windows`` windows (and at most ``TILE`` spectrogram rows)
  go through ONNX Runtime per call, and the four sessions share one arena. An arena keeps its
  largest allocation for the life of the process, and one P.835 window needs about 130 MB of
  activations: a whole group in one call (every window of 8 takes) held 14.6 GB in the CPU
  demo's worker.
- **No convolution twice over the same frame.** 97% of P.835's work is four 3x3 convolutions
  over the full-resolution log-power spectrogram (900 frames x 161 bins per window). Window k of
  a take is frames 100k..100k+899 of the take's spectrogram (a 1 s hop is 100 hops of 160
  samples), so those convolutions run once over the take's spectrogram (in row tiles with a
  4-row halo, the four layers' reach) and each window takes its rows from there. Only a
  window's 4 edge rows at either end, where its own zero padding differs from its neighbour
  frames, are recomputed from an 8-row slab. The rest of the network (three pools, three small
  convolutions, the dense head) runs per window. A 3 s take (3 windows over 11 s of looped
  audio) costs 11/27 of the convolutions it did.

The spectrogram frames are computed at other positions inside ONNX Runtime's kernels than in
the per-window model, and ONNX Runtime's sums depend on its thread count, so results can differ
from speechmos' by float rounding (measured: at most 3e-7 on the MOS scale over the CPU demo's
96 takes); ``share_frames=False`` runs the unmodified model per window instead.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bestofn.backends.base import Scorer
from bestofn.util.spec import GroupSpec

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {"dnsmos": {"role": "scorer", "class": "DNSMOSScorer"}}

SR = 16000
WINDOW = int(9.01 * SR)
HOP_FRAMES = 100  # frames (of 160 samples) per 1 s window hop
FRAMES = 900  # spectrogram frames per window
BINS = 161
HALO = 4  # rows of the spectrogram the four full-resolution 3x3 convolutions reach
TILE = 300  # spectrogram rows per call of those convolutions (~25 MB per 128-channel layer)
# Tensor names of the split points in speechmos' sig_bak_ovr.onnx.
_SPEC_OUT = "adjusted_input6"  # log-power spectrogram, NCHW (N, 1, 900, 161)
_STEM_OUT = "mos_estimator_logpow/conv2d_3/Relu:0"  # (N, 32, H, 161), before the first pool
_HEAD_OUT = "Identity:0"  # raw (sig, bak, ovr)
# Polynomials mapping raw P.835 outputs to MOS, published with DNSMOS (non-personalised).
_POLY_SIG = np.poly1d([-0.08397278, 1.22083953, 0.0052439])
_POLY_BAK = np.poly1d([-0.13166888, 1.60915514, -0.39604546])
_POLY_OVR = np.poly1d([-0.06766283, 1.11546468, 0.04602535])


def looped(audio: np.ndarray) -> np.ndarray:
    """The take as DNSMOS sees it: doubled until it is at least one window long."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.size == 0:
        audio = np.zeros(1, dtype=np.float32)
    while audio.size < WINDOW:
        audio = np.concatenate([audio, audio])
    return audio


def window_starts(n_samples: int) -> list[int]:
    """Start (in seconds) of each window of a looped take, as the reference picks them.

    The reference cuts window i as ``audio[int(i * 16000) : int((i + 9.01) * 16000)]`` and skips
    it when that is shorter than a window: for i = 7..23, ``(i + 9.01) * 16000`` rounds just
    below its integer value, so those windows are one sample short and never scored. Published
    DNSMOS figures come from that code, so the same windows are scored here.
    """
    hops = max(int(np.floor(n_samples / SR) - 9.01) + 1, 1)
    return [i for i in range(hops) if int((i + 9.01) * SR) - int(i * SR) >= WINDOW]


def windows(audio: np.ndarray) -> np.ndarray:
    """DNSMOS windows of one take: loop short audio to one window, then 1 s hops."""
    audio = looped(audio)
    return np.stack([audio[i * SR : i * SR + WINDOW] for i in window_starts(audio.size)])


_ARENA = []


def _register_shared_arena(ort) -> None:
    """Register, once per process, the CPU arena that sessions with
    ``session.use_env_allocators`` share."""
    if _ARENA:
        return
    info = ort.OrtMemoryInfo(
        "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
    )
    # (max memory: no limit, extend strategy: next power of two, defaults for the rest)
    ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, 0, -1, -1))
    _ARENA.append(info)


def _subgraph(model, start: str, end: str, in_shape: list, out_shape: list) -> bytes:
    """The nodes of ``model`` that compute ``end`` from ``start``, as a model of its own."""
    from onnx import TensorProto, helper

    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    if end not in producer or (start not in producer and start != graph.input[0].name):
        raise ValueError(f"tensor {start!r} or {end!r} not in the graph")
    needed, stack = set(), [end]
    while stack:
        name = stack.pop()
        node = producer.get(name)
        if name == start or node is None or id(node) in needed:
            continue
        needed.add(id(node))
        stack.extend(node.input)
    nodes = [n for n in graph.node if id(n) in needed]
    used = {i for n in nodes for i in n.input}
    sub = helper.make_graph(
        nodes,
        f"dnsmos_{end}",
        [helper.make_tensor_value_info(start, TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info(end, TensorProto.FLOAT, out_shape)],
        [t for t in graph.initializer if t.name in used],
    )
    out = helper.make_model(sub, opset_imports=model.opset_import)
    out.ir_version = model.ir_version
    return out.SerializeToString()


class DNSMOSScorer(Scorer):
    name = "dnsmos"
    table_weights = "DNSMOS ONNX models in the `speechmos` package"
    table_options = "runtime `threads`, `batch_windows`, `share_frames` (below)"
    columns = {
        "dnsmos_sig": "DOUBLE",
        "dnsmos_bak": "DOUBLE",
        "dnsmos_ovrl": "DOUBLE",
        "dnsmos_p808": "DOUBLE",
    }
    better = dict.fromkeys(columns, "higher")
    input_sample_rate = SR

    def __init__(
        self,
        device: str = "cpu",
        model_dir: str | None = None,
        threads: int = 0,  # takes scored at once, one ONNX Runtime thread each; 0: the CPUs
        batch_windows: int = 1,  # windows per ONNX Runtime call: bounds the arena
        share_frames: bool = True,  # one convolution pass per take, not per window
    ):
        import onnx
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
        self.batch_windows = int(batch_windows)
        if self.batch_windows <= 0:
            raise ValueError(f"dnsmos: batch_windows must be positive, got {batch_windows}")
        # One take per core: single-threaded convolutions side by side use the cores better
        # than one take split over them, and the numpy/librosa parts overlap too.
        self.threads = int(threads) or len(os.sched_getaffinity(0))
        self._pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        # Every DNSMOS session shares one arena, which keeps the peak of the largest call once.
        _register_shared_arena(ort)
        opts.add_session_config_entry("session.use_env_allocators", "1")

        def session(model):
            return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])

        self.p808 = session(paths[1])
        self.share_frames = bool(share_frames)
        if not self.share_frames:
            self.p835 = session(paths[0])
            return
        model = onnx.load(paths[0])
        try:
            self.spec = session(_subgraph(model, "input_1", _SPEC_OUT, ["N", WINDOW], None))
            stem = _subgraph(model, _SPEC_OUT, _STEM_OUT, ["N", 1, "H", BINS], None)
            head = _subgraph(model, _STEM_OUT, _HEAD_OUT, ["N", 32, FRAMES, BINS], None)
        except ValueError as e:
            raise ValueError(
                f"dnsmos: {paths[0]} is not the DNSMOS P.835 graph this backend splits ({e}); "
                "set share_frames: false to run it whole"
            ) from None
        self.stem, self.head = session(stem), session(head)

    @staticmethod
    def _mel(window: np.ndarray) -> np.ndarray:
        import librosa

        mel = librosa.feature.melspectrogram(
            y=window[:-160], sr=SR, n_fft=321, hop_length=160, n_mels=120
        )
        return ((librosa.power_to_db(mel, ref=np.max) + 40) / 40).T

    def _chunks(self, n: int):
        for start in range(0, n, self.batch_windows):
            yield slice(start, min(start + self.batch_windows, n))

    def _p808(self, wins: np.ndarray) -> np.ndarray:
        out = []
        for sl in self._chunks(len(wins)):
            mels = np.stack([self._mel(w) for w in wins[sl]]).astype(np.float32)
            out.append(self.p808.run(None, {"input_1": mels})[0][:, 0])
        return np.concatenate(out)

    def _p835_whole(self, wins: np.ndarray) -> np.ndarray:
        return np.concatenate(
            [self.p835.run(None, {"input_1": wins[sl]})[0] for sl in self._chunks(len(wins))]
        )

    def _p835_shared(self, audio: np.ndarray, starts: list[int]) -> np.ndarray:
        """Raw P.835 outputs of the windows starting at ``starts`` (seconds) of one looped
        take, convolving each spectrogram frame once (see the module docstring)."""
        frames = HOP_FRAMES * starts[-1] + FRAMES
        # The take's spectrogram through the model's own first layers, 900 frames per input.
        parts = -(-frames // FRAMES)
        buf = np.zeros(FRAMES * 160 * parts + 160, np.float32)
        buf[: min(audio.size, buf.size)] = audio[: buf.size]
        inputs = np.stack([buf[i * FRAMES * 160 : i * FRAMES * 160 + WINDOW] for i in range(parts)])
        spec = np.concatenate(
            [self.spec.run(None, {"input_1": inputs[sl]})[0] for sl in self._chunks(parts)]
        ).reshape(-1, BINS)[:frames]
        # The four full-resolution convolutions over the whole spectrogram, in equal row tiles
        # of at most one window's height with a HALO-row margin on each side (zeros beyond the
        # ends: the rows they touch are edge rows, recomputed below).
        padded = np.zeros((frames + 2 * HALO, BINS), np.float32)
        padded[HALO:-HALO] = spec
        stem = np.empty((32, frames, BINS), np.float32)
        bounds = np.linspace(0, frames, -(-frames // TILE) + 1).astype(int)
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            tile = padded[a : b + 2 * HALO][None, None]
            stem[:, a:b] = self.stem.run(None, {_SPEC_OUT: tile})[0][0][:, HALO:-HALO]
        # Each window's first and last HALO rows see the window's own zero padding.
        slabs = np.stack(
            [
                spec[k * HOP_FRAMES + off : k * HOP_FRAMES + off + 2 * HALO]
                for k in starts
                for off in (0, FRAMES - 2 * HALO)
            ]
        )[:, None]
        edges = np.concatenate(
            [self.stem.run(None, {_SPEC_OUT: slabs[sl]})[0] for sl in self._chunks(len(slabs))]
        )
        raw = []
        for sl in self._chunks(len(starts)):
            feats = np.stack(
                [stem[:, k * HOP_FRAMES : k * HOP_FRAMES + FRAMES] for k in starts[sl]]
            )
            for i, j in enumerate(range(sl.start, sl.stop)):
                feats[i, :, :HALO] = edges[2 * j, :, :HALO]
                feats[i, :, FRAMES - HALO :] = edges[2 * j + 1, :, HALO:]
            raw.append(self.head.run(None, {_STEM_OUT: feats})[0])
        return np.concatenate(raw)

    def score_take(self, audio: np.ndarray) -> dict[str, float]:
        x = looped(np.clip(audio, -1, 1))
        starts = window_starts(x.size)
        wins = np.stack([x[i * SR : i * SR + WINDOW] for i in starts])
        raw = self._p835_shared(x, starts) if self.share_frames else self._p835_whole(wins)
        p808 = self._p808(wins)
        return {
            "dnsmos_sig": float(_POLY_SIG(raw[:, 0]).mean()),
            "dnsmos_bak": float(_POLY_BAK(raw[:, 1]).mean()),
            "dnsmos_ovrl": float(_POLY_OVR(raw[:, 2]).mean()),
            "dnsmos_p808": float(p808.mean()),
        }

    def score(self, audios: list[np.ndarray], sample_rate: int, spec: GroupSpec):
        if self._pool is None:
            per_take = [self.score_take(a) for a in audios]
        else:  # onnxruntime releases the GIL; sessions take concurrent calls
            per_take = list(self._pool.map(self.score_take, audios))
        return {c: [t[c] for t in per_take] for c in self.columns}

    def provenance(self) -> dict:
        return {
            "backend": self.name,
            "model_dir": self.model_dir,
            "models": "speechmos DNSMOS",
            "share_frames": self.share_frames,
        }
