"""One speech request to the warm worker over its Unix socket, without blocking the event loop:
asyncio's stream for the socket and h11 (uvicorn's own HTTP/1.1 parser) as the client, so the
worker's chunked answer is parsed by a maintained state machine, not by our own framing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import h11

READ_SIZE = 1 << 16


class UpstreamBroken(Exception):
    """The worker's answer ended before its end (a cut stream, a bad frame)."""


class Upstream:
    """The worker's answer to one ``POST /v1/audio/speech``: ``status``, ``headers``, then
    ``body()`` / ``chunks()``. ``timeout``: seconds for any one read from the worker."""

    def __init__(self, reader, writer, timeout: float):
        self._reader, self._writer, self.timeout = reader, writer, timeout
        self._conn = h11.Connection(our_role=h11.CLIENT)
        self.status = 0
        self.headers: dict[str, str] = {}

    @classmethod
    async def post(cls, socket_path: str, body: dict, timeout: float) -> Upstream:
        """Send the request and read the answer's head. OSError: no worker listens there."""
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(socket_path), timeout)
        up = cls(reader, writer, timeout)
        try:
            payload = json.dumps(body).encode()
            head = h11.Request(
                method="POST", target="/v1/audio/speech",
                headers=[("Host", "worker"), ("Content-Type", "application/json"),
                         ("Content-Length", str(len(payload)))],
            )  # fmt: skip
            conn = up._conn
            writer.write(conn.send(head) + conn.send(h11.Data(data=payload)))
            writer.write(conn.send(h11.EndOfMessage()))
            await asyncio.wait_for(writer.drain(), timeout)
            event = await up._next()
            if not isinstance(event, h11.Response):
                raise UpstreamBroken(f"the worker answered {type(event).__name__}, no response")
            up.status = event.status_code
            up.headers = {k.decode().lower(): v.decode("latin-1") for k, v in event.headers}
            return up
        except BaseException:
            up.close()
            raise

    async def _next(self):
        while True:
            try:
                event = self._conn.next_event()
            except h11.RemoteProtocolError as e:
                raise UpstreamBroken(f"bad answer from the worker: {e}") from None
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await asyncio.wait_for(self._reader.read(READ_SIZE), self.timeout)
            except TimeoutError:
                raise UpstreamBroken(f"the worker sent nothing for {self.timeout:g} s") from None
            self._conn.receive_data(data)  # b"": the worker closed the socket

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive; UpstreamBroken if it stops before its end."""
        while True:
            event = await self._next()
            if isinstance(event, h11.Data):
                if event.data:
                    yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return
            else:
                raise UpstreamBroken("the worker's stream ended before its last chunk")

    async def body(self, limit: int = 1 << 20) -> bytes:
        out = bytearray()
        async for data in self.chunks():
            out += data
            if len(out) > limit:
                break
        return bytes(out[:limit])

    def close(self) -> None:
        """A client that left: closing the socket makes the worker's next write fail, and its
        render stops."""
        with contextlib.suppress(Exception):
            self._writer.close()
