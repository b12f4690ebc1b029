"""The ceiling of the HTTP stack: a raw app that reads the request body and answers a constant, in the two
interfaces `serve` runs the serving app on: ASGI (`app`: uvicorn, or granian --interface asgi) and granian's
RSGI (`rsgi_app`: what `serve` runs on granian, servestack/adapters/rsgi.py).

Run: uvicorn bench.ceiling_server:app, or granian --interface rsgi bench.ceiling_server:rsgi_app (the
benchmark starts them on their own core).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from granian._granian import RSGIHTTPProtocol
    from granian.rsgi import Scope

BODY = b'{"model":"digits","version":"1","predictions":[0]}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
RSGI_HEADERS = [(name.decode(), value.decode()) for name, value in HEADERS]


async def app(
    scope: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:  # read the request body, as a real server must
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})


async def rsgi_app(scope: Scope, protocol: RSGIHTTPProtocol) -> None:
    await protocol()  # read the request body, as a real server must
    protocol.response_bytes(200, RSGI_HEADERS, BODY)
