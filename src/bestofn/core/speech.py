"""Single renders for the speech service: batched, streamed, encoded.

``stream_batch(generator, specs)`` renders several requests (one ``GroupSpec`` of one take each)
in one call and yields audio chunks as they are produced: ``(index, audio, last)``, audio at
``generator.sample_rate``. A request's audio depends only on its own text, voice, settings and
seed, never on the batch it ran in (piper: per-take noise banks; moss-fast: counter-based
sampling), so the same request with the same seed gives the same audio alone or in a batch.

- piper renders sentence by sentence (``PiperGenerator.stream_batch``);
- moss-fast decodes codec frames in chunks as the engine produces them, and requests that
  arrive meanwhile join the running decode (continuous batching, ``bestofn.moss.stream``);
- any other generator renders each request whole (``generate``) and yields it as one chunk.

Encoders turn the chunks into response bytes: ``wav`` (16-bit PCM, streamed: the header says
"size unknown", 0xFFFFFFFF, as streamed WAV does), ``pcm`` (raw 16-bit little-endian mono at
24 kHz, OpenAI's ``pcm``; resampled chunk by chunk with one soxr stream) and ``flac`` (16-bit,
encoded once the whole render is there: not streamed)."""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from bestofn.util.spec import GroupSpec

FORMATS = ("wav", "flac", "pcm")  # served
REFUSED_FORMATS = ("mp3", "opus", "aac")  # OpenAI's others: no encoder here
STREAMED_FORMATS = ("wav", "pcm")  # flac is sent once complete
PCM_RATE = 24000  # OpenAI's pcm: 24 kHz, 16-bit signed little-endian, mono
CONTENT_TYPES = {"wav": "audio/wav", "flac": "audio/flac", "pcm": "audio/pcm"}

Chunk = tuple[int, np.ndarray, bool]  # (request index, audio, last chunk of that request)


@dataclass
class Feed:
    """Where a running render finds requests that arrived after it started (continuous
    batching; moss-fast only, other generators ignore it).

    ``take(n)``: up to ``n`` more requests (``GroupSpec``, one take each), never blocking; they
    get the indices after those already in the render, in the order returned. ``cancelled(i)``:
    request i's client left (its row is freed). ``max_batch``: requests decoding at once (the
    worker's ``runtime.speech_max_batch``; no default here, the schema holds it)."""

    take: Callable[[int], list[GroupSpec]]
    cancelled: Callable[[int], bool]
    max_batch: int


def stream_batch(generator, specs: list[GroupSpec], feed: Feed | None = None) -> Iterator[Chunk]:
    """Render ``specs`` (one take each) in one call, yielding chunks as they are produced.

    Every request gets exactly one chunk with ``last=True`` (possibly empty audio; with
    moss-fast, an exception instead of audio for a request that could not start: it fails
    alone, the worker answers it with that error). With a
    ``feed``, moss-fast takes in requests that arrive while it decodes (continuous batching);
    piper and the others render ``specs`` only (the caller batches what arrives meanwhile)."""
    for spec in specs:
        if spec.n_takes != 1:
            raise ValueError(f"speech renders one take per request, got n_takes={spec.n_takes}")
    own = getattr(generator, "stream_batch", None)
    if own is not None:
        yield from own(specs)
    elif getattr(generator, "feeds_while_decoding", False):
        from bestofn.moss.stream import stream_batch as moss_stream

        yield from moss_stream(generator, specs, feed)
    else:
        for i, spec in enumerate(specs):
            take = generator.generate(spec)[0]
            yield i, np.asarray(take.audio, dtype=np.float32), True


def to_int16(audio: np.ndarray) -> bytes:
    """float32 in [-1, 1], (frames,) or (frames, channels) -> interleaved s16le bytes."""
    a = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
    return (np.round(a * 32767.0)).astype("<i2").tobytes()


def wav_header(sample_rate: int, channels: int, data_bytes: int | None = None) -> bytes:
    """A 44-byte PCM16 WAV header; ``data_bytes=None``: size unknown (a streamed WAV)."""
    size = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    block = 2 * channels
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, 16)
        + b"data"
        + struct.pack("<I", size)
    )


class Encoder:
    """Chunks of float32 audio at ``sample_rate`` -> response bytes of one format.

    ``chunk()`` returns the bytes to send now (b"" for flac, which is sent by ``finish()``);
    ``rate`` and ``channels`` are those of the encoded audio (pcm: 24 kHz mono)."""

    def __init__(self, fmt: str, sample_rate: int, channels: int):
        if fmt not in FORMATS:
            raise ValueError(f"response_format {fmt!r}; served: {', '.join(FORMATS)}")
        self.fmt, self.in_rate = fmt, int(sample_rate)
        self.channels = 1 if fmt == "pcm" else int(channels)
        self.rate = PCM_RATE if fmt == "pcm" else self.in_rate
        self.frames = 0  # encoded frames so far
        self._started = False
        self._parts: list[np.ndarray] = []
        self._resampler = None
        if fmt == "pcm" and self.in_rate != PCM_RATE:
            import soxr

            self._resampler = soxr.ResampleStream(self.in_rate, PCM_RATE, 1, dtype="float32")

    @property
    def seconds(self) -> float:
        return self.frames / self.rate

    def _shape(self, audio: np.ndarray) -> np.ndarray:
        a = np.asarray(audio, dtype=np.float32)
        if self.fmt == "pcm" and a.ndim == 2:
            a = a.mean(axis=1, dtype=np.float32)
        return a

    def chunk(self, audio: np.ndarray) -> bytes:
        a = self._shape(audio)
        if self.fmt == "flac":
            if a.shape[0]:  # an empty chunk may lack the channel axis: nothing to join
                self._parts.append(a)
                self.frames += a.shape[0]
            return b""
        if self._resampler is not None:
            a = self._resampler.resample_chunk(a)
        self.frames += a.shape[0]
        head = b""
        if not self._started and self.fmt == "wav":
            head = wav_header(self.rate, self.channels)
        self._started = True
        return head + to_int16(a)

    def finish(self) -> bytes:
        if self.fmt == "flac":
            import soundfile as sf

            audio = np.concatenate(self._parts) if self._parts else np.zeros(0, np.float32)
            buf = io.BytesIO()
            sf.write(buf, audio, self.rate, format="FLAC", subtype="PCM_16")
            return buf.getvalue()
        tail = b""
        if self._resampler is not None:
            a = self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
            self.frames += a.shape[0]
            tail = to_int16(a)
        if not self._started and self.fmt == "wav":
            tail = wav_header(self.rate, self.channels) + tail
        self._started = True
        return tail


def bytes_to_seconds(fmt: str, n_bytes: int, sample_rate: int, channels: int) -> float:
    """Audio seconds in ``n_bytes`` of a wav (header included) or pcm response."""
    if fmt == "wav":
        n_bytes = max(0, n_bytes - 44)
    return n_bytes / (2 * max(1, channels) * max(1, sample_rate))
