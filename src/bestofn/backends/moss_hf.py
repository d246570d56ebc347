"""MOSS-TTS-Local-Transformer-v1.5 through its published inference path (``moss-hf``).

The processor and model come from a local checkpoint directory with ``trust_remote_code``
(the code OpenMOSS ships next to the weights), exactly as the model card loads them; the codec
(MOSS-Audio-Tokenizer-v2, 48 kHz stereo, 12 codebooks at 12.5 frames/s) from its own directory.
This backend is the reference: slower than ``moss-fast``, but it runs the authors' code.

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
  on the GPU by default.
- A LoRA adapter (peft directory, option ``lora``) is merged into the weights once and the
  merged checkpoint cached on disk (``bestofn.moss.lora``).
- The processor module imports ``torchaudio`` but this backend only hands it 48 kHz tensors
  and codes. Where torchaudio is not installed (no build matches every torch), the import is
  satisfied while the remote code loads by a small stand-in that implements the two functions
  the processor could call (``load`` with soundfile, ``functional.resample`` with soxr).

``write_random_checkpoint`` writes a complete checkpoint + codec directory with random weights
(tiny, or the real 4B size) so the whole path runs in tests and benchmarks without downloads;
the codec there is a random stand-in with the v2 interface, since the v2 codec's modeling code
is published only on the model hub.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
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
# torchaudio stand-in (only while the remote processor module is imported, only if missing)


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
        from transformers import AutoConfig, AutoModel, AutoProcessor
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # per-tensor bars flood worker logs
        o = self.options
        dtype, attn = self._resolve_dtype_and_attn()
        if torch.device(self.device).type == "cuda":
            # The model card disables cuDNN SDPA (broken on some CUDA/PyTorch combinations).
            torch.backends.cuda.enable_cudnn_sdp(False)
        codec_kwargs = {
            "codec_path": str(self.codec_dir),
            "codec_weight_dtype": o["codec_weight_dtype"],
            "codec_compute_dtype": o["codec_compute_dtype"],
        }
        if attn != "eager":
            codec_kwargs["codec_attention_implementation"] = attn
        with _torchaudio_importable():
            self.processor = AutoProcessor.from_pretrained(
                str(self.load_dir), trust_remote_code=True, **codec_kwargs
            )
        # The remote model reads its attention choice from its own config fields.
        config = AutoConfig.from_pretrained(
            str(self.load_dir), trust_remote_code=True, local_files_only=True
        )
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
        codec = self.processor.audio_tokenizer
        codec.to(self.device).eval()
        self.codec = codec
        self.config = self.model.config
        self.n_vq = int(self.config.n_vq)
        self.audio_pad = int(self.config.audio_pad_token_id)
        self.sample_rate = int(getattr(codec, "sampling_rate", self.config.sampling_rate))
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
        import torch

        from bestofn.audio import load_audio

        path = Path(path)
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._ref_codes:
            audio, sr = load_audio(path, sample_rate=self.sample_rate, mono=False)
            audio = audio[: int(self.options["max_reference_s"] * sr)]
            wav = torch.from_numpy(np.ascontiguousarray(audio.T if audio.ndim == 2 else audio))
            with torch.inference_mode():
                codes = self.processor.encode_audios_from_wav([wav], sr, n_vq=self.n_vq)[0]
            self._ref_codes[key] = codes.to(torch.long).cpu()
        return self._ref_codes[key]

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

    def _decode_batch(self, batch: list) -> list:
        """One codec call for several takes: codes [n_vq, B, T] zero-padded + padding mask.

        The processor's ``decode_audio_codes`` asks for chunked (streaming) decode, which the
        MOSS codec implements for batch size 1 only; a one-shot decode takes the whole batch.
        """
        import torch

        device = next(self.codec.parameters()).device
        frames = max(int(c.shape[0]) for c in batch)
        codes = torch.zeros(self.n_vq, len(batch), frames, dtype=torch.long, device=device)
        mask = torch.zeros(len(batch), frames, dtype=torch.bool, device=device)
        for b, c in enumerate(batch):
            codes[:, b, : c.shape[0]] = c.T.to(device)
            mask[b, : c.shape[0]] = True
        out = self.codec.decode(
            codes, padding_mask=mask, num_quantizers=self.n_vq, return_dict=True
        )
        return [out.audio[b, :, : int(n)] for b, n in enumerate(out.audio_lengths.tolist())]

    def decode(self, codes: list) -> list[np.ndarray]:
        """Codes -> float32 audio (frames, 2) (or (frames,) if mono), batched through the codec."""
        import torch

        mono = bool(self.options["mono"])
        out: list[np.ndarray | None] = [None] * len(codes)
        todo = [i for i, c in enumerate(codes) if c.shape[0] > 0]
        for i in set(range(len(codes))) - set(todo):  # a take that stopped at once: no audio
            out[i] = np.zeros((0,) if mono else (0, 2), dtype=np.float32)
        step = max(1, int(self.options["decode_batch_size"]))
        for start in range(0, len(todo), step):
            idx = todo[start : start + step]
            with torch.inference_mode():
                wavs = self._decode_batch([codes[i] for i in idx])
            for i, wav in zip(idx, wavs, strict=True):
                a = wav.to(torch.float32).cpu()
                a = a.mean(dim=0) if mono else a.T
                out[i] = np.ascontiguousarray(a.numpy(), dtype=np.float32)
        return out

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


# ---------------------------------------------------------------------------------------------
# random checkpoints (tests, benchmarks): the published layout with random weights

REMOTE_CODE_FILES = (
    "__init__.py",
    "configuration_moss_tts.py",
    "gpt2_decoder.py",
    "modeling_moss_tts.py",
    "processing_moss_tts.py",
    "qwen3_decoder.py",
)
_SPECIALS = (  # tokenizer ids 256.. in this order (a byte-level vocab fills 0..255)
    ("pad_token_id", "<|endoftext|>"),
    ("im_start_token_id", "<|im_start|>"),
    ("im_end_token_id", "<|im_end|>"),
    ("audio_start_token_id", "<|audio_start|>"),
    ("audio_end_token_id", "<|audio_end|>"),
    ("audio_user_slot_token_id", "<|audio_user_slot|>"),
    ("audio_assistant_slot_token_id", "<|audio_assistant_slot|>"),
)
SIZES = {
    # Qwen3-4B backbone + one 2560-wide local block (model card / config facts)
    "real": dict(hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, inner=9728,
                 vocab=151936, local_heads=32, codebook=1024, codec_dim=256),
    "tiny": dict(hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, inner=64,
                 vocab=264, local_heads=4, codebook=64, codec_dim=8),
}  # fmt: skip


def _write_tokenizer(out: Path) -> None:
    """A byte-level tokenizer (256 byte tokens + the MOSS specials at 256..262)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([name for _, name in _SPECIALS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>",
                                   eos_token="<|im_end|>")  # fmt: skip
    fast.save_pretrained(out)


def _model_config(size: str) -> dict:
    s = SIZES[size]
    ids = {field: 256 + i for i, (field, _) in enumerate(_SPECIALS)}
    return {
        "model_type": "moss_tts_local",
        "architectures": ["MossTTSLocalModel"],
        "auto_map": {
            "AutoConfig": "configuration_moss_tts.MossTTSLocalConfig",
            "AutoModel": "modeling_moss_tts.MossTTSLocalModel",
        },
        "qwen3_config": {
            "vocab_size": s["vocab"], "hidden_size": s["hidden"],
            "intermediate_size": s["inner"], "num_hidden_layers": s["layers"],
            "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"],
            "head_dim": s["head_dim"], "max_position_embeddings": 40960,
            "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "attention_bias": False,
            "tie_word_embeddings": True,
        },
        "gpt2_config": {
            "vocab_size": 8, "n_embd": s["hidden"], "n_layer": 1, "n_head": s["local_heads"],
            "n_inner": s["inner"], "activation_function": "silu", "layer_norm_epsilon": 1e-6,
            "position_embedding_type": "rope", "rope_base": 1_000_000.0,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        },
        "n_vq": 12,
        "audio_vocab_size": s["codebook"],
        "audio_pad_code": s["codebook"],
        "local_text_head_mode": "binary",
        "sampling_rate": 48000,
        "attn_implementation": "flash_attention_2",  # as published; the backend overrides
        "tie_word_embeddings": True,
        **ids,
    }  # fmt: skip


def write_random_codec(out_dir, size: str = "tiny", seed: int = 0) -> Path:
    """A random codec with the MOSS-Audio-Tokenizer-v2 interface, as a remote-code directory."""
    import torch
    from transformers import AutoConfig, AutoModel

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "modeling_random_codec.py").write_text(_RANDOM_CODEC_SOURCE)
    s = SIZES[size]
    config = {
        "model_type": "bestofn_random_codec",
        "architectures": ["RandomCodecModel"],
        "auto_map": {
            "AutoConfig": "modeling_random_codec.RandomCodecConfig",
            "AutoModel": "modeling_random_codec.RandomCodecModel",
        },
        "n_vq": 12,
        "codebook_size": SIZES[size]["codebook"],
        "code_dim": s["codec_dim"],
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    cfg = AutoConfig.from_pretrained(str(out), trust_remote_code=True, local_files_only=True)
    torch.manual_seed(seed)
    AutoModel.from_config(cfg, trust_remote_code=True).save_pretrained(str(out))
    return out


def write_random_checkpoint(out_dir, code_dir, size: str = "tiny", seed: int = 0,
                            codec_dir=None) -> tuple[Path, Path]:  # fmt: skip
    """Write ``out_dir/model`` (published layout, random weights) and ``out_dir/codec``.

    ``code_dir`` holds the MOSS remote code (a checkpoint, or the moss_tts_local_v1.5 folder of
    OpenMOSS/MOSS-TTS). The local transformer's final norm is set so that the stop head says
    "continue" about 9 times in 10: random takes then run for several frames and some hit the
    budget, instead of all stopping at frame 0.
    """
    import torch
    from transformers import AutoConfig, AutoModel

    out, code_dir = Path(out_dir), Path(code_dir)
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    for name in REMOTE_CODE_FILES:
        if not (code_dir / name).is_file():
            _fail(code_dir / name, "code_dir", "MOSS remote code file missing")
        shutil.copy2(code_dir / name, model_dir / name)
    _write_tokenizer(model_dir)
    (model_dir / "config.json").write_text(json.dumps(_model_config(size), indent=1))
    codec_dir = Path(codec_dir) if codec_dir else write_random_codec(out / "codec", size, seed)
    processor_config = {
        "processor_class": "MossTTSLocalProcessor",
        "auto_map": {"AutoProcessor": "processing_moss_tts.MossTTSLocalProcessor"},
        "audio_tokenizer_name_or_path": str(codec_dir),
    }
    (model_dir / "processor_config.json").write_text(json.dumps(processor_config, indent=1))

    config = AutoConfig.from_pretrained(
        str(model_dir), trust_remote_code=True, local_files_only=True
    )
    config.attn_implementation = config.local_transformer_attn_implementation = "eager"
    torch.manual_seed(seed)
    dtype = torch.bfloat16 if size == "real" else torch.float32
    model = AutoModel.from_config(config, trust_remote_code=True, dtype=dtype)
    with torch.no_grad():
        ln_f = model.local_transformer.ln_f
        bias = torch.randn(ln_f.bias.shape, dtype=torch.float32)
        bias = bias / bias.norm()
        ln_f.weight.mul_(0.05)
        ln_f.bias.copy_(bias * 4.0)
        head = model.local_text_lm_head.weight  # rows: [continue, stop]
        head.zero_()
        head[0].copy_(bias * 0.55)  # logit gap 4 * 0.55 = 2.2 -> p(stop) ~ 0.1
    model.config.attn_implementation = "flash_attention_2"
    model.config.local_transformer_attn_implementation = "flash_attention_2"
    model.save_pretrained(str(model_dir))
    # save_pretrained rewrites config.json from the config object: keep the published auto_map
    saved = json.loads((model_dir / "config.json").read_text())
    saved["auto_map"] = _model_config(size)["auto_map"]
    (model_dir / "config.json").write_text(json.dumps(saved, indent=1))
    return model_dir, codec_dir


def random_for_bench(device: str, size: str = "real", workdir=None, code_dir=None, **options):
    """A MossHFGenerator on a random checkpoint of the real size (or ``size="tiny"``).

    ``code_dir``: the MOSS remote code (default: .ref/moss_tts_local_v1.5 of this repo). The
    codec is the random stand-in unless ``codec_dir`` is given: its decode cost is not v2's.
    """
    import tempfile

    root = Path(__file__).resolve().parents[3]
    code_dir = Path(code_dir or root / ".ref" / "moss_tts_local_v1.5")
    workdir = Path(workdir or tempfile.mkdtemp(prefix="moss-hf-bench-"))
    model_dir, codec_dir = write_random_checkpoint(
        workdir, code_dir, size=size, codec_dir=options.pop("codec_dir", None)
    )
    options.setdefault("cache_dir", str(workdir / "cache"))
    return MossHFGenerator(device=device, model_dir=model_dir, codec_dir=codec_dir, **options)


# The random codec's remote code (written next to its config.json). Interface of the v2 codec
# as the MOSS processor uses it; the numbers it produces mean nothing.
_RANDOM_CODEC_SOURCE = '''\
"""Random stand-in for MOSS-Audio-Tokenizer-v2 (48 kHz stereo, 12 codebooks, 3840 samples/frame)."""
from dataclasses import dataclass

import torch
import torch.nn as nn
from transformers import PretrainedConfig
from transformers.modeling_utils import PreTrainedAudioTokenizerBase


class RandomCodecConfig(PretrainedConfig):
    model_type = "bestofn_random_codec"

    def __init__(self, n_vq=12, codebook_size=64, code_dim=8, sampling_rate=48000,
                 downsample_rate=3840, channels=2, codec_weight_dtype="fp32", **kwargs):
        self.n_vq, self.codebook_size, self.code_dim = n_vq, codebook_size, code_dim
        self.sampling_rate, self.downsample_rate = sampling_rate, downsample_rate
        self.channels = channels
        self.codec_weight_dtype = codec_weight_dtype
        super().__init__(**kwargs)


@dataclass
class CodecOutput:
    audio_codes: torch.Tensor = None
    audio_codes_lengths: torch.Tensor = None
    audio: torch.Tensor = None
    audio_lengths: torch.Tensor = None


class RandomCodecModel(PreTrainedAudioTokenizerBase):  # the processor checks this base
    config_class = RandomCodecConfig

    def __init__(self, config):
        super().__init__(config)
        c = config
        self.sampling_rate, self.downsample_rate = c.sampling_rate, c.downsample_rate
        self.pool = 48  # samples averaged into one encoder feature
        n_feat = c.channels * c.downsample_rate // self.pool
        self.enc = nn.Linear(n_feat, c.code_dim)
        nq, size, dim = c.n_vq, c.codebook_size, c.code_dim
        self.enc_heads = nn.ModuleList(nn.Linear(dim, size) for _ in range(nq))
        self.codebooks = nn.ModuleList(nn.Embedding(size, dim) for _ in range(nq))
        self.dec = nn.Linear(c.code_dim, c.channels * 160)
        self.compute_dtype = torch.float32
        self.attention_implementation = None
        self.post_init()

    def set_compute_dtype(self, dtype):
        dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
        self.compute_dtype = dtypes.get(str(dtype), torch.float32)

    def set_attention_implementation(self, name):
        self.attention_implementation = name

    @torch.no_grad()
    def batch_encode(self, wav_list, num_quantizers=None):
        c, hop = self.config, self.config.downsample_rate
        frames = [-(-int(w.shape[-1]) // hop) for w in wav_list]
        x = torch.zeros(len(wav_list), c.channels, max(frames) * hop, device=self.device)
        for i, w in enumerate(wav_list):
            x[i, :, : w.shape[-1]] = w.to(self.device, torch.float32)
        x = x.reshape(len(wav_list), c.channels, max(frames), hop // self.pool, self.pool).mean(-1)
        feats = torch.tanh(self.enc(x.permute(0, 2, 1, 3).flatten(2)))
        nq = num_quantizers or c.n_vq
        codes = torch.stack([head(feats).argmax(-1) for head in self.enc_heads[:nq]])
        return CodecOutput(audio_codes=codes, audio_codes_lengths=torch.tensor(frames))

    @torch.no_grad()
    def decode(self, audio_codes, padding_mask=None, num_quantizers=None, return_dict=True,
               **kwargs):
        c, hop = self.config, self.config.downsample_rate
        nq, batch, frames = audio_codes.shape
        if kwargs.get("chunk_duration") is not None and batch != 1:  # as the v1 codec
            raise ValueError("Streaming decode via chunk_duration only supports batch_size=1.")
        lengths = padding_mask.sum(-1) if padding_mask is not None else torch.full((batch,), frames)
        with torch.autocast(self.device.type, dtype=self.compute_dtype,
                            enabled=self.compute_dtype != torch.float32):
            z = sum(self.codebooks[k](audio_codes[k]) for k in range(nq))
            y = torch.tanh(self.dec(z))  # [B, T, C*160]
        y = y.float().reshape(batch, frames, c.channels, 160).permute(0, 2, 1, 3)
        y = y.reshape(batch, c.channels, -1)
        audio = torch.nn.functional.interpolate(y, scale_factor=hop / 160)
        return CodecOutput(audio=audio, audio_lengths=lengths.to(torch.long) * hop)
'''
