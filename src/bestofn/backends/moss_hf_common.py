"""What the two published MOSS code paths of ``moss-hf`` share: their options, the checks of a
checkpoint directory, a torchaudio shim for the remote processor's import, and the parts of
the backend that do not depend on the architecture (reference voices, the prompt through the
published processor, takes and provenance).

``MossHFGenerator`` (bestofn.backends.moss_hf, MOSS-TTS-Local) and ``MossHFDelayGenerator``
(bestofn.backends.moss_hf_delay, MOSS-TTS Delay) both derive from ``MossHFBase``; neither imports
the other's module, except that the Local class hands a Delay checkpoint to the Delay class.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np

from bestofn.backends.base import Generator, Take
from bestofn.moss.budget import FrameBudget
from bestofn.moss.options import COMMON_DEFAULTS, group_instruction, instruction_option
from bestofn.moss.prompt import language_tag  # the same tags as moss-fast
from bestofn.util.dtypes import resolve_dtype
from bestofn.util.spec import GroupSpec

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


def _default_cache_dir() -> Path:
    """Where merged LoRA weights and the hash memo go when the option ``cache_dir`` is unset."""
    return Path.home() / ".cache" / "bestofn" / "moss"


# ---------------------------------------------------------------------------------------------
# the backend, what both architectures share


class MossHFBase(Generator):
    name = "moss-hf"
    paced = True
    table_weights = (
        "local MOSS-TTS-Local-Transformer-v1.5 or MOSS-TTS v1.5 Delay checkpoint (published "
        "code path)"
    )
    table_options = "see `src/bestofn/backends/moss_hf.py` (Delay: `moss_hf_delay.py`)"

    @classmethod
    def known_options(cls) -> frozenset[str]:
        return frozenset(DEFAULTS)

    @classmethod
    def check_options(cls, options: dict) -> None:
        instruction_option(options, cls.name)

    def _configure(self, device: str, options: dict, text_temperature: float | None = None):
        """Options checked and merged with the defaults (``text_temperature``: the
        architecture's own default for it), the frame budget, the checkpoint's files and the
        directory the weights load from (a merged LoRA's, when one is given)."""
        unknown = set(options) - set(DEFAULTS)
        if unknown:
            raise TypeError(
                f"moss-hf: unknown options {sorted(unknown)}; known: {sorted(DEFAULTS)}"
            )
        self.options = {**DEFAULTS, **options}
        if text_temperature is not None and "text_temperature" not in options:
            self.options["text_temperature"] = text_temperature
        o = self.options
        self.check_options(o)
        self.budget = FrameBudget.from_options(o)
        self.device = device
        # Check every file before importing transformers: a typo fails in milliseconds.
        self._model_files = check_checkpoint(o["model_dir"], "model_dir", tokenizer=True)

    def _weights_dir(self) -> None:
        """model_dir, cache_dir and load_dir (the LoRA-merged weights when ``lora`` is set)."""
        o = self.options
        self.cache_dir = Path(o["cache_dir"] or _default_cache_dir()).expanduser()
        self.model_dir = self.load_dir = Path(o["model_dir"]).expanduser()
        if o["lora"]:
            from bestofn.moss.lora import merged_weights_dir

            self.load_dir = merged_weights_dir(self.model_dir, Path(o["lora"]), self.cache_dir)

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

    def _load_codec(self, dtype, attn) -> None:
        """Our codec for the checkpoint's ``codec_dir`` (v1 or v2, from its config.json), after
        the model is loaded (``self.n_vq`` known); the rate of the takes is the codec's."""
        from bestofn.moss.codec.load import load_codec

        o = self.options
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
        from bestofn.util.audio import load_audio

        path = Path(path)
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._ref_codes:
            audio, sr = load_audio(path, sample_rate=self.sample_rate, mono=False)
            audio = audio[: int(self.options["max_reference_s"] * sr)]
            self._ref_codes[key] = self._encode_reference(audio, sr)
        return self._ref_codes[key]

    def _encode_reference(self, audio: np.ndarray, sr: int):
        """Codes [T, n_vq] of a reference clip (frames[, channels]); per architecture."""
        raise NotImplementedError

    def _instruction(self, spec: GroupSpec):
        return group_instruction(self.options["instruction"], spec)

    def prompt(self, spec: GroupSpec):
        """(input_ids [1, L, 1+n_vq], attention_mask [1, L]) for one group, via the processor."""
        language = self.options["language"] or language_tag(spec.language)
        reference = [self.reference_codes(spec.reference_audio)] if spec.reference_audio else None
        message = self.processor.build_user_message(
            text=spec.text,
            reference=reference,
            instruction=self._instruction(spec),
            language=language or None,
            tokens=self.budget.hint(spec.text),
        )
        batch = self.processor([[message]], mode="generation", n_vq=self.n_vq)
        return batch["input_ids"], batch["attention_mask"]

    # ---- takes ---------------------------------------------------------------------------------

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
            from bestofn.moss.codec.layers import kernel_path
            from bestofn.moss.lora import merge_info
            from bestofn.util.hashing import combined_sha256, dir_digest

            o = self.options
            prov = {
                "backend": self.name,
                "model_dir": str(self.model_dir),
                "codec_dir": str(self.codec_dir),
                "lora": str(o["lora"]) if o["lora"] else None,
                "dtype": str(self.dtype).removeprefix("torch."),
                "codec_compute_dtype": o["codec_compute_dtype"],
                # our codec's decoder pieces (codec_layers: compiled on CUDA, else eager)
                "codec_kernels": kernel_path(getattr(self.codec, "kernels", None)),
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
