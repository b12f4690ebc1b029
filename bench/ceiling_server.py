"""The ceiling of the HTTP stack: a raw ASGI app that answers every request with a constant.

Run: uvicorn bench.ceiling_server:app (the benchmark starts it on its own core).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

BODY = b'{"model":"digits","version":"1","predictions":[0]}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


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
