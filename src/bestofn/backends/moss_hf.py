"""MOSS-TTS-Local-Transformer-v1.5 through its published inference path (``moss-hf``).

The processor and model come from a local checkpoint directory with ``trust_remote_code``
(the code OpenMOSS ships next to the weights), as the model card loads them. The codec
(MOSS-Audio-Tokenizer-v2, 48 kHz stereo, 12 codebooks at 12.5 frames/s) comes from its own
directory through our implementation (``bestofn.moss.codec.load_codec``, the one moss-fast
uses; parity-checked against the published v2 code), so the processor is built without one.
This backend is the reference for generation: slower than ``moss-fast``, the authors' code.

What this module adds around the published code, and why:

- N takes of one prompt run as one ``generate`` batch (``batch_size`` rows at a time): the
  prompt is built once and repeated, so every row has the same length and no padding.
- Per-take seeds. The published ``generate`` draws every token of the batch from torch's
  global RNG, so a take would depend on its batch neighbours. We replace only the model's
  draw (``_sample_next_token``): penalty and filtering stay the reference's, and the random
  number of take i at frame f, step s is ``take_uniform(seed_i, f * 64 + s)`` from
  ``bestofn.moss.sampling`` -- the same numbers ``moss-fast`` draws, so both engines give a
  take the same randomness. Take i is reproducible from its seed whatever the batch size
  (up to floating-point differences between batch shapes on the GPU).
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
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import sys
import types
from pathlib import Path

import numpy as np

from bestofn.backends.base import Generator, Take
from bestofn.dtypes import resolve_dtype
from bestofn.moss.budget import FrameBudget
from bestofn.moss.options import COMMON_DEFAULTS
from bestofn.moss.prompt import LANGUAGE_TAGS  # the same tags as moss-fast
from bestofn.spec import GroupSpec

log = logging.getLogger(__name__)


DEFAULTS = {
    **COMMON_DEFAULTS,
    "attn_implementation": "auto",  # flash_attention_2 if installed, else sdpa; eager on cpu
}
SAMPLING_KEYS = (
    "do_sample", "audio_temperature", "audio_top_p", "audio_top_k", "audio_repetition_penalty",
    "text_temperature", "text_top_p", "text_top_k",
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# checkpoint checks: a missing file is named before anything heavy is imported


def _fail(path: Path, field: str, what: str):
    raise FileNotFoundError(f"moss-hf: {what}: {path} (config field: {field})")


def _weight_files(ckpt: Path, field: str) -> list[Path]:
    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as e:
            raise ValueError(f"moss-hf: corrupt {index} (config field: {field}): {e}") from e
        files = [ckpt / s for s in shards]
        for f in files:
            if not f.is_file():
                _fail(f, field, "weight shard listed in the index is missing")
        return files
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        _fail(ckpt / "model.safetensors", field, "no weights")
    return files


def _processor_class(model_dir: Path) -> str:
    """The processor's ``module.Class`` from processor_config.json's auto_map."""
    path = Path(model_dir) / "processor_config.json"
    auto_map = json.loads(path.read_text()).get("auto_map") or {} if path.is_file() else {}
    ref = auto_map.get("AutoProcessor") or "processing_moss_tts.MossTTSLocalProcessor"
    return (ref if isinstance(ref, str) else ref[0]).split("--")[-1]


def _auto_map_modules(config_file: Path) -> list[str]:
    try:
        auto_map = json.loads(config_file.read_text()).get("auto_map") or {}
    except ValueError as e:
        raise ValueError(f"moss-hf: corrupt {config_file}: {e}") from e
    refs = [v if isinstance(v, str) else v[0] for v in auto_map.values() if v]
    return sorted({ref.split("--")[-1].rsplit(".", 1)[0] for ref in refs})


def check_checkpoint(path, field: str, *, tokenizer: bool) -> list[Path]:
    """Raise FileNotFoundError naming the first missing file; return the weight files."""
    if path is None:
        raise ValueError(f"moss-hf: config field {field} is required")
    ckpt = Path(path).expanduser()
    if not ckpt.is_dir():
        _fail(ckpt, field, "checkpoint directory not found")
    config = ckpt / "config.json"
    if not config.is_file():
        _fail(config, field, "missing config.json")
    modules = _auto_map_modules(config)
    if (ckpt / "processor_config.json").is_file():
        modules += _auto_map_modules(ckpt / "processor_config.json")
    for module in modules:
        if not (ckpt / f"{module}.py").is_file():
            _fail(ckpt / f"{module}.py", field, "remote code named in auto_map is missing")
    if tokenizer and not (ckpt / "tokenizer.json").is_file():
        if not (ckpt / "vocab.json").is_file():
            _fail(ckpt / "tokenizer.json", field, "missing tokenizer")
    return _weight_files(ckpt, field)


# ---------------------------------------------------------------------------------------------
# torchaudio shim (only while the remote processor module is imported, only if missing)


def _torchaudio_standin() -> types.ModuleType:
    import torch

    def load(path, *args, **kwargs):
        import soundfile as sf

        audio, sr = sf.read(str(path), dtype="float32", always_2d=True)
        return torch.from_numpy(np.ascontiguousarray(audio.T)), int(sr)

    def resample(waveform, orig_freq, new_freq, *args, **kwargs):
        import soxr

        if int(orig_freq) == int(new_freq):
            return waveform
        x = waveform.detach().to("cpu", torch.float32).numpy()
        flat = x.reshape(-1, x.shape[-1]).T  # soxr wants (frames, channels)
        y = soxr.resample(flat, int(orig_freq), int(new_freq), quality="HQ")
        y = torch.from_numpy(np.ascontiguousarray(y.T)).reshape(*x.shape[:-1], -1)
        return y.to(waveform.device, waveform.dtype)

    module = types.ModuleType("torchaudio")
    module.load = load
    module.functional = types.ModuleType("torchaudio.functional")
    module.functional.resample = resample
    module.__bestofn_standin__ = True
    return module


def _torchaudio_works() -> bool:
    try:
        import torchaudio  # noqa: F401
    except Exception:  # missing, or built for another torch (raises at import)
        for name in [m for m in sys.modules if m == "torchaudio" or m.startswith("torchaudio.")]:
            sys.modules.pop(name, None)
        return False
    return True


@contextlib.contextmanager
def _torchaudio_importable():
    if _torchaudio_works():
        yield
        return
    standin = _torchaudio_standin()
    sys.modules["torchaudio"] = standin
    sys.modules["torchaudio.functional"] = standin.functional
    try:
        yield
    finally:  # other code in the worker must still see "no torchaudio"
        sys.modules.pop("torchaudio", None)
        sys.modules.pop("torchaudio.functional", None)


# ---------------------------------------------------------------------------------------------
# per-take draws inside the published generate loop


class _TakeDraws:
    """Stands in for ``model._sample_next_token`` during one ``generate`` call.

    The loop calls it once per frame for the stop head, then once per codebook, always for the
    whole batch and always in that order, so the n-th call is (frame n // (n_vq+1), step
    n % (n_vq+1)). Penalty and filtering are the reference's; only the draw is per take.
    """

    def __init__(self, model, seeds: list[int], n_vq: int, device):
        import torch

        self.model, self.n_vq, self.calls = model, n_vq, 0
        self.seeds = torch.tensor(seeds, dtype=torch.long, device=device)

    def __call__(self, logits, do_sample, temperature, top_k, top_p, previous_token_ids=None,
                 repetition_penalty=1.0):  # fmt: skip
        from bestofn.moss.sampling import STEPS_PER_FRAME, sample_tokens, take_uniform

        frame, step = divmod(self.calls, self.n_vq + 1)
        self.calls += 1
        scores = self.model._apply_repetition_penalty(
            logits.float(), previous_token_ids, repetition_penalty
        )
        if do_sample and float(temperature) <= 0:
            raise ValueError("temperature must be positive when do_sample=True.")
        uniform = take_uniform(self.seeds, frame * STEPS_PER_FRAME + step)
        return sample_tokens(
            scores,
            uniform,
            temperature=float(temperature),
            top_k=int(top_k or 0),
            top_p=float(1.0 if top_p is None else top_p),
            do_sample=bool(do_sample),
        )


@contextlib.contextmanager
def _per_take_draws(model, seeds, n_vq, device):
    if not hasattr(model, "_sample_next_token") or not hasattr(model, "_apply_repetition_penalty"):
        raise RuntimeError(
            "moss-hf: the checkpoint's remote code has no _sample_next_token/"
            "_apply_repetition_penalty; per-take seeds cannot be applied to this version"
        )
    draws = _TakeDraws(model, seeds, n_vq, device)
    model._sample_next_token = draws  # instance attribute shadows the method
    try:
        yield draws
    finally:
        del model._sample_next_token


# ---------------------------------------------------------------------------------------------
# the backend


def _default_cache_dir() -> Path:
    root = os.environ.get("BESTOFN_CACHE") or Path.home() / ".cache" / "bestofn"
    return Path(root) / "moss"


class MossHFGenerator(Generator):
    name = "moss-hf"

    @classmethod
    def known_options(cls) -> frozenset[str]:
        return frozenset(DEFAULTS)

    def __new__(cls, device: str = "cpu", **options):
        # A MOSS-TTS Delay checkpoint (config.json model_type moss_tts_delay) runs through
        # its own published code path (bestofn.backends.moss_hf_delay).
        if cls is MossHFGenerator and options.get("model_dir"):
            from bestofn.moss.delay import is_delay_checkpoint

            if is_delay_checkpoint(Path(options["model_dir"]).expanduser()):
                from bestofn.backends.moss_hf_delay import MossHFDelayGenerator

                cls = MossHFDelayGenerator
        return super().__new__(cls)

    def __init__(self, device: str = "cpu", **options):
        unknown = set(options) - set(DEFAULTS)
        if unknown:
            raise TypeError(
                f"moss-hf: unknown options {sorted(unknown)}; known: {sorted(DEFAULTS)}"
            )
        self.options = {**DEFAULTS, **options}
        o = self.options
        if o["instruction"] not in ("none", "emotion", "emotion_description"):
            raise ValueError(f"moss-hf: instruction must be none|emotion|emotion_description, "
                             f"got {o['instruction']!r}")  # fmt: skip
        self.budget = FrameBudget.from_options(o)
        self.device = device
        # Check every file before importing transformers: a typo fails in milliseconds.
        self._model_files = check_checkpoint(o["model_dir"], "model_dir", tokenizer=True)
        self._codec_files = check_checkpoint(o["codec_dir"], "codec_dir", tokenizer=False)
        self.cache_dir = Path(o["cache_dir"] or _default_cache_dir()).expanduser()
        self.model_dir = Path(o["model_dir"]).expanduser()
        self.codec_dir = Path(o["codec_dir"]).expanduser()
        self.load_dir = self.model_dir
        if o["lora"]:
            from bestofn.moss.lora import merged_weights_dir

            self.load_dir = merged_weights_dir(self.model_dir, Path(o["lora"]), self.cache_dir)
        self._load()
        self._ref_codes: dict[tuple, object] = {}  # reference voice -> codes, per worker

    # ---- loading ---------------------------------------------------------------------------

    def _resolve_dtype_and_attn(self):
        import torch

        on_cuda = torch.device(self.device).type == "cuda"
        dtype = self.options["dtype"]
        if dtype == "auto":
            dtype = torch.bfloat16 if on_cuda else torch.float32
        elif isinstance(dtype, str):
            alias = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
            dtype = getattr(torch, alias.get(dtype, dtype))
        # reduced precision only where this device runs the backbone's ops in it; else float32
        ops = ("embedding", "attention", "linear")
        dtype = getattr(torch, resolve_dtype("moss-hf", self.device, dtype, ops, "cast"))
        attn = self.options["attn_implementation"]
        if attn == "auto":
            if not on_cuda:
                attn = "eager"
            elif importlib.util.find_spec("flash_attn") is not None:
                attn = "flash_attention_2"
            else:
                attn = "sdpa"
        return dtype, attn

    def _load(self):
        import torch
        from transformers import AutoConfig, AutoModel, AutoTokenizer
        from transformers.dynamic_module_utils import get_class_from_dynamic_module
        from transformers.utils import logging as hf_logging

        from bestofn.moss.codec import load_codec

        hf_logging.disable_progress_bar()  # per-tensor bars flood worker logs
        o = self.options
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
        self.codec = load_codec(
            self.codec_dir, device=self.device, n_vq=self.n_vq,
            weight_dtype=o["codec_weight_dtype"], compute_dtype=o["codec_compute_dtype"],
            decode_batch_size=o["decode_batch_size"],
        )  # fmt: skip
        self.sample_rate = int(self.codec.sample_rate)
        self.dtype, self.attn = dtype, attn

    def close(self):
        for name in ("model", "processor", "codec"):
            self.__dict__.pop(name, None)
        self._ref_codes.clear()
        with contextlib.suppress(Exception):
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    # ---- prompt ----------------------------------------------------------------------------

    def reference_codes(self, path):
        """Codec codes [T, n_vq] of a reference voice file, encoded once per worker."""
        from bestofn.audio import load_audio

        path = Path(path)
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._ref_codes:
            audio, sr = load_audio(path, sample_rate=self.sample_rate, mono=False)
            audio = audio[: int(self.options["max_reference_s"] * sr)]
            self._ref_codes[key] = self._encode_reference(audio, sr)
        return self._ref_codes[key]

    def _encode_reference(self, audio: np.ndarray, sr: int):
        """Codes [T, n_vq] of a reference clip (frames[, channels]) via our codec, prepared as
        the processor's ``encode_audios_from_wav`` prepares it (mono on both channels,
        -20 dBFS within +-3 dB)."""
        return self.codec.encode(audio, sr)

    def _instruction(self, spec: GroupSpec):
        mode = self.options["instruction"]
        if mode == "emotion":
            return spec.emotion or None
        if mode == "emotion_description":
            return spec.emotion_description or None
        return None

    def prompt(self, spec: GroupSpec):
        """(input_ids [1, L, 1+n_vq], attention_mask [1, L]) for one group, via the processor."""
        language = self.options["language"] or LANGUAGE_TAGS.get(spec.language, spec.language)
        reference = [self.reference_codes(spec.reference_audio)] if spec.reference_audio else None
        message = self.processor.build_user_message(
            text=spec.text,
            reference=reference,
            instruction=self._instruction(spec),
            language=language or None,
        )
        batch = self.processor([[message]], mode="generation", n_vq=self.n_vq)
        return batch["input_ids"], batch["attention_mask"]

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

    def generate(self, spec: GroupSpec) -> list[Take]:
        seeds = spec.seeds()
        codes, truncated, budget = self.generate_codes(spec, seeds)
        audios = self.decode(codes)
        frame_rate = float(self.budget.frame_rate)
        return [
            Take(
                audio=audio,
                seed=seed,
                meta={
                    "n_frames": int(c.shape[0]),
                    "frame_budget": budget,
                    "truncated": bool(cut),
                    # 'empty': the stop head fired at frame 0; 'budget': cut at frame_budget
                    "stop_reason": "empty" if c.shape[0] == 0 else "budget" if cut else "eos",
                    "gen_seconds": c.shape[0] / frame_rate,
                },
            )
            for audio, seed, c, cut in zip(audios, seeds, codes, truncated, strict=True)
        ]

    # ---- provenance ------------------------------------------------------------------------

    def provenance(self) -> dict:
        if not hasattr(self, "_provenance"):
            from bestofn.hashing import combined_sha256, dir_digest
            from bestofn.moss.lora import merge_info

            o = self.options
            prov = {
                "backend": self.name,
                "model_dir": str(self.model_dir),
                "codec_dir": str(self.codec_dir),
                "lora": str(o["lora"]) if o["lora"] else None,
                "dtype": str(self.dtype).removeprefix("torch."),
                "codec_compute_dtype": o["codec_compute_dtype"],
                "sampling": {k: o[k] for k in SAMPLING_KEYS},
                "frame_budget": self.budget.as_dict(),
                "instruction": o["instruction"],
                "max_reference_s": o["max_reference_s"],
                "seeding": "take_uniform(seed, frame*64+step)",
            }
            if o["hash_weights"]:
                memo = self.cache_dir / "hash-memo"
                prov["model_sha256"] = combined_sha256(dir_digest(self.model_dir, memo))
                prov["codec_sha256"] = combined_sha256(dir_digest(self.codec_dir, memo))
            if o["lora"]:
                info = merge_info(self.load_dir)
                prov["lora_sha256"] = info.get("adapter_sha256")
                prov["merged_dir"] = str(self.load_dir)
            self._provenance = prov
        return dict(self._provenance)
