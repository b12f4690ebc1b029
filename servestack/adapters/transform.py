"""What SageMaker Batch Transform calls on the realtime container (`engine: transform` batch deployments).

    GET  /execution-parameters   200 {"MaxConcurrentTransforms", "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB"}
    POST /invocations            (in a transform job) a mini-batch of whole lines -> one JSON line per
                                 non-blank line: the row's response fields, or `{"error": {...}}` for a bad row

SageMaker sets `SAGEMAKER_BATCH=true` in the container of a transform job (and `SAGEMAKER_MAX_PAYLOAD_IN_MB`,
`SAGEMAKER_BATCH_STRATEGY`, `SAGEMAKER_MAX_CONCURRENT_TRANSFORMS`); that is what switches `/invocations` to
mini-batches of lines. A bad row answers an error line instead of failing its mini-batch: a failed mini-batch
fails its whole object, then the job. The step after the job (servestack/inference/tabular/transform.py `assemble`)
pairs answer lines with input lines and gathers the errors. The values `/execution-parameters` reports are those
the construct (servestack/cdk/batch.py) sets on the model, `SERVESTACK_TRANSFORM_*`, so that SageMaker, asking, gets
what the job was created with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any

import msgspec
import orjson

from servestack.adapters.body import ReadDeadlines, read_body
from servestack.inference.errors import ServingError
from servestack.inference.service import ServedModel
from servestack.inference.settings import EnvironmentSettings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MIB = 1024 * 1024
PREFIX = "SERVESTACK_TRANSFORM_"
JSON_LINES = b"application/jsonlines"


class TransformSettings(EnvironmentSettings, frozen=True, kw_only=True):
    """`SERVESTACK_TRANSFORM_*`, falling back to what SageMaker sets in a transform job's container."""

    batch: bool = False
    max_concurrent_transforms: Annotated[int, msgspec.Meta(ge=1, le=64)] = 2
    max_payload_mb: Annotated[int, msgspec.Meta(ge=1, le=100)] = 6

    @classmethod
    def aliases(cls) -> dict[str, tuple[str, ...]]:
        return {
            "batch": ("SAGEMAKER_BATCH",),
            "max_concurrent_transforms": ("SAGEMAKER_MAX_CONCURRENT_TRANSFORMS",),
            "max_payload_mb": ("SAGEMAKER_MAX_PAYLOAD_IN_MB",),
        }

    def execution_parameters(self) -> dict[str, Any]:
        """The body SageMaker expects from `GET /execution-parameters`."""
        return {
            "MaxConcurrentTransforms": self.max_concurrent_transforms,
            "BatchStrategy": "MULTI_RECORD",
            "MaxPayloadInMB": self.max_payload_mb,
        }


async def respond(send: Send, status: int, body: bytes, content_type: bytes = b"application/json") -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class TransformRoutes:
    """`/execution-parameters`, and `/invocations` while the container runs in a transform job."""

    def __init__(self, settings: TransformSettings, model: Callable[[], ServedModel], deadlines: ReadDeadlines) -> None:
        self.settings = settings
        self.model = model
        self.deadlines = deadlines

    async def execution_parameters(self, send: Send) -> None:
        await respond(send, 200, orjson.dumps(self.settings.execution_parameters()))

    async def invocations(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Imported here: the Lambda entry imports this module through servestack/adapters/app.py, and never runs a job.
        from servestack.inference.tabular.transform import media_type_of, score_lines

        headers = dict(scope["headers"])
        try:
            media_type = media_type_of(_text(headers.get(b"content-type")))
            body = await read_body(
                receive, self.settings.max_payload_mb * MIB, headers.get(b"content-length"), self.deadlines
            )
            # Decoding and inference hold the GIL for most of a mini-batch: off the loop, so /ping still answers.
            answer = await asyncio.to_thread(lambda: score_lines(self.model(), body, media_type))
        except ServingError as error:
            await respond(send, error.status_code, orjson.dumps({"error": error.to_dict()}))
            return
        await respond(send, 200, answer, JSON_LINES)


def _text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None
