"""The multi-model API SageMaker calls on a `Mode: MultiModel` container (servestack/inference/multi_model.py keeps the
state).

    GET    /models                   200 {"models": [{"modelName", "modelUrl"}...]}  (`next_page_token`, page of 1000)
    POST   /models                   {"model_name", "url"}: 200 {"modelName", "modelUrl"}; 409 already loaded;
                                     507 over the memory budget; 400 a bad name or a url outside /opt/ml/models
    GET    /models/{model_name}      200 {"modelName", "modelUrl"}; 404 not loaded
    DELETE /models/{model_name}      200 {"modelName"}; 404 not loaded
    POST   /models/{model_name}/invoke   the prediction, as `/invocations` answers it; 404 not loaded

The bodies and status codes are those of the SageMaker developer guide ("Custom containers contract for
multi-model endpoints"). Errors are the usual JSON `{"error": {...}}`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs, unquote

import orjson

from servestack.inference.errors import InvalidInput, PayloadTooLarge, ServingError
from servestack.inference.multi_model import MultiModelStore

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# The app's prediction route for one model name (servestack/adapters/app.py `ServingApp._predict`).
Predict = Callable[[Scope, Receive, Send, str], Awaitable[None]]

PAGE_SIZE = 1000
MAX_LOAD_REQUEST_BYTES = 64 * 1024
# A page token is the position of the page's first model, as this module writes it.
PAGE_TOKEN = re.compile(r"[0-9]{1,18}")
# SageMaker's own limit on a model data URL; a `url` is a path under /opt/ml/models, far shorter in practice.
MAX_URL_CHARS = 1024
# What one path component may hold on Linux file systems (NAME_MAX, in bytes).
MAX_PATH_COMPONENT_BYTES = 255
_URL_ALLOWED = (
    f"an absolute path of at most {MAX_URL_CHARS} characters, no control characters, each part at most 255 bytes"
)


async def respond(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class MultiModelRoutes:
    """The `/models` routes of one worker's app; invocations go to its prediction route."""

    def __init__(self, store: MultiModelStore, predict: Predict) -> None:
        self.store = store
        self.predict = predict

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, parts = scope["method"], [unquote(p) for p in scope["path"].strip("/").split("/")]
        try:
            if parts == ["models"] and method == "GET":
                return await respond(send, 200, orjson.dumps(self.page(scope)))
            if parts == ["models"] and method == "POST":
                request = await self._json_body(receive)
                url = checked_url(request.get("url"))
                loaded = await asyncio.to_thread(self.store.load_model, request.get("model_name"), url)
                return await respond(send, 200, orjson.dumps(loaded))
            if len(parts) == 2 and method == "GET":
                return await respond(send, 200, orjson.dumps(self.store.describe(parts[1])))
            if len(parts) == 2 and method == "DELETE":
                await asyncio.to_thread(self.store.unload, parts[1])
                return await respond(send, 200, orjson.dumps({"modelName": parts[1]}))
            if len(parts) == 3 and parts[2] == "invoke" and method == "POST":
                return await self.predict(scope, receive, send, parts[1])
            raise InvalidInput(
                f"{method} {scope['path']} is not a multi-model route",
                field="path",
                value=scope["path"],
                allowed="GET|POST /models, GET|DELETE /models/{name}, POST /models/{name}/invoke",
            )
        except ServingError as error:
            return await respond(send, error.status_code, orjson.dumps({"error": error.to_dict()}))

    def page(self, scope: Scope) -> dict[str, Any]:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        token = (query.get("next_page_token") or ["0"])[-1]
        if not PAGE_TOKEN.fullmatch(token):
            shown = token if len(token) <= 40 else token[:37] + "..."
            raise InvalidInput(
                "next_page_token is not a token this container wrote",
                field="next_page_token",
                value=shown,
                allowed="the nextPageToken of the previous page (1-18 digits)",
            )
        start = int(token)
        models = self.store.list_models()
        body: dict[str, Any] = {"models": models[start : start + PAGE_SIZE]}
        if start + PAGE_SIZE < len(models):
            body["nextPageToken"] = str(start + PAGE_SIZE)
        return body

    async def _json_body(self, receive: Receive) -> dict[str, Any]:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise InvalidInput("the client went away before sending the load request", field="body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_LOAD_REQUEST_BYTES:
                raise PayloadTooLarge(
                    "the load request is over the limit", field="body", allowed=f"<= {MAX_LOAD_REQUEST_BYTES} bytes"
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        try:
            request = orjson.loads(raw)
        except orjson.JSONDecodeError:
            request = None
        if not isinstance(request, dict):
            raise InvalidInput(
                "the load request is not a JSON object", field="body", value=raw[:80].decode("latin-1"),
                allowed='{"model_name": "...", "url": "/opt/ml/models/<name>/model"}',
            )  # fmt: skip
        return request


def checked_url(url: object) -> object:
    """`url` refused with a 400 when no file system call could take it (a NUL, a control character, a path or a
    part of it past the system's limits: an OSError or ValueError later); the store then checks where it leads."""
    if not isinstance(url, str):
        return url  # the store refuses it, naming the field
    parts = url.split("/")
    if (
        len(url) > MAX_URL_CHARS
        or any(ord(char) < 32 or ord(char) == 127 for char in url)
        or any(len(part.encode("utf-8", "surrogatepass")) > MAX_PATH_COMPONENT_BYTES for part in parts)
    ):
        shown = url if len(url) <= 80 else url[:77] + "..."
        raise InvalidInput("url is not a usable path", field="url", value=shown, allowed=_URL_ALLOWED)
    return url
