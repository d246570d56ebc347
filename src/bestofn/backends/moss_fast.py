"""MOSS-TTS-Local-Transformer-v1.5 through our own inference engine (``moss-fast``).

Same checkpoint directory as ``moss-hf`` (config.json + *.safetensors + tokenizer.json, read
directly, no remote code), same prompt, same frame budget and the same per-take random numbers
(``bestofn.moss.sampling.take_uniform``), but decoded by ``bestofn.moss.engine``: batched
prefill, static KV caches, one CUDA graph per frame step (torch.compile'd pieces inside), all
sampling on the GPU. ~10x faster than the published generate at batch 64 on an H200 (see
``python -m lab.bench generate``). The codec comes from ``bestofn.moss.codec.load.load_codec``:
MOSS-Audio-Tokenizer-v2 (48 kHz) and MOSS-Audio-Tokenizer (24 kHz) both run on our own
implementation (``bestofn.moss.codec.tokenizer``), batched, bf16 on the GPU by default. With
runtime ``pair_groups`` every call has one pair shape, so two groups can share a call
(``generate_pair``) and a take is the same alone or paired.

MOSS-TTS v1.5 Delay (8B, 32 codebooks, 24 kHz) runs on its own engine
(``bestofn.moss.delay_engine``): chosen when the checkpoint's config.json says
``model_type: moss_tts_delay`` (option ``architecture: auto``), or forced with
``architecture: delay`` / ``local``. Its codec is MOSS-Audio-Tokenizer (24 kHz, 32 quantizers).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import torch

from bestofn.backends.base import Generator, Take
from bestofn.moss.budget import FrameBudget
from bestofn.moss.codec.layers import kernel_path
from bestofn.moss.delay import DELAY_TEXT_TEMPERATURE
from bestofn.moss.local_loop import local_attention_path
from bestofn.moss.model import decode_attention_path
from bestofn.moss.options import (
    COMMON_DEFAULTS,
    check_engine_options,
    engine_defaults,
    group_instruction,
    instruction_option,
)
from bestofn.moss.sampling import SamplingParams
from bestofn.util.dtypes import resolve_dtype
from bestofn.util.spec import GroupSpec

# What this module provides, read from its text by the registry (bestofn.backends.registry)
BACKENDS = {
    "moss-fast": {"role": "generator", "class": "MossFastGenerator", "parallel_build": True}
}
# MOSS-TTS-Local-Transformer-v1.5 and its codec MOSS-Audio-Tokenizer-v2: OpenMOSS/MOSS-TTS
# moss_tts_local_v1.5/README.md (the checkpoint and "Audio tokenizer" rows); MOSS-TTS v1.5 Delay
# (8B) and its 24 kHz codec: HF OpenMOSS-Team/MOSS-TTS-v1.5 (tagged moss_tts_delay),
# OpenMOSS/MOSS-Audio-Tokenizer (v1, 24 kHz); docs/notes/moss-facts.md. moss-hf reads the same.
PUBLISHED_WEIGHTS = (
    {
        "name": "moss-tts-local",
        "repo_id": "OpenMOSS-Team/MOSS-TTS-Local-Transformer-v1.5",
        "revision": "unknown",
        "allow_patterns": ("*.json", "*.safetensors", "*.py", "*.txt", "*.jinja"),
        "folder": "MOSS-TTS-Local-Transformer-v1.5",
        "note": (
            "one bf16 model.safetensors, ~5B parameters counted with tied heads (third-party port)"
        ),
    },
    {
        "name": "moss-audio-tokenizer-v2",
        "repo_id": "OpenMOSS-Team/MOSS-Audio-Tokenizer-v2",
        "revision": "unknown",
        "allow_patterns": ("*.json", "*.safetensors", "*.py"),
        "folder": "MOSS-Audio-Tokenizer-v2",
        "note": "fp32, the published 2.1 B architecture (about 8.5 GB at that size)",
    },
    {
        "name": "moss-tts-delay",
        "repo_id": "OpenMOSS-Team/MOSS-TTS-v1.5",
        "revision": "unknown",
        "allow_patterns": ("*.json", "*.safetensors", "*.py", "*.txt", "*.jinja"),
        "folder": "MOSS-TTS-Delay-v1.5",
        "note": "the 8B Delay generator (Qwen3-8B backbone, 32 codebooks)",
    },
    # LAION's voice-acting fine-tunes, the generators of config/recipes/{emotions,clone}.yaml
    # (Local) and delay.yaml (Delay), in their base's published layout (docs/notes/recipes.md)
    {
        "name": "moss-tts-local-voice-acting",
        "repo_id": "laion/moss-tts-local-transformer-4.55b-voice-acting",
        "revision": "unknown",
        "allow_patterns": ("*.json", "*.safetensors", "*.py", "*.txt", "*.jinja"),
        "folder": "moss-tts-local-transformer-4.55b-voice-acting",
        "note": "alternative generator: moss_tts_local, a merged rank-256 LoRA; codec: the v2 one",
    },
    {
        "name": "moss-tts-delay-voice-acting",
        "repo_id": "laion/moss-tts-v1.5-8b-voice-acting",
        "revision": "unknown",
        "allow_patterns": ("*.json", "*.safetensors", "*.py", "*.txt", "*.jinja"),
        "folder": "moss-tts-v1.5-8b-voice-acting",
        "note": "alternative generator: moss_tts_delay, 32 codebooks; 24 kHz codec",
    },
    {
        "name": "moss-audio-tokenizer",
        "repo_id": "OpenMOSS-Team/MOSS-Audio-Tokenizer",
        "revision": "unknown",
        "allow_patterns": ("*.json", "*.safetensors", "*.py"),
        "folder": "MOSS-Audio-Tokenizer",
        "note": "the 24 kHz codec of MOSS-TTS Delay",
    },
)

DEFAULTS = {
    **COMMON_DEFAULTS,
    "compile": "auto",  # torch.compile the per-token pieces (auto: on cuda)
    "cuda_graphs": "auto",  # capture the frame step (auto: on cuda)
    # "dtype": backbone weights in `dtype`; "int8": its Linear weights int8 weight-only, per
    # output channel, dequantized on the fly (bestofn.moss.int8): ~half their memory, other audio
    "weights": "dtype",
    "architecture": "auto",  # auto (from config.json) | local | delay
    # Delay only: the delay slot (the model's "stop") is banned before this many frames
    "delay_min_frames": 0,
    # the kernel paths (runtime: fused, decode_attention, local_attention, compile_mode,
    # codec_kernels, pair_groups): the config schema's $defs.moss_fast_runtime declares them
    # and their defaults
    **engine_defaults(),
}


# What runs with weights cast to the model dtype: embeddings, attention, linear layers.
CAST_OPS = ("embedding", "attention", "linear")


# Peak GPU memory of the production set (config/recipes/base.yaml: moss-fast at N=64, Sidon,
# Parakeet, VoiceCLAP, Empathic-Insight), measured on one H200: the values of ledger figures
# workflow.run.p4_n4.gpu_memory_used_peak (paired) and
# workflow.gpu_memory_allocated_peak.unpaired_decode16. Keyed by the runtime's pair_groups.
MEASURED_GPU_GIB = {
    True: (
        73.5,
        "peak GPU memory used (nvidia-smi) of the production set with pair_groups, decode "
        "batch 64, queue depth 4 (docs/PERFORMANCE.md, the workflow on one H200)",
    ),
    False: (
        52.4,
        "the allocator's peak reserved memory of the production set with pair_groups false, "
        "decode batch 16 (docs/PERFORMANCE.md, the workflow on one H200); the CUDA context "
        "comes on top",
    ),
}


def _auto(value, on_gpu: bool) -> bool:
    return on_gpu if value in ("auto", None) else bool(value)


class MossFastGenerator(Generator):
    name = "moss-fast"
    paced = True
    feeds_while_decoding = True
    table_weights = "same checkpoints, own inference engines"
    table_options = "`weights`, `architecture`, `delay_min_frames`; runtime: below"
    decode_s = 0.0  # codec decode seconds so far (bestofn ab reports it per clip)
    load_seconds: dict = {}  # set by a build from a checkpoint: where its seconds went

    @classmethod
    def measured_gpu_memory(cls, entry: dict) -> tuple[float, str] | None:
        return MEASURED_GPU_GIB[bool((entry.get("runtime") or {}).get("pair_groups", False))]

    @classmethod
    def known_options(cls) -> frozenset[str]:
        return frozenset(DEFAULTS)

    @classmethod
    def check_options(cls, options: dict) -> None:
        instruction_option(options, cls.name)

    def __init__(self, device: str = "cpu", **options):
        t_start = time.perf_counter()
        self._configure(device, options)
        from bestofn.moss.checkpoint import CheckpointError, load_model, weight_files
        from bestofn.moss.prompt import PromptBuilder

        o = self.options
        if not o["model_dir"]:
            raise ValueError("moss-fast: set model_dir (the checkpoint directory)")
        self.model_dir = self.load_dir = Path(o["model_dir"]).expanduser()
        for need in ("config.json", "tokenizer.json"):
            if not (self.model_dir / need).is_file():
                raise FileNotFoundError(
                    f"moss-fast: {self.model_dir / need} not found (config field: model_dir)"
                )
        try:
            weight_files(self.model_dir)
        except CheckpointError as e:
            raise FileNotFoundError(f"moss-fast: {e} (config field: model_dir)") from None
        if o["lora"]:
            from bestofn.moss.lora import merged_weights_dir

            cache = Path(o["cache_dir"] or "~/.cache/bestofn/moss").expanduser()
            self.load_dir = merged_weights_dir(self.model_dir, Path(o["lora"]), cache)
        # int8: load on the CPU, then quantize weight by weight onto the device (the device
        # never holds the whole backbone in full precision)
        int8 = o["weights"] == "int8"
        parts: dict[str, float] = {}  # load_seconds: where this build's time went
        t0 = time.perf_counter()
        if self._is_delay(self.model_dir):
            from bestofn.moss.delay import load_delay_model
            from bestofn.moss.delay_prompt import DelayPromptBuilder

            if int8:
                raise ValueError("moss-fast: weights: int8 is not implemented for the Delay model")
            model = load_delay_model(self.load_dir, device=device, dtype=self.dtype)
            builder = DelayPromptBuilder
        else:
            where = "cpu" if int8 else device
            model = load_model(self.load_dir, device=where, dtype=self.dtype, timings=parts)
            builder = PromptBuilder
        parts["checkpoint_s"] = time.perf_counter() - t0
        prompt = builder.from_tokenizer_json(self.model_dir / "tokenizer.json", model.config)
        self._attach(model, prompt, parts)
        if self.codec_dir is not None:  # at load, not in the first group
            t0 = time.perf_counter()
            self._codec()
            parts["codec_s"] = time.perf_counter() - t0
        parts["total_s"] = time.perf_counter() - t_start
        self.load_seconds = parts

    def _is_delay(self, model_dir: Path) -> bool:
        from bestofn.moss.delay import is_delay_checkpoint

        arch = self.options["architecture"]
        if arch not in ("auto", "local", "delay"):
            raise ValueError(f"moss-fast: architecture is {arch!r}; known: auto, local, delay")
        return arch == "delay" or (arch == "auto" and is_delay_checkpoint(model_dir))

    @classmethod
    def from_modules(cls, model, prompt_builder, device: str = "cpu", **options):
        """A generator around a model already in memory (``bestofn.fakes.moss``, tests): a
        ``MossLocalModel`` and a ``PromptBuilder``; ``options`` as in config (``model_dir`` is
        not read; ``codec_dir`` is, when takes are decoded)."""
        self = cls.__new__(cls)
        self._configure(device, options)
        self._attach(model, prompt_builder)
        return self

    def _configure(self, device: str, options: dict) -> None:
        unknown = set(options) - set(DEFAULTS)
        if unknown:
            raise TypeError(
                f"moss-fast: unknown options {sorted(unknown)}; known: {sorted(DEFAULTS)}"
            )
        self.options = o = {**DEFAULTS, **options}
        self.decode_s = 0.0
        self._given = set(options)
        self.check_options(o)
        from bestofn.moss.int8 import WEIGHTS

        if o["weights"] not in WEIGHTS:
            raise ValueError(
                f"moss-fast: option weights is {o['weights']!r}; known: {', '.join(WEIGHTS)}"
            )
        check_engine_options(o, self.name)
        self.device = device
        self.budget = FrameBudget.from_options(o)
        on_gpu = torch.device(device).type == "cuda"
        if o.get("stream_decode") == "graphs" and not on_gpu:
            raise ValueError(
                f"moss-fast: runtime.stream_decode is graphs (CUDA graphs) on {device}; "
                "set eager or auto"
            )
        dtype = o["dtype"]
        if dtype == "auto":
            dtype = torch.bfloat16 if on_gpu else torch.float32
        elif isinstance(dtype, str):
            dtype = getattr(torch, {"bf16": "bfloat16", "fp32": "float32"}.get(dtype, dtype))
        # reduced precision only where this device runs the backbone's ops in it; else float32
        dtype = resolve_dtype("moss-fast", device, dtype, CAST_OPS, "cast")
        self.dtype = dtype = getattr(torch, dtype)
        if on_gpu:
            torch.backends.cuda.enable_cudnn_sdp(False)  # as the model card advises
        self.model_dir = self.load_dir = None

    def _attach(self, model, prompt_builder, parts: dict | None = None) -> None:
        parts = {} if parts is None else parts
        o = self.options
        on_gpu = torch.device(self.device).type == "cuda"
        if o["weights"] == "int8":
            from bestofn.moss.int8 import is_quantized, quantize_backbone_

            if not is_quantized(model):
                t0 = time.perf_counter()
                model = quantize_backbone_(model, self.device)
                parts["int8_s"] = time.perf_counter() - t0
        # the kernel paths this backend's options name, on the model (before any cache exists:
        # the cache layout follows ``fused``)
        model.set_paths(o["fused"], o["decode_attention"], o["local_attention"])
        self.model, self.prompt_builder = model, prompt_builder
        self.config = model.config
        from bestofn.moss.delay import MossDelayModel
        from bestofn.moss.engine import MossLocalEngine

        self.is_delay = isinstance(model, MossDelayModel)
        if self.is_delay:
            from bestofn.moss.delay_engine import MossDelayEngine as Engine
        else:
            Engine = MossLocalEngine
        t0 = time.perf_counter()
        self.engine = Engine(
            model,
            use_cuda_graphs=_auto(o["cuda_graphs"], on_gpu),
            compile=_auto(o["compile"], on_gpu),
            compile_mode=o["compile_mode"],
        )
        # torch.compile wraps here; the compiles themselves run at the first generate
        parts["compile_setup_s"] = time.perf_counter() - t0
        if self.is_delay and "text_temperature" not in self._given:
            o["text_temperature"] = DELAY_TEXT_TEMPERATURE
        if self.is_delay:  # the speech service renders Delay takes whole (no streaming yet)
            self.stream_batch = self._render_whole
        self.params = SamplingParams(
            temperature=o["audio_temperature"],
            top_p=o["audio_top_p"],
            top_k=o["audio_top_k"],
            repetition_penalty=o["audio_repetition_penalty"],
            text_temperature=o["text_temperature"],
            text_top_p=o["text_top_p"],
            text_top_k=o["text_top_k"],
            do_sample=o["do_sample"],
        )
        self.codec = None
        self.codec_dir = Path(o["codec_dir"]).expanduser() if o["codec_dir"] else None
        if self.codec_dir is not None and not (self.codec_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"moss-fast: {self.codec_dir / 'config.json'} not found (config field: codec_dir)"
            )
        self.sample_rate = self.config.sampling_rate
        self._ref_codes: dict[tuple, torch.Tensor] = {}
        self._hashes: dict | None = None

    # ---- codec -----------------------------------------------------------------------------

    def _codec(self):
        if self.codec is None:
            if self.codec_dir is None:
                raise ValueError("moss-fast: set codec_dir (MOSS-Audio-Tokenizer-v2 directory)")
            from bestofn.moss.codec.load import load_codec

            self.codec = load_codec(
                self.codec_dir,
                n_vq=self.config.n_vq,
                device=self.device,
                weight_dtype=self.options["codec_weight_dtype"],
                compute_dtype=self.options["codec_compute_dtype"],
                decode_batch_size=self.options["decode_batch_size"],
                kernels=self.options["codec_kernels"],
            )
            self.sample_rate = self.codec.sample_rate
        return self.codec

    def reference_codes(self, path) -> torch.Tensor:
        """Codes [T, n_vq] of a reference voice, encoded once per worker (keyed by file state)."""
        from bestofn.util.audio import load_audio

        path = Path(path)
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._ref_codes:
            codec = self._codec()
            audio, sr = load_audio(path, sample_rate=codec.sample_rate, mono=False)
            audio = audio[: int(self.options["max_reference_s"] * sr)]
            self._ref_codes[key] = codec.encode(audio, sr)
        return self._ref_codes[key]

    # ---- generation ------------------------------------------------------------------------

    def prompt(self, spec: GroupSpec) -> torch.Tensor:
        from bestofn.moss.prompt import language_tag

        refs = [self.reference_codes(spec.reference_audio)] if spec.reference_audio else None
        return self.prompt_builder.rows(
            spec.text,
            language=self.options["language"] or language_tag(spec.language),
            instruction=group_instruction(self.options["instruction"], spec),
            tokens=self.budget.hint(spec.text),
            references=refs,
        )

    def generate_codes(self, spec: GroupSpec, seeds: list[int] | None = None):
        """(codes per take [T_i, n_vq], stopped flags, frame budget)."""
        if self.options["pair_groups"]:
            return self.generate_codes_paired([spec], [seeds])[0]
        seeds = spec.seeds() if seeds is None else list(seeds)
        rows = self.prompt(spec)
        budget, limit = self._limits(spec)
        codes, stopped = [], []
        step = max(1, int(self.options["batch_size"]))
        for start in range(0, len(seeds), step):
            chunk = seeds[start : start + step]
            ids = rows.unsqueeze(0).expand(len(chunk), -1, -1)  # same prompt: no padding
            out = self.engine.generate(ids, None, chunk, limit, self.params)
            codes += out.codes
            stopped += out.stopped
        return codes, stopped, budget

    def _limits(self, spec: GroupSpec):
        """(frame budget, the engine's limit: the budget, or Delay's ``DelayBudget``)."""
        budget = self.budget.frames(spec.text)
        if not self.is_delay:
            return budget, budget
        from bestofn.moss.delay_engine import DelayBudget

        # complete frames only; the tail is forced at the budget
        low = min(int(self.options["delay_min_frames"]), budget)
        return budget, DelayBudget(max_frames=budget, min_frames=low)

    # ---- pairs (runtime option pair_groups) -------------------------------------------------

    @property
    def pairs_groups(self) -> bool:
        """The runner may hand this generator two groups at once (``generate_pair``)."""
        return bool(self.options["pair_groups"])

    def _half(self, n_takes: int) -> int:
        """Rows of one half of a pair call: the group's takes, at most ``batch_size``."""
        return max(1, min(int(n_takes), int(self.options["batch_size"])))

    def pair_key(self, spec: GroupSpec):
        """Groups with equal keys may share a generate call (``generate_pair``), with the same
        takes as alone: the half size and the prompt bucket (the sampling settings are this
        generator's, the same for every group). None: this group runs alone (pairing off, or
        more takes than one half: its own chunks pair with each other)."""
        from bestofn.moss.engine_shell import pair_bucket

        if not self.options["pair_groups"] or spec.n_takes > self._half(spec.n_takes):
            return None
        return (self._half(spec.n_takes), pair_bucket(int(self.prompt(spec).shape[0])))

    def generate_codes_paired(self, specs: list[GroupSpec], seeds=None):
        """``generate_codes`` of one or two groups in the pair shape: every engine call runs
        2 x half rows (``MossLocalEngine.generate_pair``), two chunks at a time, a group's
        chunks beside each other, or two groups of one chunk side by side. A take's codes are
        the same however its group was paired."""
        from bestofn.moss.engine_shell import PairRequest

        seeds = list(seeds or [None] * len(specs))
        halves = {self._half(spec.n_takes) for spec in specs}
        if len(halves) != 1:
            raise ValueError(f"pair: groups with different half sizes {sorted(halves)}")
        half = halves.pop()
        requests, owner, budgets = [], [], []
        for i, (spec, sd) in enumerate(zip(specs, seeds, strict=True)):
            sd = spec.seeds() if sd is None else list(sd)
            rows = self.prompt(spec)
            budget, limit = self._limits(spec)
            budgets.append(budget)
            for start in range(0, len(sd), half):
                requests.append(PairRequest(rows, sd[start : start + half], limit))
                owner.append(i)
        out = [([], [], b) for b in budgets]
        for start in range(0, len(requests), 2):
            results = self.engine.generate_pair(requests[start : start + 2], half, self.params)
            for i, res in zip(owner[start : start + 2], results, strict=True):
                out[i][0].extend(res.codes)
                out[i][1].extend(res.stopped)
        return out

    def generate_pair(self, specs: list[GroupSpec]) -> list[list[Take]]:
        """The takes of one or two groups (``pair_key`` equal) from shared generate calls;
        each group's takes are decoded by the codec on their own, as ``generate`` does."""
        results = self.generate_codes_paired(specs)
        return [
            self._takes(spec, spec.seeds(), *res) for spec, res in zip(specs, results, strict=True)
        ]

    def _render_whole(self, specs: list[GroupSpec]):
        """``bestofn.core.speech.stream_batch`` for a Delay model: each request's take, whole."""
        for i, spec in enumerate(specs):
            yield i, np.asarray(self.generate(spec)[0].audio, dtype=np.float32), True

    def generate(self, spec: GroupSpec) -> list[Take]:
        seeds = spec.seeds()
        return self._takes(spec, seeds, *self.generate_codes(spec, seeds))

    def _takes(self, spec: GroupSpec, seeds, codes, stopped, budget) -> list[Take]:
        t0 = time.perf_counter()
        audios = self._codec().decode(codes)  # numpy out: the device work is done when it returns
        self.decode_s += time.perf_counter() - t0
        if self.options["mono"]:
            audios = [a.mean(axis=1) if a.ndim == 2 else a for a in audios]
        rate = self.config.frame_rate
        return [
            Take(
                audio=np.asarray(audio, dtype=np.float32),
                seed=seed,
                meta={
                    "n_frames": int(c.shape[0]),
                    "frame_budget": budget,
                    "truncated": not done,
                    # 'empty': the stop head fired at frame 0; 'budget': cut at frame_budget
                    "stop_reason": "empty" if c.shape[0] == 0 else "eos" if done else "budget",
                    "gen_seconds": c.shape[0] / rate,
                },
            )
            for audio, seed, c, done in zip(audios, seeds, codes, stopped, strict=True)
        ]

    # ---- provenance ------------------------------------------------------------------------

    def _weight_hashes(self) -> dict:
        if self._hashes is None:
            from bestofn.moss.checkpoint import weight_files
            from bestofn.util.hashing import hash_files

            files = []
            if self.load_dir is not None and self.options["hash_weights"]:
                files += [*weight_files(self.load_dir), self.load_dir / "config.json"]
            if self.codec_dir is not None and self.options["hash_weights"]:
                files += sorted(self.codec_dir.glob("*.safetensors"))
            self._hashes = hash_files(files)
        return self._hashes

    def provenance(self) -> dict:
        from bestofn import __version__

        o = self.options
        settings = {k: o[k] for k in DEFAULTS if k not in ("hash_weights",)}
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in settings.items()}
        cfg = json.dumps(self.config.to_dict(), sort_keys=True)
        return {
            "backend": self.name,
            "bestofn_version": __version__,
            "model_dir": str(self.model_dir) if self.model_dir else "in-memory model",
            "load_dir": str(self.load_dir) if self.load_dir else None,
            "codec_dir": str(self.codec_dir) if self.codec_dir else None,
            "config_sha256": hashlib.sha256(cfg.encode()).hexdigest(),
            "weights_sha256": self._weight_hashes(),
            "dtype": str(self.dtype),
            # the paths that ran (the settings say what was asked for); Delay has no local
            # transformer
            "decode_attention": decode_attention_path(self.device, o["decode_attention"]),
            "local_attention": "none (Delay)"
            if self.is_delay
            else local_attention_path(self.device, o["local_attention"]),
            "codec_kernels": kernel_path(getattr(self.codec, "kernels", None)),
            "sampling": self.params.to_dict(),
            "frame_budget": self.budget.as_dict(),
            "settings": settings,
            "torch": torch.__version__,
        }

    def close(self) -> None:
        self.engine = self.model = self.codec = None
        self._ref_codes.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
