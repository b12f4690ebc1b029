"""The endpoint router's connections to one realtime child: a keep-alive HTTP/1.1 pool that reads each answer
by its own framing (servestack/local/sagemaker/router.py forwards through it)."""

from __future__ import annotations

import asyncio
import time


class UpstreamError(OSError):
    """A variant's answer could not be read as HTTP/1.1 (the connection it came on is closed, never reused)."""


class Upstream:
    """A keep-alive HTTP/1.1 connection pool to one realtime child (a general client costs more CPU than
    the child it calls).

    The request line is built from the caller's raw target, which `Router` has checked holds no control
    characters or spaces, so nothing a caller sends can end one request and start another on a pooled
    connection. A connection goes back to the pool only after an answer was read whole by its framing;
    one idle longer than IDLE_SEC (under uvicorn the child closes idle connections after 5 s) is not reused, and a
    pooled connection that fails before any answer (the child closed it meanwhile) is retried once, on a
    fresh connection."""

    IDLE_SEC = 2.0
    MAX_RESPONSE_BYTES = 64 * 1024 * 1024
    SLICE_BYTES = 1 << 20

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        self._host_header = f"Host: {host}:{port}\r\n".encode()

    def _pooled(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        now = time.monotonic()
        while self._idle:
            reader, writer, since = self._idle.pop()
            if now - since < self.IDLE_SEC and not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    async def request(
        self, method: str, target: str | bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        raw_target = target.encode("latin-1") if isinstance(target, str) else target
        head = [method.encode() + b" " + raw_target + b" HTTP/1.1\r\n", self._host_header]
        head += [name + b": " + value + b"\r\n" for name, value in headers]
        head.append(b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        pooled = self._pooled()
        while True:
            if pooled is not None:
                reader, writer = pooled
            else:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            try:
                await self._send(writer, b"".join(head), body)
                raw = await reader.readuntil(b"\r\n\r\n")
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                writer.close()
                if pooled is None:
                    raise
                pooled = None  # the child closed it while it was idle: once more, on a fresh connection
                continue
            break
        try:
            status, response_headers, payload, keep = await self._read_answer(method, reader, raw)
        except BaseException:
            writer.close()  # an answer not read to its end must never meet the next request
            raise
        if keep:
            self._idle.append((reader, writer, time.monotonic()))
        else:
            writer.close()
        return status, response_headers, payload

    async def _send(self, writer: asyncio.StreamWriter, head: bytes, body: bytes) -> None:
        """A small request in one write; a large one (an async endpoint's, up to 1 GB) in slices of the body,
        each sent before the next is handed over: one write of it all would copy what the socket did not take
        at once into the transport's buffer, a second copy of the body in this process."""
        if len(body) <= self.SLICE_BYTES:
            writer.write(head + body)
            return
        writer.write(head)
        view = memoryview(body)
        for start in range(0, len(body), self.SLICE_BYTES):
            writer.write(view[start : start + self.SLICE_BYTES])
            await writer.drain()

    async def _read_answer(
        self, method: str, reader: asyncio.StreamReader, raw: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        lines = raw.split(b"\r\n")
        status_line = lines[0]
        if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12 or not status_line[9:12].isdigit():
            raise UpstreamError(f"not an HTTP/1.1 status line: {status_line[:40]!r}")
        status = int(status_line[9:12])
        response_headers: list[tuple[bytes, bytes]] = []
        length, chunked, keep = None, False, status_line.startswith(b"HTTP/1.1")
        for line in lines[1:]:
            if not line:
                continue
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip()
            if name == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise UpstreamError(f"bad Content-Length {value[:20]!r}")
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = value.lower() == b"chunked"
                if not chunked:
                    raise UpstreamError(f"unsupported Transfer-Encoding {value[:20]!r}")
            elif name == b"connection" and value.lower() == b"close":
                keep = False
            response_headers.append((name, value))
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return status, response_headers, b"", keep
        if chunked:
            return status, response_headers, await self._read_chunked(reader), keep
        if length is not None:
            if length > self.MAX_RESPONSE_BYTES:
                raise UpstreamError(f"an answer of {length} bytes")
            return status, response_headers, await reader.readexactly(length), keep
        payload = await reader.read(self.MAX_RESPONSE_BYTES + 1)  # framed by the end of the connection
        if len(payload) > self.MAX_RESPONSE_BYTES or not reader.at_eof():
            raise UpstreamError("an answer without a length that does not end")
        return status, response_headers, payload, False

    async def _read_chunked(self, reader: asyncio.StreamReader) -> bytes:
        chunks: list[bytes] = []
        size_so_far = 0
        while True:
            size_line = (await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise UpstreamError(f"bad chunk size {size_line[:20]!r}") from None
            if size == 0:
                while (await reader.readuntil(b"\r\n")).strip():
                    pass  # trailer fields
                return b"".join(chunks)
            size_so_far += size
            if size_so_far > self.MAX_RESPONSE_BYTES:
                raise UpstreamError("a chunked answer over the response limit")
            chunks.append(await reader.readexactly(size))
            if await reader.readexactly(2) != b"\r\n":
                raise UpstreamError("a chunk longer than its size")

    def close(self) -> None:
        for _, writer, _ in self._idle:
            writer.close()
        self._idle.clear()
