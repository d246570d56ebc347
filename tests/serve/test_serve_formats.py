"""OpenAI's response formats from `bestofn serve` (piper: 22.05 kHz mono): every format decoded
back, its duration checked against the WAV of the same request; mp3 is the default and streams;
and the mp3/Opus/AAC encoder alone: rates it must resample, the pitch kept."""

from __future__ import annotations

import base64
import http.client
import io
import json

import av
import numpy as np
import pytest
import soundfile as sf
from helpers import Server, make_project

from bestofn.serve.encode import StreamEncoder, mp3_frame_length

TEXT = "Good morning. The train leaves at nine. Please bring the tickets."


def decode_av(data: bytes) -> tuple[np.ndarray, int]:
    """All the frames of a stream, as a player reads them (no length from a header)."""
    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray() for f in container.decode(audio=0)]
        rate = container.streams.audio[0].codec_context.sample_rate
    return np.concatenate([f.reshape(f.shape[0], -1) for f in frames], axis=1), rate


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(make_project(tmp_path_factory.mktemp("formats")))
    yield srv
    srv.close()


def render(srv: Server, **fields) -> tuple[http.client.HTTPResponse, list[bytes]]:
    body = {"model": "bestofn", "voice": "calm", "input": TEXT, **fields}
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    conn.request("POST", "/v1/audio/speech", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})  # fmt: skip
    resp = conn.getresponse()
    chunks = []
    while part := resp.read1(1 << 16):
        chunks.append(part)
    conn.close()
    assert resp.status == 200, b"".join(chunks)
    return resp, chunks


@pytest.mark.slow
def test_every_format_decodes_to_the_same_duration(server):
    _, wav = render(server, response_format="wav")
    ref, rate = sf.read(io.BytesIO(b"".join(wav)), dtype="float32")
    assert rate == 22050 and ref.ndim == 1
    seconds = ref.shape[0] / rate
    assert seconds > 2.0

    resp, flac = render(server, response_format="flac")
    audio, r = sf.read(io.BytesIO(b"".join(flac)), dtype="float32")
    assert resp.getheader("Content-Type") == "audio/flac" and r == rate
    assert audio.shape == ref.shape

    resp, pcm = render(server, response_format="pcm")
    assert resp.getheader("X-Sample-Rate") == "24000"
    assert len(b"".join(pcm)) / 2 / 24000 == pytest.approx(seconds, abs=0.002)

    resp, opus = render(server, response_format="opus")
    assert resp.getheader("Content-Type") == "audio/ogg; codecs=opus"
    assert resp.getheader("X-Sample-Rate") == "48000"  # 22.05 kHz is no Opus rate: resampled
    audio, r = sf.read(io.BytesIO(b"".join(opus)), dtype="float32")
    assert r == 48000 and audio.shape[0] / r == pytest.approx(seconds, abs=0.01)
    audio, r = decode_av(b"".join(opus))
    assert audio.shape[1] / r == pytest.approx(seconds, abs=0.01)

    resp, aac = render(server, response_format="aac")
    assert resp.getheader("Content-Type") == "audio/aac" and len(aac) >= 2
    audio, r = decode_av(b"".join(aac))
    assert r == 22050 and seconds <= audio.shape[1] / r <= seconds + 0.15  # priming, padding

    # mp3 is the default, as OpenAI's: no response_format
    resp, mp3 = render(server)
    assert resp.getheader("Content-Type") == "audio/mpeg"
    assert len(mp3) >= 2, "mp3 streams: the first sentence's frames come before the last"
    audio, r = decode_av(b"".join(mp3))
    assert r == 22050
    # frames read as a stream: the encoder's delay and last frame's padding stay (no tag)
    assert seconds <= audio.shape[1] / r <= seconds + 0.15
    # the same audio: what the encoder did not change is the signal's loudness
    assert np.sqrt((audio**2).mean()) == pytest.approx(np.sqrt((ref**2).mean()), rel=0.1)


@pytest.mark.slow
def test_sse_carries_an_encoded_stream(server):
    _, wav = render(server, response_format="wav")
    seconds = sf.info(io.BytesIO(b"".join(wav))).frames / 22050
    resp, chunks = render(server, response_format="opus", stream_format="sse")
    events = [json.loads(x[6:]) for x in b"".join(chunks).decode().split("\n\n") if x]
    assert resp.getheader("Content-Type") == "text/event-stream"
    assert events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["audio_seconds"] == pytest.approx(seconds, abs=1e-3)
    opus = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    audio, r = sf.read(io.BytesIO(opus), dtype="float32")
    assert audio.shape[0] / r == pytest.approx(seconds, abs=0.01)


@pytest.mark.parametrize(("fmt", "rate", "encoded"),
                         [("opus", 22050, 48000), ("opus", 24000, 24000), ("mp3", 44100, 44100),
                          ("mp3", 96000, 48000), ("opus", 48000, 48000), ("aac", 22050, 22050),
                          ("aac", 7000, 48000)])  # fmt: skip
@pytest.mark.parametrize("channels", [1, 2])
def test_encoder_resamples_only_where_it_must_and_keeps_the_pitch(fmt, rate, encoded, channels):
    t = np.arange(int(rate * 1.5)) / rate
    tone = (0.4 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    audio = tone if channels == 1 else np.stack([tone, tone], axis=1)
    enc = StreamEncoder(fmt, rate, channels)
    assert enc.rate == encoded
    out = b"".join(enc.chunk(audio[i : i + 4000]) for i in range(0, audio.shape[0], 4000))
    out += enc.finish()
    assert enc.seconds == pytest.approx(1.5)
    decoded, r = decode_av(out)
    assert decoded.shape[0] == channels
    assert 1.5 <= decoded.shape[1] / r <= 1.5 + (0.01 if fmt == "opus" else 0.15)
    spectrum = np.abs(np.fft.rfft(decoded[0]))
    peak = np.fft.rfftfreq(decoded.shape[1], 1 / r)[spectrum.argmax()]
    assert peak == pytest.approx(440.0, abs=3.0)  # the rate changed, the pitch did not


def test_mp3_frame_length_from_its_header():
    assert mp3_frame_length(bytes([0xFF, 0xF3, 0x84, 0xC4])) == 192  # MPEG-2 64 kb/s 24 kHz
    assert mp3_frame_length(bytes([0xFF, 0xFB, 0x90, 0x64])) == 417  # MPEG-1 128 kb/s 44.1 kHz
    with pytest.raises(ValueError, match="not an MPEG"):
        mp3_frame_length(b"OggS")
