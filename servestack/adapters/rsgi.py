"""granian's RSGI interface for the serving app: what `serve` runs on granian (servestack/adapters/realtime.py).

RSGI hands the app the request's headers as a mapping, its body as one `bytes`, and takes the answer in one
call: none of ASGI's per-request message dicts, `receive`/`send` round trips into the server, or header
lists rebuilt on both sides. On one core that is ~1.45x granian's ASGI ceiling (bench/servers.py measures
both), and the serving app is a few microseconds per request, so the interface is most of what is left.

The app itself stays ASGI (servestack/adapters/app.py; Lambda runs it under Mangum, uvicorn as it is). This adapter
answers the prediction routes by calling `ServingApp.answer_prediction` with the few headers it reads, and
every other route (ping, docs, the multi-model and Batch Transform routes) through the ASGI app with a full
ASGI scope, so there is one implementation of each route. Body limits and read deadlines are the app's
(servestack/adapters/body.py): a body with a declared length over the limit is refused before it is read, one without
(chunked) is read chunk by chunk so the limit can stop it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

# granian.rsgi re-exports these under other names, which mypy does not take as exports; _granian is typed.
from granian._granian import RSGIProtocolClosed

from servestack.adapters.app import TARGET_MODEL, WANTED_HEADERS, ServingApp
from servestack.adapters.body import (
    SPOOL_BYTES,
    ClientDisconnected,
    ReadDeadlines,
    RequestHeaders,
    SpooledBody,
    declared_size,
    drain_body,
    read_body,
    spool_body,
    too_large,
    too_slow,
)

if TYPE_CHECKING:
    from granian._granian import RSGIHTTPProtocol as HTTPProtocol
    from granian.rsgi import Scope

Message = MutableMapping[str, Any]

_DISCONNECT: Message = {"type": "http.disconnect"}


class RSGIApp:
    """The RSGI callable around one `ServingApp` (granian builds one per worker from the factory)."""

    def __init__(self, app: ServingApp) -> None:
        self.app = app

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.app.startup(loop)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.app.shutdown()

    async def __rsgi__(self, scope: Scope, protocol: HTTPProtocol) -> None:
        # A POST is HTTP (a websocket opens with a GET), so only other methods ask for the protocol: serve runs
        # granian without websockets, and each of scope's attributes is a call into granian.
        if scope.method == "POST":
            target = self.app.prediction_route(scope.path)
            if target is not False:
                headers = scope.headers
                exchange = _Exchange(protocol, headers)
                if TARGET_MODEL in headers and headers.get(TARGET_MODEL) is None:
                    await self.app.answer_prediction(_unreadable_target(headers), exchange, exchange, target)
                    return
                await self.app.answer_prediction(headers, exchange, exchange, target)
                return
        elif scope.proto != "http":
            return
        headers = scope.headers
        await self.app(asgi_scope(scope), _Receive(protocol, "content-length" in headers), _Send(protocol))


# What stands for a target-model value granian does not hand over: a name no model has, so the app refuses it
# as it refuses any other such name (400 naming the target model), as uvicorn's app does with the raw bytes.
UNREADABLE_VALUE = "\ufffd"


def _unreadable_target(headers: RequestHeaders) -> dict[str, str]:
    """The headers the app reads, with the target model's value replaced by `UNREADABLE_VALUE`. granian gives
    None for a header value that is not visible ASCII (a byte over 0x7f): the request would otherwise go to the
    default model, as if it named none."""
    readable = {name: value for name in WANTED_HEADERS if (value := headers.get(name)) is not None}
    return readable | {TARGET_MODEL: UNREADABLE_VALUE}


def asgi_scope(scope: Scope) -> Message:
    """The ASGI scope of an RSGI request, for the routes that run through the ASGI app."""
    host, _, port = scope.server.rpartition(":")
    client_host, _, client_port = scope.client.rpartition(":")
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": scope.http_version,
        "method": scope.method,
        "scheme": scope.scheme,
        "path": scope.path,
        "raw_path": _wire_bytes(scope.path),
        "query_string": _wire_bytes(scope.query_string),
        "root_path": "",
        "headers": [(name.encode("latin-1"), value.encode("latin-1")) for name, value in scope.headers.items()],
        "server": (host, int(port or 0)),
        "client": (client_host, int(client_port or 0)),
    }


# Every printable ASCII character but the space: what a request target carries as it is (`%` included, so an
# escape the client sent stays as sent).
_TARGET_ASCII = "".join(map(chr, range(0x21, 0x7F)))


def _wire_bytes(text: str) -> bytes:
    """A path or query string as ASGI's bytes. RSGI hands both over as `str`: the path percent-decoded (`%E2%82%AC`
    is `€`, `%FF` is U+FFFD), the query string as sent, though granian also takes raw UTF-8 bytes in either.
    ASCII, the usual target, is its own bytes; anything else is percent-encoded as UTF-8, as a client writes
    it (latin-1 cannot encode `€`: that was a 500 for `GET /%E2%82%AC`, where uvicorn answers 404)."""
    if text.isascii():
        return text.encode("ascii")
    return quote(text, safe=_TARGET_ASCII, errors="surrogatepass").encode("ascii")


class _Receive:
    """ASGI `receive` over an RSGI protocol: the whole body in one message when its length is declared (the
    app has checked it against the limit before the first call), else one message per chunk."""

    __slots__ = ("_chunks", "_declared", "_done", "_protocol")

    def __init__(self, protocol: HTTPProtocol, declared: bool) -> None:
        self._protocol = protocol
        self._declared = declared
        self._done = False
        self._chunks: AsyncIterator[bytes] | None = None

    async def __call__(self) -> Message:
        if self._done:
            return _DISCONNECT
        try:
            if self._declared:
                self._done = True
                return {"type": "http.request", "body": await self._protocol(), "more_body": False}
            if self._chunks is None:
                self._chunks = self._protocol.__aiter__()
            # `__anext__` itself: granian's body iterator brings its worker down under the builtin
            # `anext(iterator, default)` (granian 2.8).
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            self._done = True
            return {"type": "http.request", "body": b"", "more_body": False}
        except RSGIProtocolClosed:
            self._done = True
            return _DISCONNECT
        return {"type": "http.request", "body": chunk, "more_body": True}


class _Exchange:
    """A prediction request's body and answer over RSGI: one object per request, both the `BodySource`
    (servestack/adapters/body.py) and the `Respond` (servestack/adapters/app.py) of `answer_prediction`.

    A body of declared length within the limit is one `await protocol()`, under the same read deadline as
    ASGI's; everything else (no length, a length over the limit, a drain) goes through `read_body` /
    `drain_body` over `_Receive`, so the rules are ASGI's. The answer is one call, made at once (no coroutine:
    `Respond` may return None); granian adds Content-Length."""

    __slots__ = ("_headers", "_protocol")

    def __init__(self, protocol: HTTPProtocol, headers: RequestHeaders) -> None:
        self._protocol = protocol
        self._headers = headers  # only a drain asks it anything (whether the length was declared)

    async def read(
        self, limit: int, declared_length: str | None, deadlines: ReadDeadlines, *, expect_continue: bool = False
    ) -> bytes | SpooledBody:
        declared = declared_size(declared_length)
        if declared is None or declared > limit:
            receive = _Receive(self._protocol, declared_length is not None)
            return await read_body(receive, limit, declared_length, deadlines, expect_continue=expect_continue)
        if declared > SPOOL_BYTES:  # chunk by chunk to disk: granian would otherwise hold it twice (its copy, ours)
            return await spool_body(_Receive(self._protocol, False), limit, deadlines)
        task = deadlines.begin()
        try:
            body = await self._protocol()
        except asyncio.CancelledError:
            if deadlines.timed_out(task):
                raise too_slow(deadlines) from None
            raise
        except RSGIProtocolClosed:
            raise ClientDisconnected from None
        finally:
            deadlines.end(task)
        if len(body) > limit:  # the server holds a body to its declared length; this is the limit's last word
            raise too_large(limit, len(body))
        return body

    def drain(self, max_bytes: int, deadlines: ReadDeadlines) -> Awaitable[None]:
        return drain_body(_Receive(self._protocol, "content-length" in self._headers), max_bytes, deadlines)

    def __call__(
        self, status: int, body: bytes, content_type: bytes, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        if extra:
            headers = [("content-type", _text(content_type))]
            headers.extend((_text(name), _text(value)) for name, value in extra)
        else:  # the usual answer: one header list per content type, built once (granian only reads it)
            headers = _PLAIN_HEADERS.get(content_type) or _plain_headers(content_type)
        self._protocol.response_bytes(status, headers, body)


class _Send:
    """ASGI `send` over an RSGI protocol: a one-message body goes out in one `response_bytes`, a body in
    several messages as a stream."""

    __slots__ = ("_headers", "_protocol", "_status", "_stream")

    def __init__(self, protocol: HTTPProtocol) -> None:
        self._protocol = protocol
        self._status = 500
        self._headers: list[tuple[str, str]] = []
        self._stream: Any = None

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self._status = message["status"]
            self._headers = [
                (name.decode("latin-1"), value.decode("latin-1")) for name, value in message.get("headers", ())
            ]
        elif kind == "http.response.body":
            body = message.get("body", b"")
            if self._stream is None and not message.get("more_body", False):
                self._protocol.response_bytes(self._status, self._headers, body)
                return
            if self._stream is None:
                self._stream = self._protocol.response_stream(self._status, self._headers)
            if body:
                await self._stream.send_bytes(body)


def _text(value: bytes) -> str:
    """Header bytes as RSGI's str; the few content types and Retry-After values repeat, so each is decoded once."""
    found = _TEXT.get(value)
    if found is None:
        found = value.decode("latin-1")
        if len(_TEXT) < 256:
            _TEXT[value] = found
    return found


_TEXT: dict[bytes, str] = {}
_PLAIN_HEADERS: dict[bytes, list[tuple[str, str]]] = {}


def _plain_headers(content_type: bytes) -> list[tuple[str, str]]:
    headers = [("content-type", _text(content_type))]
    if len(_PLAIN_HEADERS) < 256:
        _PLAIN_HEADERS[content_type] = headers
    return headers
