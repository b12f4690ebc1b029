"""The FastAPI app shared by the SageMaker container (realtime.py) and Lambda (serverless.py).

SageMaker contract: `GET /ping`, `POST /invocations`. REST surface: `/v1/models...`. Every error is JSON
`{"error": {"type", "message", "field", "value", "allowed"}}` with the status its `ServingError` carries.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from models.errors import InternalError, InvalidInput, PayloadTooLarge, ServingError
from models.service import ModelRepository
from models.settings import ServingSettings

logger = logging.getLogger("servestack.handlers")

TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
BODY_TYPES = {
    "application/json": {"schema": {"type": "object", "example": {"instances": [[0.0] * 64]}}},
    "text/csv": {"schema": {"type": "string"}},
    "application/x-npy": {"schema": {"type": "string", "format": "binary"}},
}


class ORJSONResponse(Response):
    """JSON through orjson, numpy-aware (FastAPI deprecated its own orjson class)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


class PredictionResponse(BaseModel):
    """What a JSON prediction looks like (documentation only: responses are encoded by the core codecs)."""

    model: str
    version: str
    predictions: list[Any]
    probabilities: list[list[float]] | None = None
    labels: list[str] | None = None


class ErrorResponse(BaseModel):
    error: dict[str, Any]


def error_response(error: ServingError) -> ORJSONResponse:
    return ORJSONResponse({"error": error.to_dict()}, status_code=error.status_code)


async def read_body(request: Request, limit: int) -> bytes:
    """Read the body, refusing it as soon as it is known to be over `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"body of {declared} bytes is over the limit",
            field="body",
            value=int(declared),
            allowed=f"<= {limit} bytes",
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(
                "body is over the limit", field="body", value=f"> {limit} bytes", allowed=f"<= {limit} bytes"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(repository: ModelRepository, *, load_in_background: bool = False) -> FastAPI:
    """Build the app around a repository. With `load_in_background`, models load after start-up so that
    `/ping` answers 503 while they load (the container contract); otherwise the caller has loaded them."""
    settings: ServingSettings = repository.settings

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if load_in_background:
            threading.Thread(target=_load_quietly, args=(repository,), name="model-loader", daemon=True).start()
        yield

    app = FastAPI(
        title="servestack",
        summary="ONNX inference: the SageMaker container contract and a REST surface",
        version="0.1.0",
        lifespan=lifespan,
        default_response_class=ORJSONResponse,
    )
    error_docs: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorResponse} for code in (400, 404, 406, 413, 415, 503)
    }

    @app.exception_handler(ServingError)
    async def serving_error(_: Request, exc: ServingError) -> ORJSONResponse:
        if exc.status_code >= 500 and not exc.retryable:
            logger.error("%s: %s", exc.error_type, exc.message)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> ORJSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": ("request",), "msg": "invalid request"}
        where = ".".join(str(part) for part in first["loc"])
        return error_response(InvalidInput(f"{where}: {first['msg']}", field=where, value=first.get("input")))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> ORJSONResponse:
        return ORJSONResponse({"error": {"type": "HTTPError", "message": str(exc.detail)}}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> ORJSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return ORJSONResponse(
            {"error": {"type": "InternalError", "message": "internal error; see the server log"}},
            status_code=500,
        )

    @app.get("/ping", summary="Health check: 200 once every model is loaded and warmed")
    async def ping() -> ORJSONResponse:
        body: dict[str, Any] = {"status": repository.state}
        if repository.error:
            body["error"] = repository.error
        return ORJSONResponse(body, status_code=200 if repository.ready else 503)

    async def predict(request: Request, target: str | None) -> Response:
        model = repository.resolve(target)
        body = await read_body(request, settings.max_payload_bytes)
        try:
            encoded = model.infer(body, request.headers.get("content-type"), request.headers.get("accept"))
        except ServingError:
            raise
        except Exception as exc:
            # Never let a bug escape as an exception: under Mangum it would fail the whole invocation.
            logger.exception("unexpected failure in model %s", model.manifest.key)
            raise InternalError(f"model {model.manifest.key}: internal error; see the server log") from exc
        headers = {}
        if (attributes := request.headers.get(CUSTOM_ATTRIBUTES)) is not None:
            headers[CUSTOM_ATTRIBUTES] = attributes
        return Response(encoded.body, media_type=encoded.media_type, headers=headers)

    @app.post(
        "/invocations",
        summary="SageMaker inference: the default model, or the one in X-Amzn-SageMaker-Target-Model",
        openapi_extra={"requestBody": {"required": True, "content": BODY_TYPES}},
        responses={200: {"model": PredictionResponse}, **error_docs},
    )
    async def invocations(request: Request) -> Response:
        return await predict(request, request.headers.get(TARGET_MODEL))

    @app.get("/v1/models", summary="Every served model")
    async def list_models() -> dict[str, Any]:
        return {"models": [model.describe() for model in repository.models()]}

    @app.get("/v1/models/{name}", summary="One model's signature", responses={404: {"model": ErrorResponse}})
    async def describe_model(name: str) -> dict[str, Any]:
        return repository.resolve(name).describe()

    @app.post(
        "/v1/models/{name}/predict",
        summary="Predict with a model by name (`name` or `name@version`)",
        openapi_extra={"requestBody": {"required": True, "content": BODY_TYPES}},
        responses={200: {"model": PredictionResponse}, **error_docs},
    )
    async def predict_named(name: str, request: Request) -> Response:
        return await predict(request, name)

    return app


def _load_quietly(repository: ModelRepository) -> None:
    # The state and the error stay on the repository: /ping reports them and the log has them.
    with contextlib.suppress(ServingError):
        repository.load_all()
