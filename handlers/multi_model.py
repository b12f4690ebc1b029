"""The multi-model API SageMaker calls on a `Mode: MultiModel` container (models/multi_model.py keeps the state).

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
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote

import orjson

from models.errors import InvalidInput, ServingError
from models.multi_model import MultiModelStore

if TYPE_CHECKING:
    from handlers.app import Receive, Scope, Send, ServingApp

PAGE_SIZE = 1000
MAX_LOAD_REQUEST_BYTES = 64 * 1024


class MultiModelRoutes:
    """The `/models` routes of one worker's `ServingApp`."""

    def __init__(self, app: ServingApp, store: MultiModelStore) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from handlers.app import _respond as respond
        from handlers.app import error_body

        method, parts = scope["method"], [unquote(p) for p in scope["path"].strip("/").split("/")]
        try:
            if parts == ["models"] and method == "GET":
                return await respond(send, 200, orjson.dumps(self.page(scope)), b"application/json")
            if parts == ["models"] and method == "POST":
                request = await self._json_body(receive)
                loaded = await asyncio.to_thread(self.store.load_model, request.get("model_name"), request.get("url"))
                return await respond(send, 200, orjson.dumps(loaded), b"application/json")
            if len(parts) == 2 and method == "GET":
                return await respond(send, 200, orjson.dumps(self.store.describe(parts[1])), b"application/json")
            if len(parts) == 2 and method == "DELETE":
                await asyncio.to_thread(self.store.unload, parts[1])
                return await respond(send, 200, orjson.dumps({"modelName": parts[1]}), b"application/json")
            if len(parts) == 3 and parts[2] == "invoke" and method == "POST":
                return await self.app._predict(scope, receive, send, parts[1])
            raise InvalidInput(
                f"{method} {scope['path']} is not a multi-model route",
                field="path",
                value=scope["path"],
                allowed="GET|POST /models, GET|DELETE /models/{name}, POST /models/{name}/invoke",
            )
        except ServingError as error:
            return await respond(send, error.status_code, error_body(error), b"application/json")

    def page(self, scope: Scope) -> dict[str, Any]:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        token = (query.get("next_page_token") or ["0"])[-1]
        start = int(token) if token.isdigit() else 0
        models = self.store.list_models()
        body: dict[str, Any] = {"models": models[start : start + PAGE_SIZE]}
        if start + PAGE_SIZE < len(models):
            body["nextPageToken"] = str(start + PAGE_SIZE)
        return body

    async def _json_body(self, receive: Receive) -> dict[str, Any]:
        from handlers.app import read_body

        raw = await read_body(receive, MAX_LOAD_REQUEST_BYTES, None)
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
