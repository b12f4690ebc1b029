"""The FastAPI side of the app: the model listing routes, OpenAPI docs, and JSON errors for everything else.

Built on first use by `servestack.adapters.app.ServingApp`, which answers the hot routes before they reach FastAPI;
the predict routes here document them and serve the same pipeline when this app is mounted on its own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from servestack.adapters.body import ASGIBody, BodySource, RequestHeaders
from servestack.inference.cache import ModelCache
from servestack.inference.codecs import json_default
from servestack.inference.errors import InvalidInput, ServingError
from servestack.inference.multi_model import MultiModelStore
from servestack.inference.service import ModelRepository


class Serving(Protocol):
    """What the FastAPI side needs of the serving core (`servestack.adapters.app.ServingApp` is one); a protocol, so
    that this module never imports servestack/adapters/app.py, which imports it lazily."""

    repository: ModelRepository | ModelCache | MultiModelStore

    def ping(self) -> tuple[int, bytes]: ...

    async def answer_prediction(
        self, headers: RequestHeaders, source: BodySource, respond: Answer, name: str | None
    ) -> None: ...


class Answer:
    """The responder the documented prediction routes hand to `answer_prediction`: it keeps the answer as
    a FastAPI `Response`, status, headers and all, so these routes answer exactly as the hot ones do."""

    def __init__(self) -> None:
        self.response = Response(status_code=500)

    async def __call__(
        self, status: int, body: bytes, content_type: bytes, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in extra or ()}
        self.response = Response(body, status_code=status, media_type=content_type.decode(), headers=headers)


logger = logging.getLogger("servestack.handlers")

_ROWS = [[5.1, 3.5, "kew"], [6.7, 3.0, "edinburgh"]]  # a model with columns a, b, c (c a string)
BODY_TYPES = {
    "application/json": {
        "schema": {"type": "object"},
        "examples": {
            "instances": {"summary": "rows of a one-input tensor model", "value": {"instances": [[0.0] * 64]}},
            "inputs": {"summary": "tensors by input name", "value": {"inputs": {"input": [[0.0] * 64]}}},
            "dataframe_split": {
                "summary": "rows by column name (a model with columns)",
                "value": {"dataframe_split": {"columns": ["a", "b", "c"], "data": _ROWS}},
            },
            "dataframe_records": {
                "summary": "one object per row (`instances` of objects is the same)",
                "value": {"dataframe_records": [dict(zip("abc", row, strict=True)) for row in _ROWS]},
            },
            "inputs by column": {
                "summary": "one flat list per column",
                "value": {"inputs": {name: [row[i] for row in _ROWS] for i, name in enumerate("abc")}},
            },
        },
    },
    # A header row (`text/csv; header=present`, or a first row equal to the column names) maps columns by name.
    "text/csv": {"schema": {"type": "string"}, "example": "a,b,c\n5.1,3.5,kew\n"},
    "application/x-npy": {"schema": {"type": "string", "format": "binary"}},
}
HEADER_DOCS = [
    {"name": "X-Amzn-SageMaker-Target-Model", "in": "header", "required": False, "schema": {"type": "string"}},
    {"name": "X-Amzn-SageMaker-Custom-Attributes", "in": "header", "required": False, "schema": {"type": "string"}},
]


class JSONBody(Response):
    """JSON through orjson, numpy-aware."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY, default=json_default)


class PredictionResponse(BaseModel):
    """What a JSON prediction looks like (documentation only: the core codecs encode responses)."""

    model: str
    version: str
    predictions: list[Any]
    probabilities: list[list[float]] | None = None
    labels: list[str] | None = None


class ErrorResponse(BaseModel):
    error: dict[str, Any]


def create_fastapi(serving: Serving) -> FastAPI:
    repository = serving.repository
    app = FastAPI(
        title="servestack",
        summary="ONNX inference: the SageMaker container contract and a REST surface",
        version="0.1.0",
        default_response_class=JSONBody,
    )
    error_docs: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorResponse} for code in (400, 404, 406, 413, 415, 429, 503, 504)
    }

    @app.exception_handler(ServingError)
    async def serving_error(_: Request, exc: ServingError) -> JSONBody:
        return JSONBody({"error": exc.to_dict()}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONBody:
        first = exc.errors()[0] if exc.errors() else {"loc": ("request",), "msg": "invalid request"}
        where = ".".join(str(part) for part in first["loc"])
        error = InvalidInput(f"{where}: {first['msg']}", field=where, value=first.get("input"))
        return JSONBody({"error": error.to_dict()}, status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONBody:
        return JSONBody({"error": {"type": "HTTPError", "message": str(exc.detail)}}, status_code=exc.status_code)

    @app.get("/ping", summary="Health check: 200 once every model is loaded and warmed, 503 before")
    async def ping() -> Response:
        status, body = serving.ping()
        return Response(body, status_code=status, media_type="application/json")

    async def predict(request: Request, target: str | None) -> Response:
        answer = Answer()
        await serving.answer_prediction(request.headers, ASGIBody(request.receive), answer, target)
        return answer.response

    @app.post(
        "/invocations",
        summary="SageMaker inference: the default model, or the one in X-Amzn-SageMaker-Target-Model",
        openapi_extra={"requestBody": {"required": True, "content": BODY_TYPES}, "parameters": HEADER_DOCS},
        responses={200: {"model": PredictionResponse}, **error_docs},
    )
    async def invocations(request: Request) -> Response:
        return await predict(request, request.headers.get("x-amzn-sagemaker-target-model"))

    @app.get("/v1/models", summary="Every served model")
    async def list_models() -> dict[str, Any]:
        return {"models": [model.describe() for model in repository.models()]}

    @app.get("/v1/models/{name}", summary="One model's signature", responses={404: {"model": ErrorResponse}})
    async def describe_model(name: str) -> dict[str, Any]:
        return (await asyncio.to_thread(repository.resolve, name)).describe()  # a cache miss loads it

    @app.post(
        "/v1/models/{name}/predict",
        summary="Predict with a model by name (`name` or `name@version`)",
        openapi_extra={"requestBody": {"required": True, "content": BODY_TYPES}},
        responses={200: {"model": PredictionResponse}, **error_docs},
    )
    async def predict_named(name: str, request: Request) -> Response:
        return await predict(request, name)

    return app
