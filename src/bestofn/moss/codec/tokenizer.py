"""MOSS-Audio-Tokenizer v1 and v2: our own batched inference code for the codecs of MOSS-TTS.

One implementation for both versions; which one a directory holds is read from its
``config.json`` (``bestofn.moss.codec.config``), and so is the module list:

- v1, ``OpenMOSS-Team/MOSS-Audio-Tokenizer``: 24 kHz mono, the codec of MOSS-TTS Delay
  (32 quantizers);
- v2, ``OpenMOSS-Team/MOSS-Audio-Tokenizer-v2``: 48 kHz stereo (channels interleaved sample
  by sample into one 96 kHz stream), six transformer stages per side, per-stage windows; the
  codec of MOSS-TTS-Local v1.5, which uses its first 12 quantizers.

The checkpoint is read directly (``config.json`` + fp32 ``*.safetensors``): no remote code.
Facts used here, from the published modelling code (v1: OpenMOSS/MOSS-Audio-Tokenizer@56df9ee,
copy for parity tests in the git-ignored ``.ref/moss_audio_tokenizer``; v2: the hub's code as
vendored in vLLM-Omni, zzehli/vllm-omni@10906e3, copy in ``.ref/moss_audio_tokenizer_v2``):

- ``downsample_rate`` samples per frame and channel (v1 1920 at 24 kHz, v2 3840 at 48 kHz:
  12.5 frames/s both), residual quantizers (``quantizer_kwargs``: rlfq, 32 x 1024 codes of
  dim 8, ``rvq_dim`` 512, in/out 768).
- the stages (``bestofn.moss.codec.layers``): patch reshapes and causal transformer stages
  with a sliding attention window.
- Quantizer weights use weight normalisation (1x1 convolutions with bias); decoding a code is
  ``out_proj(codebook[code])`` summed over quantizers, then ``output_proj``. Encoding picks the
  nearest L2-normalised codebook entry (rlfq) or the nearest entry (rvq) of the residual.

Decoding is causal and every clip starts at position 0, so right-padding a batch changes no
clip's samples: ``decode`` pads the clips of a call to one length (sorted by length, in chunks
of ``decode_batch_size``) and runs them at once on one device.

Precision (``compute_dtype``; ``weight_dtype`` only matters for ``fp8``):

- ``fp32``: as the published code runs by default; ``bf16``: weights and activations bf16
  (RoPE angles, code embeddings and the quantizer stay fp32).
- ``fp8``: the transformer layers' Linear weights stored float8_e4m3fn with one scale per
  output channel; activations quantized per row on the fly and multiplied with
  ``torch._scaled_mm`` (bf16 out); the stages' input/output projections, norms and attention
  stay bf16. Needs a CUDA GPU with fp8 matmuls (compute capability 8.9+); anywhere else it is
  refused with a message naming the option.
- ``weight_dtype: fp8`` with ``compute_dtype`` bf16/fp32: the same weights stored fp8 and
  upcast per layer (memory only; runs anywhere).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bestofn.moss.codec.checkpoint import (
    AudioTokenizerError,
    Checkpoint,
    check_shape,
    need,
    weight_normed,
)
from bestofn.moss.codec.config import (  # noqa: F401 - re-exported: what callers import
    AudioTokenizerConfig,
    codec_version,
    is_audio_tokenizer_config,
    read_config,
)
from bestofn.moss.codec.layers import (
    Linear,
    Transformer,
    patch_down,
    patch_up,
    resolve_kernels,
)

log = logging.getLogger(__name__)

DTYPES = ("fp32", "bf16", "fp8")
_TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16}
_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float8": "fp8"}


def canonical_dtype(value, option: str = "codec_compute_dtype") -> str:
    name = _ALIASES.get(str(value).removeprefix("torch."), str(value).removeprefix("torch."))
    if name not in DTYPES:
        raise AudioTokenizerError(f"{option} is {value!r}; known: {', '.join(DTYPES)}")
    return name


def fp8_matmul_problem(device) -> str | None:
    """None when ``device`` runs ``torch._scaled_mm`` with row-wise float8_e4m3fn scales; else
    why not (one line)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return f"device {str(device)!r} is not a CUDA GPU"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    cap = torch.cuda.get_device_capability(dev)
    if cap < (8, 9):
        name = torch.cuda.get_device_name(dev)
        return f"{name} (compute capability {cap[0]}.{cap[1]}) has no fp8 matmuls (needs 8.9+)"
    try:
        a = torch.randn(32, 64, device=dev)
        w = torch.randn(48, 64, device=dev)
        y = Linear(w, "fp8", torch.bfloat16)(a)
        torch.cuda.synchronize(dev)
        if not torch.isfinite(y.float()).all():
            return "torch._scaled_mm gave non-finite values on a probe"
    except Exception as e:  # no kernel in this build / driver
        return f"torch._scaled_mm failed: {type(e).__name__}: {str(e).splitlines()[0]}"
    return None


def _to_host(x: torch.Tensor) -> torch.Tensor:
    """``x`` on the host. From a GPU through page-locked memory (torch's caching host
    allocator reuses the block call after call): a pageable copy of a batch's fp32 audio took a
    large share of the decode on an H200."""
    if x.device.type != "cuda":
        return x.cpu()
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x)
    return host


# ---- the codec ---------------------------------------------------------------------------


class MossAudioTokenizer:
    """MOSS-Audio-Tokenizer decode/encode, batched on one device (implements ``Codec``).

    ``n_vq``: codebooks decoded/encoded (default all); ``compute_dtype``/``weight_dtype``: see
    the module docstring; ``decode_batch_size``: clips per forward pass; ``kernels``: auto,
    eager or compiled (``bestofn.moss.codec.layers``; auto: compiled on CUDA where Triton
    imports). The encoder's weights are read on the first ``encode`` (a decode-only worker
    never holds them).
    """

    def __init__(
        self,
        codec_dir,
        device: str = "cpu",
        compute_dtype: str = "bf16",
        weight_dtype: str | None = None,
        n_vq: int | None = None,
        decode_batch_size: int = 64,
        kernels: str = "auto",
    ):
        self.codec_dir = Path(codec_dir).expanduser()
        self.raw_config, self.config = read_config(self.codec_dir)
        c = self.config
        self.sample_rate = c.sampling_rate
        self.hop = c.downsample_rate  # samples per frame and channel
        self.channels = c.channels
        self.version = c.version
        self.n_vq = c.num_quantizers if n_vq is None else int(n_vq)
        if not 1 <= self.n_vq <= c.num_quantizers:
            raise AudioTokenizerError(
                f"n_vq = {self.n_vq}, but {self.codec_dir / 'config.json'} has "
                f"num_quantizers = {c.num_quantizers}"
            )
        self.device = torch.device(device)
        self.decode_batch_size = max(1, int(decode_batch_size))
        compute = canonical_dtype(compute_dtype, "codec_compute_dtype")
        weights = canonical_dtype(weight_dtype or compute, "codec_weight_dtype")
        if compute == "fp8":
            why = fp8_matmul_problem(self.device)
            if why is not None:
                raise AudioTokenizerError(
                    f"codec_compute_dtype: fp8 needs a CUDA GPU with fp8 matmuls (compute "
                    f"capability 8.9+, e.g. H100/H200/L40S): {why}. Use codec_compute_dtype: "
                    "bf16 (or fp32); codec_weight_dtype: fp8 with codec_compute_dtype: bf16 "
                    "keeps fp8-stored weights, upcast per layer, on any device"
                )
            self.mode, self.dtype = "fp8", torch.bfloat16
        else:
            from bestofn.util.dtypes import resolve_dtype

            name = _TORCH[compute]
            if name != torch.float32:
                ops = ("linear", "attention", "layer_norm", "embedding")
                name = getattr(
                    torch, resolve_dtype("moss-audio-tokenizer", device, name, ops, "cast")
                )
            self.dtype = name
            self.mode = "fp8-upcast" if weights == "fp8" else "dense"
        self.compute_dtype, self.weight_dtype = compute, ("fp8" if compute == "fp8" else weights)
        try:
            self.kernels = resolve_kernels(kernels, self.device)
        except ValueError as e:
            raise AudioTokenizerError(str(e)) from None
        self._ck = Checkpoint(self.codec_dir)
        self._check_keys()
        self._load_quantizer()
        self.decoder = [
            Transformer(
                s, self._ck, f"decoder.{i}", self.mode, self.dtype, self.device, self.kernels
            )
            if s.kind == "transformer"
            else s.patch
            for i, s in enumerate(c.decoder)
        ]
        self.encoder = None

    # ---- loading ----

    def _check_keys(self) -> None:
        """Every stage's first weight present and shaped right, before reading the rest."""
        ck, c = self._ck, self.config
        q = "quantizer.quantizers"
        for i in range(c.num_quantizers):
            key = f"{q}.{i}.codebook.weight"
            check_shape(ck, need(ck, key), ck.get(key), (c.codebook_size, c.codebook_dim))
        for part, stages in (("encoder", c.encoder), ("decoder", c.decoder)):
            for i, s in enumerate(stages):
                if s.kind == "transformer" and s.layers:
                    last = f"{part}.{i}.transformer.layers.{s.layers - 1}"
                    need(ck, f"{last}.linear2.weight", f"{last}.ffn.2.weight")

    def _load_quantizer(self) -> None:
        """Decode tables: table[i, c] = output_proj(out_proj_i(codebook_i[c])) without the
        output bias, so decoding n codebooks is a sum of n gathered rows (+ bias); fp32."""
        ck, c = self._ck, self.config
        tables = []
        out_w = out_b = None
        if c.rvq_dim != c.quantizer_output_dim:
            out_w = weight_normed(ck, "quantizer.output_proj")
            shape = (c.quantizer_output_dim, c.rvq_dim)
            out_w = check_shape(ck, "quantizer.output_proj", out_w, shape)
            out_b = ck.get(need(ck, "quantizer.output_proj.bias"))
        for i in range(c.num_quantizers):
            p = f"quantizer.quantizers.{i}"
            e = ck.get(f"{p}.codebook.weight")
            if c.codebook_dim != c.rvq_dim:
                w = weight_normed(ck, f"{p}.out_proj")
                e = e @ check_shape(ck, f"{p}.out_proj", w, (c.rvq_dim, c.codebook_dim)).T
                e = e + ck.get(need(ck, f"{p}.out_proj.bias"))
            tables.append(e @ out_w.T if out_w is not None else e)
        self._tables = torch.cat(tables[: self.n_vq]).to(self.device)  # [n_vq * size, out]
        self._out_bias = (
            out_b.to(self.device)
            if out_b is not None
            else torch.zeros(tables[0].shape[1], device=self.device)
        )
        self._offsets = torch.arange(self.n_vq, device=self.device) * c.codebook_size

    def _load_encoder(self) -> None:
        ck, c = self._ck, self.config
        enc_dtype = torch.bfloat16 if self.mode == "fp8" else self.dtype
        self.encoder = [
            Transformer(s, ck, f"encoder.{i}", "dense", enc_dtype, self.device, "eager")
            if s.kind == "transformer"
            else s.patch
            for i, s in enumerate(c.encoder)
        ]
        in_w = None
        if c.quantizer_input_dim != c.rvq_dim:
            in_w = weight_normed(ck, "quantizer.input_proj")
            in_w = (in_w.to(self.device), ck.get("quantizer.input_proj.bias").to(self.device))
        qs = []
        for i in range(self.n_vq):
            p = f"quantizer.quantizers.{i}"
            e = ck.get(f"{p}.codebook.weight").to(self.device)
            proj_in = proj_out = None
            if c.codebook_dim != c.rvq_dim:
                proj_in = (
                    weight_normed(ck, f"{p}.in_proj").to(self.device),
                    ck.get(f"{p}.in_proj.bias").to(self.device),
                )
                proj_out = (
                    weight_normed(ck, f"{p}.out_proj").to(self.device),
                    ck.get(f"{p}.out_proj.bias").to(self.device),
                )
            qs.append((e, proj_in, proj_out))
        self._enc_quant = (in_w, qs)

    def stream_decoder(self, slots: int, mode: str | None = None):
        """An exact streaming decoder over ``slots`` requests (``bestofn.moss.codec.stream``;
        ``mode`` as there), kept: a later call for as many slots or fewer, in the same mode,
        gets the same one (its caches and graphs reused)."""
        from bestofn.moss.codec.stream import StreamDecoder

        have = getattr(self, "_stream", None)
        if have is None or have.slots < slots or (mode is not None and have.mode != mode):
            self._stream = None  # free the old caches before allocating the new ones
            self._stream = StreamDecoder(self, slots, mode)
        return self._stream

    def weight_bytes(self) -> int:
        """Bytes of the decode weights on the device (decoder Linear weights + code tables)."""
        n = self._tables.numel() * 4
        for s in self.decoder:
            if isinstance(s, Transformer):
                n += sum(lin.nbytes for lin in s.linears())
        return n

    # ---- decode ----

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, T, >= n_vq] -> the decoder's input [B, T, dim] fp32 on the device: the sum
        of each codebook's decoded entry (one gathered table row per code) + the output bias."""
        codes = codes[..., : self.n_vq].to(self.device, torch.long)
        self.check_codes(codes)
        return self.embed_codes(codes)

    def check_codes(self, codes: torch.Tensor) -> None:
        """Refuse codes [B, T, n] with fewer than n_vq codebooks or outside the codebook."""
        n = codes.shape[-1]
        if n < self.n_vq:
            raise AudioTokenizerError(
                f"codes have {n} codebooks, the codec decodes n_vq = {self.n_vq}"
            )
        size = self.config.codebook_size
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= size):
            raise AudioTokenizerError(
                f"codes outside 0..{size - 1} (codebook_size in {self.codec_dir / 'config.json'})"
            )

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """``embed`` of checked codes [B, T, n_vq] already on the device: no host sync (a CUDA
        graph captures it)."""
        B, T, n = codes.shape
        flat = (codes + self._offsets).reshape(B * T, n)
        x = F.embedding_bag(flat, self._tables, mode="sum") + self._out_bias
        return x.view(B, T, -1)

    @torch.inference_mode()
    def decode_padded(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, T, >= n_vq] (right-padded with any valid code) -> audio [B, T * hop,
        channels] fp32 on the device; sample ``t * hop + j`` depends only on frames ``<= t``."""
        B, T = codes.shape[:2]
        x = self.embed(codes)
        for stage in self.decoder:
            x = stage(x) if isinstance(stage, Transformer) else patch_up(x, stage)
        # the stages' one stream is the channels interleaved sample by sample: L0 R0 L1 R1 ...
        return x.reshape(B, T * self.hop, self.channels).float()

    def decode(self, codes: list[torch.Tensor]) -> list[np.ndarray]:
        """Code sequences [T_i, n_vq] -> float32 audio (T_i * hop, channels), batched by
        length; each clip trimmed to its own frames (padding never reaches a clip: causal)."""
        out: list[np.ndarray] = [np.zeros((0, self.channels), np.float32)] * len(codes)
        todo = sorted(
            (i for i, c in enumerate(codes) if c.shape[0] > 0), key=lambda i: codes[i].shape[0]
        )
        for start in range(0, len(todo), self.decode_batch_size):
            idx = todo[start : start + self.decode_batch_size]
            T = max(int(codes[i].shape[0]) for i in idx)
            grid = torch.zeros(len(idx), T, self.n_vq, dtype=torch.long)
            for b, i in enumerate(idx):
                c = torch.as_tensor(codes[i])
                if c.dim() != 2 or c.shape[1] < self.n_vq:
                    raise AudioTokenizerError(
                        f"clip {i}: codes of shape {tuple(c.shape)}; expected [T, {self.n_vq}]"
                    )
                grid[b, : c.shape[0]] = c[:, : self.n_vq]
            audio = _to_host(self.decode_padded(grid)).numpy()
            for b, i in enumerate(idx):
                n = int(codes[i].shape[0]) * self.hop
                out[i] = np.ascontiguousarray(audio[b, :n])
        return out

    # ---- encode ----

    @torch.inference_mode()
    def encode_padded(
        self, wav: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """wav [B, S] (mono) or [B, S, channels] at the codec rate (right-padded), lengths [B]
        samples per channel -> (codes [B, T, n_vq], code lengths [B]) as the published
        batch_encode computes them (T = S // hop, the last partial frame dropped)."""
        if self.encoder is None:
            self._load_encoder()
        c = self.config
        wav = wav.to(self.device, torch.float32)
        if wav.dim() == 2:
            wav = wav[:, :, None]
        if wav.shape[2] != c.channels:
            raise AudioTokenizerError(
                f"encode: audio has {wav.shape[2]} channel(s), the codec takes {c.channels}"
            )
        lengths = lengths.to(self.device)
        B, S = wav.shape[:2]
        if S % self.hop:
            wav = F.pad(wav, (0, 0, 0, self.hop - S % self.hop))
        x = wav.reshape(B, -1, 1)  # channels interleaved sample by sample into one stream
        lengths = lengths * c.interleave
        for stage in self.encoder:
            if isinstance(stage, Transformer):
                x = stage(x)
            else:
                x = patch_down(x, stage)
                lengths = lengths // stage
        z = x.float()
        B, T, _ = z.shape
        in_w, qs = self._enc_quant
        if in_w is not None:
            z = F.linear(z, *in_w)
        mask = (torch.arange(T, device=z.device)[None, :] < lengths[:, None])[..., None]
        residual = z
        codes = []
        for e, proj_in, proj_out in qs:
            r = residual * mask
            ze = F.linear(r, *proj_in) if proj_in is not None else r
            flat, cb = ze.reshape(-1, ze.shape[-1]), e
            if c.normalized_codes:
                flat, cb = F.normalize(flat), F.normalize(cb)
            dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ cb.T + cb.pow(2).sum(1)[None, :]
            idx = dist.argmin(dim=1).view(B, T)
            zq = F.embedding(idx, e)
            if proj_out is not None:
                zq = F.linear(zq, *proj_out)
            residual = residual - zq * mask
            codes.append(idx)
        return torch.stack(codes, dim=-1), lengths

    def encode(self, audio: np.ndarray, sample_rate: int) -> torch.Tensor:
        """One clip (S,) or (S, channels) at ``sample_rate`` -> codes [T, n_vq] (long, cpu), as
        the reference processors prepare a voice: a mono codec gets the channel mean, a stereo
        one a mono clip on both channels (or the first two channels); resampled to the codec
        rate; loudness-normalised to -20 dBFS within +-3 dB over all channels."""
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim == 1:
            audio = audio[:, None]
        if self.channels == 1:
            audio = audio.mean(axis=1, keepdims=True)
        elif audio.shape[1] == 1:
            audio = np.repeat(audio, self.channels, axis=1)
        else:
            audio = audio[:, : self.channels]
        if audio.shape[1] != self.channels:
            raise AudioTokenizerError(
                f"encode: audio has {audio.shape[1]} channels, the codec takes {self.channels}"
            )
        if sample_rate != self.sample_rate:
            import soxr

            audio = soxr.resample(audio, sample_rate, self.sample_rate).astype(np.float32)
        wav = torch.from_numpy(
            np.ascontiguousarray(audio, dtype=np.float32).reshape(-1, self.channels)
        )
        dbfs = 10.0 * torch.log10(wav.pow(2).mean() + 1e-9)
        wav = wav * 10.0 ** (float(torch.clamp(-20.0 - dbfs, -3.0, 3.0)) / 20.0)
        codes, lengths = self.encode_padded(wav[None], torch.tensor([wav.shape[0]]))
        return codes[0, : int(lengths[0])].cpu().long()

    def close(self) -> None:
        self._ck.close()
