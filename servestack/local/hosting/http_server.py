"""The one HTTP stack of local mode's fronts: an ASGI app served by uvicorn, into which each front plugs one
function that turns a `Request` into a `Reply`.

The AWS API front (SageMaker Runtime, Lambda Invoke, the SageMaker control plane calls local up answers), the
Lambda Invoke API of each function host, the HTTP API fronts and the API Gateway stand-in `HttpFront` are all
a `LocalHttpServer`. Keep-alive works (boto3 and httpx pool their connections).

Bodies are read by servestack/adapters/body.py's `read_body`, the reader of every ASGI front of the project (the
realtime container, the endpoint router): at most `max_body_bytes`, within `body_timeout_sec`. uvicorn frames
the request (Content-Length or chunked; both at once, or a Content-Length that is not a number, is its 400),
so no front parses chunked bodies itself. A body over the limit is 413 before it is read when its length is
declared (before the client sends it under `Expect: 100-continue`, otherwise after draining what the client
sends, so a client that writes its whole body before reading, as urllib does, sees the answer and not a
reset); a chunked one as soon as it passes the limit. A body that stalls is 408 at the deadline. Every
refusal closes the connection.

A front's `handle` is plain blocking code (it invokes functions, calls containers, asks IAM): it runs on a
thread of the server's own pool, so one slow call never holds up another, as with a thread per connection.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http
import json
import logging
import socket
import threading
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from servestack.adapters.body import ClientDisconnected, ReadDeadlines, read_asgi_body
from servestack.inference.errors import InvalidInput, ServingError
from servestack.local.hosting.processes import listening_port

logger = logging.getLogger("servestack.local")
HOP_BY_HOP = frozenset({"connection", "content-length", "transfer-encoding", "keep-alive"})
# Lambda's invocation payload limit (6 MB = 6,291,456 bytes, AWS Lambda quotas), which also bounds what API
# Gateway can hand a function.
MAX_BODY_BYTES = 6 * 1024 * 1024
BODY_TIMEOUT_SEC = 10.0
LISTEN_BACKLOG = 1024  # connections the kernel queues before they are accepted (a load test opens hundreds)
IDLE_KEEP_ALIVE_SEC = 120  # past the 5 s idle expiry of httpx's and urllib3's pools: the client closes first
MAX_THREADS = 256  # blocking handlers running at once, per server (a thread per connection before)

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # percent-decoding is left to the route: an ARN's ':' and '/' arrive encoded
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    body: bytes
    raw_query: str = ""  # the query string as sent: SigV4 (servestack/local/iam) signs it encoded
    source_ip: str = "127.0.0.1"

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def request_id() -> str:
    """The one request id of local mode's answers and refusals (`x-amzn-RequestId`, `apigw-requestid`)."""
    return str(uuid.uuid4())


def refusal(error: ServingError) -> Reply:
    """A body the front will not take (413, 408), in the JSON AWS's APIs answer with: `message` (which boto3
    and API Gateway clients read) and the field, value and limit."""
    kind = {408: "RequestTimeoutException", 413: "RequestTooLargeException"}.get(
        error.status_code, "ValidationException"
    )
    headers = {"Content-Type": "application/json", "x-amzn-RequestId": request_id(), "x-amzn-ErrorType": kind}
    phrase = http.HTTPStatus(error.status_code).phrase
    details = error.to_dict()
    message = f"{phrase}: {details['message']}" + (f" ({details['allowed']})" if "allowed" in details else "")
    return Reply(error.status_code, headers, json.dumps({"message": message, "error": details}).encode())


class _RememberingParser:
    """httptools' request parser, remembering why it could not read a request: uvicorn's own 400 says only
    that it could not."""

    def __init__(self, parser: Any, protocol: FrontProtocol) -> None:
        self._parser = parser
        self._protocol = protocol

    def feed_data(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._protocol.framing_error = str(error)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


class FrontProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools), whose refusal of a request it cannot frame (a Content-Length
    that is not a number, Content-Length with Transfer-Encoding, a bad chunk size) is JSON naming what is
    wrong, like every other refusal of the fronts."""

    framing_error = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parser = _RememberingParser(self.parser, self)  # type: ignore[assignment]

    def send_400_response(self, msg: str) -> None:
        why = self.framing_error or msg
        error = InvalidInput(
            f"the request cannot be read: {why}",
            field="request framing",
            value=why,
            allowed="a request line and headers as HTTP/1.1 has them, with one decimal Content-Length or "
            "Transfer-Encoding: chunked alone",
        )
        body = json.dumps({"message": error.message, "error": error.to_dict()}).encode()
        head = f"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        self.transport.write(head.encode() + b"connection: close\r\n\r\n" + body)
        self.transport.close()


class FrontApp:
    """The ASGI app of one front: read the body (bounded), run `handle` on the pool, send its reply."""

    def __init__(
        self,
        name: str,
        handle: Callable[[Request], Reply],
        *,
        max_body_bytes: int,
        body_timeout_sec: float,
        too_large: Callable[[int | str], Reply] | None = None,
    ) -> None:
        self.name = name
        self.handle = handle
        self.max_body_bytes = max_body_bytes
        self.too_large = too_large
        self.deadlines = ReadDeadlines(body_timeout_sec)
        self.pool = concurrent.futures.ThreadPoolExecutor(MAX_THREADS, thread_name_prefix=f"http-{name}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan is off; websockets are no front's
            return None
        raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
        try:
            body = await read_asgi_body(receive, raw_headers, self.max_body_bytes, self.deadlines)
        except ServingError as error:
            refused = self.too_large(error.value) if error.status_code == 413 and self.too_large else refusal(error)
            return await _send(send, refused, close=True)
        except ClientDisconnected:
            return None
        raw_query = scope["query_string"].decode("latin-1")
        client = scope.get("client")
        request = Request(
            scope["method"],
            scope["raw_path"].decode("latin-1") if scope.get("raw_path") else scope["path"],
            {k: v[-1] for k, v in urllib.parse.parse_qs(raw_query, keep_blank_values=True).items()},
            {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in raw_headers},
            body,
            raw_query,
            client[0] if client else "127.0.0.1",
        )
        reply = await asyncio.get_running_loop().run_in_executor(self.pool, self._answer, request)
        return await _send(send, reply)

    def _answer(self, request: Request) -> Reply:
        try:
            return self.handle(request)
        except Exception:
            logger.exception("%s: failed on %s %s", self.name, request.method, request.path)
            return Reply(500, {"Content-Type": "text/plain"}, b"internal error; see the local up log")


async def _send(send: Send, reply: Reply, *, close: bool = False) -> None:
    headers = [
        (key.encode("latin-1"), str(value).encode("latin-1"))
        for key, value in reply.headers.items()
        if key.lower() not in HOP_BY_HOP
    ]
    headers.append((b"content-length", str(len(reply.body)).encode()))
    if close:  # the request's framing can no longer be trusted
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body})


class LocalHttpServer:
    """`handle(request) -> Reply` on `host:port` (0: a free port), served by uvicorn on a thread of its own.
    The port is bound and listening once this returns; `serve_in_background` starts answering."""

    def __init__(
        self,
        name: str,
        handle: Callable[[Request], Reply],
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        # Past the 6 MB the APIs behind it take (they answer with their own errors): bounded, not unlimited.
        max_body_bytes: int = 2 * MAX_BODY_BYTES,
        body_timeout_sec: float = BODY_TIMEOUT_SEC,
        too_large: Callable[[int | str], Reply] | None = None,  # the front's own words for a 413
    ) -> None:
        import uvicorn

        self.name = name
        self.app = FrontApp(
            name, handle, max_body_bytes=max_body_bytes, body_timeout_sec=body_timeout_sec, too_large=too_large
        )
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, listening_port(port, host)))
        self.socket.listen(LISTEN_BACKLOG)
        self.port = int(self.socket.getsockname()[1])
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(
            self.app,
            http=FrontProtocol,
            log_config=None,  # leave the process's logging alone
            log_level="error",
            access_log=False,
            server_header=False,
            lifespan="off",
            proxy_headers=False,  # the peer is the caller: an X-Forwarded-For never stands in for aws:SourceIp
            backlog=LISTEN_BACKLOG,
            timeout_keep_alive=IDLE_KEEP_ALIVE_SEC,
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def serve_in_background(self) -> LocalHttpServer:
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, name=f"http-{self.name}", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.app.pool.shutdown(wait=False, cancel_futures=True)
        self.socket.close()
