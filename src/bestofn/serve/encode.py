"""mp3, Ogg Opus and AAC for `bestofn serve`, encoded here from the worker's streamed WAV, chunk
by chunk: LAME (mp3) and libopus through libsndfile (soundfile); AAC, which libsndfile lacks,
with FFmpeg's native encoder through PyAV, in ADTS frames (a stream format: no index, no tag).

- Streamed: each chunk's bytes are sent as soon as the encoder gives them. libsndfile writes
  files, not streams: on close it goes back to an mp3's first frame to fill in the LAME/Xing
  tag (frame count, encoder delay). A stream cannot be rewritten, so that first frame, a
  placeholder that carries no audio, is left out; decoders then read the frames as a stream
  (as from a radio), without the tag's gapless trim. An Ogg file is written front to back
  only.
- Sample rates: Opus takes 8, 12, 16, 24 or 48 kHz; mp3 (MPEG-1/2/2.5) the nine rates in
  ``MP3_RATES``; AAC those in ``AAC_RATES``. Audio at another rate is resampled to 48 kHz
  first (soxr, one stream per response). Resampling changes the sample rate, never the pitch
  or the duration.
- Mono or stereo, as the generator renders (both formats take at most 2 channels)."""

from __future__ import annotations

import numpy as np

FORMATS = ("mp3", "opus", "aac")
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg; codecs=opus", "aac": "audio/aac"}
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
AAC_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000)
AAC_FRAME = 1024  # samples per AAC frame: the encoder takes exactly this many at a time
FALLBACK_RATE = 48000
_LAYOUT = {"mp3": ("MP3", "MPEG_LAYER_III", MP3_RATES), "opus": ("OGG", "OPUS", OPUS_RATES)}


class _AppendOnly:
    """The file libsndfile writes into: bytes appended at the end are kept to be sent; a write
    that goes back over bytes already there (the mp3 tag on close) is dropped."""

    def __init__(self):
        self.data = bytearray()  # written, not yet taken
        self.end = 0  # bytes appended in all
        self.pos = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data) -> int:
        n = len(data)
        if self.pos == self.end:
            self.data += bytes(data)
            self.end += n
        self.pos += n
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else (self.pos + offset if whence == 1 else self.end)
        if whence == 2:
            self.pos += offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        return b""  # write-only: nothing is read back

    def take(self) -> bytes:
        out, self.data = bytes(self.data), bytearray()
        return out


def mp3_frame_length(header: bytes) -> int:
    """Bytes in the MPEG audio layer III frame whose 4-byte header this is."""
    if len(header) < 4 or header[0] != 0xFF or header[1] & 0xE0 != 0xE0:
        raise ValueError("not an MPEG audio frame header")
    version = (header[1] >> 3) & 3  # 3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5
    if (header[1] >> 1) & 3 != 1 or version == 1:
        raise ValueError("not an MPEG layer III frame")
    bitrate_index, rate_index = header[2] >> 4, (header[2] >> 2) & 3
    if bitrate_index in (0, 15) or rate_index == 3:
        raise ValueError("free-format or invalid MPEG frame")
    kbps = (
        (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320)
        if version == 3
        else (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)
    )[bitrate_index]
    rate = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}[version]
    padding = (header[2] >> 1) & 1
    return (144 if version == 3 else 72) * kbps * 1000 // rate[rate_index] + padding


class _AdtsWriter:
    """AAC in ADTS frames through PyAV: ``write(audio)`` with float32 (frames, channels)."""

    def __init__(self, sink: _AppendOnly, rate: int, channels: int):
        import av

        self._av = av
        self._layout = "mono" if channels == 1 else "stereo"
        self._container = av.open(sink, mode="w", format="adts")
        self._stream = self._container.add_stream("aac", rate=rate, layout=self._layout)
        self._fifo = av.AudioFifo()
        self._rate = rate

    def _encode(self, frame) -> None:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def write(self, audio: np.ndarray) -> None:
        planar = np.ascontiguousarray(audio.reshape(audio.shape[0], -1).T, dtype=np.float32)
        frame = self._av.AudioFrame.from_ndarray(planar, format="fltp", layout=self._layout)
        frame.sample_rate = self._rate
        self._fifo.write(frame)
        while self._fifo.samples >= AAC_FRAME:
            self._encode(self._fifo.read(AAC_FRAME))

    def close(self) -> None:
        rest = self._fifo.read()
        if rest is not None:
            self._encode(rest)
        self._encode(None)  # flush the encoder's look-ahead
        self._container.close()


class StreamEncoder:
    """float32 chunks at ``sample_rate`` (frames,) or (frames, channels) -> the bytes of one
    mp3, Ogg Opus or AAC stream, as they come. ``seconds``: the audio put in (before
    encoding)."""

    def __init__(self, fmt: str, sample_rate: int, channels: int):
        if fmt not in FORMATS:
            raise ValueError(f"format {fmt!r}; encoded here: {', '.join(FORMATS)}")
        if not 1 <= channels <= 2:
            raise ValueError(f"{fmt} takes 1 or 2 channels, not {channels}")
        rates = AAC_RATES if fmt == "aac" else _LAYOUT[fmt][2]
        self.fmt, self.in_rate, self.channels = fmt, int(sample_rate), int(channels)
        self.rate = self.in_rate if self.in_rate in rates else FALLBACK_RATE
        self._resampler = None
        if self.rate != self.in_rate:
            import soxr

            self._resampler = soxr.ResampleStream(
                self.in_rate, self.rate, self.channels, dtype="float32"
            )
        self._sink = _AppendOnly()
        if fmt == "aac":
            self._file = _AdtsWriter(self._sink, self.rate, self.channels)
        else:
            import soundfile as sf

            container, subtype, _ = _LAYOUT[fmt]
            self._file = sf.SoundFile(
                self._sink, "w", samplerate=self.rate, channels=self.channels,
                format=container, subtype=subtype,
            )  # fmt: skip
        self._skip: int | None = None if fmt == "mp3" else 0  # the mp3 tag frame, once known
        self._held = b""
        self.frames = 0  # input frames

    @property
    def seconds(self) -> float:
        return self.frames / self.in_rate

    def chunk(self, audio: np.ndarray) -> bytes:
        a = np.asarray(audio, dtype=np.float32)
        if a.ndim == 1 and self.channels == 2:
            raise ValueError("mono audio for a stereo stream")
        self.frames += a.shape[0]
        if self._resampler is not None:
            a = self._resampler.resample_chunk(a)
        if a.shape[0]:
            self._file.write(a)
        return self._take()

    def finish(self) -> bytes:
        if self._resampler is not None:
            shape = (0,) if self.channels == 1 else (0, self.channels)
            tail = self._resampler.resample_chunk(np.zeros(shape, np.float32), last=True)
            if tail.shape[0]:
                self._file.write(tail)
        self._file.close()
        return self._take() + self._held

    def _take(self) -> bytes:
        data = self._held + self._sink.take()
        self._held = b""
        if self._skip is None:  # mp3: the first frame is the tag's placeholder
            if len(data) < 4:
                self._held = data
                return b""
            self._skip = mp3_frame_length(data[:4])
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = data[dropped:]
        return data
