"""A small threaded HTTP/1.1 server for local stand-ins of AWS APIs: one function turns a `Request` into a `Reply`.

The AWS API front of `local up` and the Lambda Invoke API of each function host are built on it. Keep-alive
works (boto3 pools its connections).

`BoundedRequestHandler.read_body` is the one body reader of every `http.server`-based front of local mode
(this server, and the API Gateway stand-in `HttpFront` in lambda_runtime.py): `Content-Length` or chunked
`Transfer-Encoding` (both at once is refused: it is how requests are smuggled past a proxy), at most
`max_body_bytes`, read within `body_timeout_sec`. A body over the limit is refused with 413 before it is
read; under `Expect: 100-continue` before the client sends it, otherwise after up to `DRAIN_BYTES` of it
have been read and thrown away, so that a client that sends its whole body before reading (urllib) sees the
413 rather than a reset connection. Every refusal closes the connection.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

logger = logging.getLogger("servestack.local")
HOP_BY_HOP = frozenset({"connection", "content-length", "transfer-encoding", "keep-alive"})
# Lambda's invocation payload limit (6 MB = 6,291,456 bytes, AWS Lambda quotas), which also bounds what API
# Gateway can hand a function.
MAX_BODY_BYTES = 6 * 1024 * 1024
BODY_TIMEOUT_SEC = 10.0
BACKLOG = 1024  # the listen queue (the kernel caps it at net.core.somaxconn)
# A refused body is read and thrown away up to this much, so the client sees the answer (see above).
DRAIN_BYTES = 16 * 1024 * 1024
_LENGTH = re.compile(r"[0-9]{1,18}")
_CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]{1,15}")
_READ_SIZE = 64 * 1024


class BodyRefused(Exception):
    """The request's body cannot be taken: `status` and `message` say why (400, 408, 413, 501)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BoundedRequestHandler(BaseHTTPRequestHandler):
    """A request handler whose body is read by `read_body` with a size limit and a deadline."""

    protocol_version = "HTTP/1.1"
    max_body_bytes: ClassVar[int] = MAX_BODY_BYTES
    body_timeout_sec: ClassVar[float] = BODY_TIMEOUT_SEC
    timeout = 120  # seconds a socket operation may wait: an idle keep-alive connection is closed after it

    def read_body(self) -> bytes:
        """The request body, or `BodyRefused`."""
        deadline = time.monotonic() + self.body_timeout_sec
        codings = [c.strip().lower() for v in self.headers.get_all("transfer-encoding", []) for c in v.split(",")]
        lengths = [value.strip() for value in self.headers.get_all("content-length", [])]
        if codings:
            if lengths:
                raise BodyRefused(400, "Content-Length and Transfer-Encoding together are refused")
            if codings != ["chunked"]:
                raise BodyRefused(501, f"Transfer-Encoding {', '.join(codings)!r} is not supported; use chunked")
            return self._read_chunked(deadline)
        if not lengths:
            return b""
        if len(set(lengths)) > 1 or not _LENGTH.fullmatch(lengths[0]):
            raise BodyRefused(400, f"Content-Length {', '.join(lengths)[:40]!r} is not a length in bytes")
        length = int(lengths[0])
        if length > self.max_body_bytes:
            if length <= self.max_body_bytes + DRAIN_BYTES:
                self._discard(length, deadline)
            raise self._too_large(length)
        return self._read_exactly(length, deadline)

    def handle_expect_100(self) -> bool:
        """Refuse an announced body over the limit before the client sends it; else let it come."""
        declared = self.headers.get("content-length", "").strip()
        if _LENGTH.fullmatch(declared) and int(declared) > self.max_body_bytes:
            self.refuse(self._too_large(int(declared)))
            return False
        return super().handle_expect_100()

    def refuse(self, refusal: BodyRefused) -> None:
        """Answer a refused body and close the connection (its framing can no longer be trusted)."""
        headers, body = self.refusal_reply(refusal)
        self.close_connection = True
        self.send_response(refusal.status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def refusal_reply(self, refusal: BodyRefused) -> tuple[dict[str, str], bytes]:
        """The headers and body of a refusal; fronts override this to speak their API's error format."""
        return {"Content-Type": "application/json"}, json.dumps({"message": refusal.message}).encode()

    def _too_large(self, length: int | None) -> BodyRefused:
        size = f"{length} bytes" if length is not None else "the body"
        return BodyRefused(413, f"Request Entity Too Large: {size} is over the {self.max_body_bytes}-byte limit")

    # ------------------------------------------------------------------------------------------ reading
    def _wait(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BodyRefused(408, f"the body did not arrive within {self.body_timeout_sec:g}s")
        self.connection.settimeout(remaining)

    def _read_some(self, most: int, deadline: float) -> bytes:
        """At most `most` bytes, with at most one read from the socket, before the deadline."""
        self._wait(deadline)
        try:
            data: bytes = self.rfile.read1(most)
        except TimeoutError:
            raise BodyRefused(408, f"the body did not arrive within {self.body_timeout_sec:g}s") from None
        finally:
            self.connection.settimeout(self.timeout)
        if not data:
            raise BodyRefused(400, "the connection closed before the whole body arrived")
        return data

    def _read_exactly(self, length: int, deadline: float) -> bytes:
        chunks: list[bytes] = []
        remaining = length
        while remaining:
            data = self._read_some(min(remaining, _READ_SIZE), deadline)
            chunks.append(data)
            remaining -= len(data)
        return b"".join(chunks)

    def _discard(self, length: int, deadline: float) -> None:
        try:
            while length > 0:
                length -= len(self._read_some(min(length, _READ_SIZE), deadline))
        except BodyRefused:
            return  # gone or too slow: the answer goes out anyway

    def _read_line(self, deadline: float, most: int = 4096) -> bytes:
        """One CRLF-terminated line of a chunked body, never reading past it."""
        line = b""
        while True:
            self._wait(deadline)
            try:
                buffered: bytes = self.rfile.peek(1)  # type: ignore[attr-defined]  # one socket read at most
            except TimeoutError:
                raise BodyRefused(408, f"the body did not arrive within {self.body_timeout_sec:g}s") from None
            finally:
                self.connection.settimeout(self.timeout)
            if not buffered:
                raise BodyRefused(400, "the connection closed inside a chunked body")
            end = buffered.find(b"\n")
            line += self.rfile.read(end + 1 if end >= 0 else len(buffered))
            if end >= 0:
                return line
            if len(line) > most:
                raise BodyRefused(400, "a line of the chunked body is too long")

    def _read_chunked(self, deadline: float) -> bytes:
        chunks: list[bytes] = []
        size_so_far = 0
        while True:
            line = self._read_line(deadline).rstrip(b"\r\n")
            size_text = line.split(b";", 1)[0].strip()  # chunk extensions are ignored
            if not _CHUNK_SIZE.fullmatch(size_text):
                raise BodyRefused(400, f"chunk size {size_text[:20]!r} is not hexadecimal")
            size = int(size_text, 16)
            if size == 0:
                for _ in range(64):  # trailer fields, then the empty line that ends the body
                    if not self._read_line(deadline).strip():
                        return b"".join(chunks)
                raise BodyRefused(400, "too many trailer fields")
            size_so_far += size
            if size_so_far > self.max_body_bytes:
                self._discard_chunks(size, deadline)
                raise self._too_large(None)
            chunks.append(self._read_exactly(size, deadline))
            if self._read_line(deadline).strip():
                raise BodyRefused(400, "a chunk is longer than its size says")

    def _discard_chunks(self, pending: int, deadline: float) -> None:
        """Throw away the rest of a chunked body over the limit (from a chunk of `pending` bytes on), up to
        DRAIN_BYTES and within the deadline."""
        drained = 0
        try:
            while pending and drained <= DRAIN_BYTES:
                self._discard(pending, deadline)
                drained += pending
                self._read_line(deadline)  # the CRLF that ends the chunk
                size_text = self._read_line(deadline).split(b";", 1)[0].strip()
                if not _CHUNK_SIZE.fullmatch(size_text):
                    return
                pending = int(size_text, 16)
            if not pending:
                for _ in range(64):
                    if not self._read_line(deadline).strip():
                        return
        except BodyRefused:
            return


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # percent-decoding is left to the route: an ARN's ':' and '/' arrive encoded
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    body: bytes
    raw_query: str = ""  # the query string as sent: SigV4 (servestack/local/iam) signs it encoded

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def request_id() -> str:
    return str(uuid.uuid4())


class QueuingHTTPServer(ThreadingHTTPServer):
    """A thread per connection, listening with a real backlog: socketserver's default of 5 drops the SYNs of a
    burst of callers while the accept thread is busy (their connects then stall for a second or time out)."""

    request_queue_size = BACKLOG
    daemon_threads = True


class LocalHttpServer:
    """`handle(request) -> Reply` on `host:port` (0: a free port), each connection on its own thread."""

    def __init__(
        self,
        name: str,
        handle: Callable[[Request], Reply],
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        max_body_bytes: int = 2 * MAX_BODY_BYTES,
        body_timeout_sec: float = BODY_TIMEOUT_SEC,
        too_large: Callable[[int], Reply] | None = None,
    ) -> None:
        self.name = name
        body_limit, body_deadline = max_body_bytes, body_timeout_sec

        class RequestHandler(BoundedRequestHandler):
            # Past the 6 MB the APIs behind it take (they answer with their own errors): bounded, not unlimited.
            max_body_bytes = body_limit
            body_timeout_sec = body_deadline

            def refusal_reply(self, refusal: BodyRefused) -> tuple[dict[str, str], bytes]:
                if refusal.status == 413 and too_large is not None:  # the front's own words for it
                    reply = too_large(int(self.headers.get("content-length") or 0) if self.headers else 0)
                    return reply.headers, reply.body
                kind = {400: "ValidationException", 408: "RequestTimeoutException", 413: "RequestTooLargeException"}
                headers = {"Content-Type": "application/json", "x-amzn-RequestId": request_id()}
                headers["x-amzn-ErrorType"] = kind.get(refusal.status, "ValidationException")
                return headers, json.dumps({"message": refusal.message}).encode()

            def _handle(self) -> None:
                try:
                    body = self.read_body()
                except BodyRefused as refusal:
                    self.refuse(refusal)
                    return
                split = urllib.parse.urlsplit(self.path)
                query = {k: v[-1] for k, v in urllib.parse.parse_qs(split.query, keep_blank_values=True).items()}
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    reply = handle(Request(self.command, split.path, query, headers, body, split.query))
                except Exception:
                    logger.exception("%s: failed on %s %s", name, self.command, self.path)
                    reply = Reply(500, {"Content-Type": "text/plain"}, b"internal error; see the local up log")
                self._send(reply)

            def _send(self, reply: Reply) -> None:
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(reply.body)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _handle  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("%s: " + format, name, *args)

        self.server = QueuingHTTPServer((host, port), RequestHandler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://{host}:{self.port}"
        self._thread: threading.Thread | None = None

    def serve_in_background(self) -> LocalHttpServer:
        self._thread = threading.Thread(target=self.server.serve_forever, name=f"http-{self.name}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:  # shutdown() waits for a serve_forever that must have started
            self.server.shutdown()
        self.server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
