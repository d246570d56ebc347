"""Production restorer: Sidon (sarulab-speech), 16 kHz in -> 48 kHz out (the networks:
``bestofn.backends.sidon.model``; loading the release: ``bestofn.backends.sidon.loader``).

Batching: takes are resampled to 16 kHz mono, each gets ``tail_pad_s`` of silence (the
decoder's receptive field past a take's end then lies in that silence, so a take restores the
same alone or in any batch), the batch is padded with an attention mask, and each output is
trimmed to exactly ``round(len * 48000 / sr_in)`` frames of its input.

Resampling to 16 kHz (``resample``): ``soxr`` on the host (the CPU default), or ``torch``: the
takes go to the device once, as generated, and are downmixed and resampled there
(``bestofn.backends.resample.resample_torch``, within 4e-7 of soxr HQ below 0.8 x Nyquist);
``auto`` is torch on CUDA. ``compile`` runs the encoder and decoder through ``torch.compile``
(CUDA; dynamic shapes). ``bucket_s`` pads each batch's length up to a multiple of that many
seconds, so compiled kernels and cuDNN plans see few distinct shapes (the tail padding keeps
a take's output the same at any padded length).

The decoder's CUDA path (``snake``: auto, fused, eager; ``layout``: channels_last, nchw;
``bestofn.backends.sidon.kernels``) is this restorer's own (``self.kernels``), set when it is
built (runtime options) or by ``set_speed``; the provenance names it (``decoder_kernels``)."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import nn

from bestofn.backends.base import Restorer
from bestofn.backends.resample import out_length, resample_torch
from bestofn.backends.sidon.kernels import DEFAULT_LAYOUT, DEFAULT_SNAKE, DecoderKernels
from bestofn.backends.sidon.loader import load_release
from bestofn.backends.sidon.model import (
    INPUT_SAMPLE_RATE,
    N_LAYERS,
    OUTPUT_SAMPLE_RATE,
    SeamlessFbank,
)
from bestofn.util.audio import mono_at
from bestofn.util.dtypes import resolve_dtype

# What runs under autocast: the w2v-BERT conformer layers and the DAC-style decoder.
AUTOCAST_OPS = (
    "linear",
    "depthwise_conv1d",
    "conv1d",
    "conv_transpose1d",
    "layer_norm",
    "attention",
)


class SidonRestorer(Restorer):
    name = "sidon"
    table_weights = "local w2v-BERT 2.0 dir + Sidon adapter/decoder"
    table_options = (
        "`w2v_bert_dir`, `adapter_dir`, `decoder_path`, `batch_size`, `cache_dir` (below)"
    )
    input_sample_rate = INPUT_SAMPLE_RATE
    output_sample_rate = OUTPUT_SAMPLE_RATE

    def __init__(
        self,
        device: str = "cpu",
        w2v_bert_dir: str | None = None,
        adapter_dir: str | None = None,
        decoder_path: str | None = None,
        cache_dir: str | None = None,  # merged-cleanser cache + hash memo
        batch_size: int = 32,
        dtype: str = "auto",  # auto: float16 on CUDA (as Sidon's own inference), float32 on CPU
        tail_pad_s: float = 0.5,
        num_layers: int = N_LAYERS,
        resample: str = "auto",  # soxr (host) or torch (on the device); auto: torch on CUDA
        compile: bool | str = False,  # torch.compile encoder + decoder (CUDA; "auto": on CUDA)
        bucket_s: float = 0.0,  # pad batch lengths up to a multiple of this (0: off)
        snake: str = DEFAULT_SNAKE,  # the decoder's Snake on CUDA: auto, fused or eager
        layout: str = DEFAULT_LAYOUT,  # the fused decoder's layout: channels_last or nchw
    ):
        self._configure(
            device, batch_size, dtype, tail_pad_s, num_layers, resample, compile, bucket_s,
            snake, layout,
        )  # fmt: skip
        release = load_release(w2v_bert_dir, adapter_dir, decoder_path, cache_dir, self.num_layers)
        self.paths, self.hashes = release.paths, release.hashes
        self.merged_from_cache = release.merged_from_cache
        self._attach(release.encoder, release.decoder)

    @classmethod
    def from_modules(cls, encoder, decoder, device: str = "cpu", **options) -> SidonRestorer:
        """A restorer around modules already in memory (``bestofn.fakes.sidon``, tests): a
        ``Wav2Vec2BertModel`` with the LoRA merged and a ``DACDecoder``. ``options``: the
        constructor's batch_size, dtype, tail_pad_s, num_layers, resample, compile, bucket_s,
        snake, layout."""
        self = cls.__new__(cls)
        self._configure(device, **options)
        self._attach(encoder, decoder)
        return self

    def _configure(
        self,
        device: str,
        batch_size: int = 32,
        dtype: str = "auto",
        tail_pad_s: float = 0.5,
        num_layers: int = N_LAYERS,
        resample: str = "auto",
        compile: bool | str = False,
        bucket_s: float = 0.0,
        snake: str = DEFAULT_SNAKE,
        layout: str = DEFAULT_LAYOUT,
    ) -> None:
        self.device = device
        self.kernels = DecoderKernels(snake, layout)  # this restorer's own decoder path
        self.batch_size = int(batch_size)
        if self.batch_size <= 0:
            raise ValueError(f"sidon: batch_size must be positive, got {batch_size}")
        is_cuda = str(device).startswith("cuda")
        dtype = ("float16" if is_cuda else "float32") if dtype == "auto" else dtype
        if dtype not in ("float16", "bfloat16", "float32"):
            raise ValueError(
                f"sidon: dtype must be auto, float16, bfloat16 or float32; got {dtype!r}"
            )
        # reduced precision only where this device runs every op under autocast; else float32
        self.dtype = resolve_dtype("sidon", device, dtype, AUTOCAST_OPS)
        self.tail_pad = int(round(float(tail_pad_s) * INPUT_SAMPLE_RATE))
        self.num_layers = int(num_layers)
        self.hashes: dict[str, str] = {}
        self.paths: dict[str, str] = {}
        self.merged_from_cache = False
        if resample not in ("auto", "soxr", "torch"):
            raise ValueError(f"sidon: resample must be auto, soxr or torch; got {resample!r}")
        self.resample = ("torch" if is_cuda else "soxr") if resample == "auto" else resample
        if compile not in (True, False, "auto"):
            raise ValueError(f"sidon: compile must be true, false or auto; got {compile!r}")
        self.compile = is_cuda and compile in (True, "auto")
        if float(bucket_s) < 0:
            raise ValueError(f"sidon: bucket_s must be >= 0, got {bucket_s}")
        self.bucket = int(round(float(bucket_s) * INPUT_SAMPLE_RATE))

    def _attach(self, encoder, decoder) -> None:
        self.fbank = SeamlessFbank().to(self.device)
        self.encoder = encoder.eval().to(self.device)
        self.decoder = decoder.eval().to(self.device).use_kernels(self.kernels)
        for p in [*self.encoder.parameters(), *self.decoder.parameters()]:
            p.requires_grad_(False)
        self.set_speed(compile=self.compile)

    def set_speed(
        self,
        batch_size: int | None = None,
        resample: str | None = None,
        compile: bool | None = None,
        bucket_s: float | None = None,
        dtype: str | None = None,
        *,
        snake: str | None = None,
        layout: str | None = None,
    ) -> None:
        """Change the runtime knobs of a loaded restorer (benchmarks compare them in one
        process); ``None`` keeps a knob. ``dtype`` is the autocast dtype (float16, bfloat16
        or float32; the weights stay as loaded); ``snake`` and ``layout`` the decoder's CUDA
        path (``layout`` changes the output's last bits: provenance ``decoder_kernels``)."""
        if snake is not None:
            self.kernels.set_snake(snake)
        if layout is not None:
            self.kernels.set_layout(layout)
        if dtype is not None:
            if dtype not in ("float16", "bfloat16", "float32"):
                raise ValueError(
                    f"sidon: dtype must be float16, bfloat16 or float32; got {dtype!r}"
                )
            self.dtype = resolve_dtype("sidon", self.device, dtype, AUTOCAST_OPS)
        if batch_size is not None:
            if int(batch_size) <= 0:
                raise ValueError(f"sidon: batch_size must be positive, got {batch_size}")
            self.batch_size = int(batch_size)
        if resample is not None:
            if resample not in ("soxr", "torch"):
                raise ValueError(f"sidon: resample must be soxr or torch; got {resample!r}")
            self.resample = resample
        if bucket_s is not None:
            self.bucket = int(round(float(bucket_s) * INPUT_SAMPLE_RATE))
        if compile is not None:
            self.compile = bool(compile) and str(self.device).startswith("cuda")
            self._encode, self._decode = self.encoder, self.decoder
            if self.compile:
                self._encode = torch.compile(self.encoder, dynamic=True)
                self._decode = torch.compile(self.decoder, dynamic=True)

    # --- inference -----------------------------------------------------------------------------

    def _autocast(self):
        if self.dtype == "float32":
            return contextlib.nullcontext()
        kind = "cuda" if str(self.device).startswith("cuda") else "cpu"
        return torch.autocast(device_type=kind, dtype=getattr(torch, self.dtype))

    @torch.inference_mode()
    def _restore_tensor(self, wav_t: torch.Tensor, n16: list[int]) -> np.ndarray:
        """Restore a (B, N) 16 kHz batch on the device, zero past each take's ``n16`` samples;
        returns the 48 kHz batch on the host (one device->host copy)."""
        lengths = [n + self.tail_pad for n in n16]
        # every take needs at least one full fbank frame pair
        n_max = max(max(lengths), 2 * SeamlessFbank.frame_length)
        if self.bucket:
            n_max = -(-n_max // self.bucket) * self.bucket
        if wav_t.shape[1] < n_max:
            wav_t = nn.functional.pad(wav_t, (0, n_max - wav_t.shape[1]))
        wav_t = wav_t[:, :n_max]
        lengths_t = torch.tensor(lengths, device=self.device)
        feats, mask = self.fbank(wav_t, lengths_t)
        with self._autocast():
            hidden = self._encode(input_features=feats, attention_mask=mask).last_hidden_state
            hidden = hidden * mask.unsqueeze(-1).to(hidden.dtype)  # padded frames -> 0
            out = self._decode(hidden.transpose(1, 2))[:, 0].float()
        if not out.is_cuda:
            return out.numpy()
        # through page-locked memory (torch's caching host allocator reuses the block once the
        # arrays are freed): a pageable copy of a batch was a visible share of the restore on
        # an H200
        host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        host.copy_(out)
        return host.numpy()

    def _trim(self, out: np.ndarray, n16: list[int]) -> list[np.ndarray]:
        ratio = OUTPUT_SAMPLE_RATE // INPUT_SAMPLE_RATE
        restored = []
        for i, n in enumerate(n16):
            y = out[i, : n * ratio]
            if y.shape[0] < n * ratio:  # only without tail padding
                y = np.pad(y, (0, n * ratio - y.shape[0]))
            restored.append(y)
        return restored

    def restore_batch(self, audios16k: list[np.ndarray]) -> list[np.ndarray]:
        """Restore 16 kHz mono takes; returns 48 kHz takes of exactly 3x their length."""
        n16 = [len(a) for a in audios16k]
        wav = np.zeros((len(audios16k), max(max(n16), 1)), dtype=np.float32)
        for i, a in enumerate(audios16k):
            wav[i, : len(a)] = a
        return self._trim(self._restore_tensor(torch.from_numpy(wav).to(self.device), n16), n16)

    @torch.inference_mode()
    def _to_16k_on_device(self, audios: list[np.ndarray], sr: int):
        """The takes as one (B, N) 16 kHz mono batch on the device: copied once as generated,
        downmixed and resampled there, zero past each take's end. Returns (batch, lengths)."""
        n = [int(a.shape[0]) for a in audios]
        x = torch.zeros(len(audios), max(max(n), 1), device=self.device)
        for b, a in enumerate(audios):
            t = torch.from_numpy(np.asarray(a, dtype=np.float32)).to(self.device)
            x[b, : n[b]] = t.mean(-1) if t.ndim == 2 else t
        y = resample_torch(x, sr, INPUT_SAMPLE_RATE)
        n16 = [out_length(k, sr, INPUT_SAMPLE_RATE) for k in n]
        keep = (
            torch.arange(y.shape[1], device=self.device)[None, :]
            < torch.tensor(n16, device=self.device)[:, None]
        )
        return y * keep, n16

    def restore(self, audios: list[np.ndarray], sample_rate: int):
        sr = int(sample_rate)
        targets = [int(round(a.shape[0] * OUTPUT_SAMPLE_RATE / sr)) for a in audios]
        # sort by duration: little padding per batch
        order = sorted(range(len(audios)), key=lambda i: audios[i].shape[0])
        on_device = self.resample == "torch"
        audios16k = None if on_device else mono_at(audios, sr, INPUT_SAMPLE_RATE)
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(audios)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            if on_device:
                wav_t, n16 = self._to_16k_on_device([audios[i] for i in idx], sr)
                restored = self._trim(self._restore_tensor(wav_t, n16), n16)
            else:
                restored = self.restore_batch([audios16k[i] for i in idx])
            for i, y in zip(idx, restored, strict=True):
                # exact length of the input take at 48 kHz (soxr may be off by a sample)
                t = targets[i]
                out[i] = (y[:t] if len(y) >= t else np.pad(y, (0, t - len(y)))).astype(np.float32)
        return out, OUTPUT_SAMPLE_RATE

    def provenance(self) -> dict:
        return {
            "backend": self.name,
            "paths": self.paths or "in-memory modules",
            "sha256": self.hashes,
            "num_layers": self.num_layers,
            "lora_merged": True,
            "merged_from_cache": self.merged_from_cache,
            "dtype": self.dtype,
            "batch_size": self.batch_size,
            "resample": self.resample,
            "compiled": self.compile,
            "decoder_kernels": self.kernels.describe(self.device),
            "bucket_samples_16k": self.bucket,
            "tail_pad_samples_16k": self.tail_pad,
            "sample_rates": [INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE],
        }

    def close(self) -> None:
        self.encoder = self.decoder = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
