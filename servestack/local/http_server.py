"""A small threaded HTTP/1.1 server for local stand-ins of AWS APIs: one function turns a `Request` into a `Reply`.

The AWS API front of `local up` and the Lambda Invoke API of each function host are built on it. Keep-alive
works (boto3 pools its connections); `Expect: 100-continue` is answered by the standard library.
"""

from __future__ import annotations

import logging
import threading
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

logger = logging.getLogger("servestack.local")
HOP_BY_HOP = frozenset({"connection", "content-length", "transfer-encoding", "keep-alive"})


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


class LocalHttpServer:
    """`handle(request) -> Reply` on `host:port` (0: a free port), each connection on its own thread."""

    def __init__(
        self,
        name: str,
        handle: Callable[[Request], Reply],
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        max_body_bytes: int | None = None,
        too_large: Callable[[int], Reply] | None = None,
    ) -> None:
        self.name = name

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if max_body_bytes is not None and length > max_body_bytes and too_large is not None:
                    self.close_connection = True  # the unread body must not be parsed as the next request
                    self._send(too_large(length))
                    return
                body = self.rfile.read(length) if length else b""
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

        self.server = ThreadingHTTPServer((host, port), RequestHandler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.url = f"http://{host}:{self.port}"
        self._thread: threading.Thread | None = None

    def serve_in_background(self) -> LocalHttpServer:
        self._thread = threading.Thread(target=self.server.serve_forever, name=f"http-{self.name}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
