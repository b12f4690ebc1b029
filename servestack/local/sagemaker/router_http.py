"""The endpoint router's HTTP details: the SageMaker headers it reads, forwards and returns, the raw target of
a request, and the bodies of its own refusals."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from servestack.inference.errors import InvalidInput
from servestack.local.sagemaker.backends import Backend

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

VARIANT_HEADER = b"x-amzn-invoked-production-variant"
TARGET_VARIANT = b"x-amzn-sagemaker-target-variant"
INFERENCE_COMPONENT = b"x-amzn-sagemaker-inference-component"
FORWARDED = {b"content-type", b"accept", b"x-amzn-sagemaker-target-model", b"x-amzn-sagemaker-custom-attributes"}
RETURNED = {b"content-type", b"retry-after", b"x-amzn-sagemaker-custom-attributes", b"x-amzn-errortype"}
ADMIN = "/_servestack/"
ROUTER_REFUSAL = b"x-amzn-errortype"  # on the router's own 429/502/503 only: `forward` strips a container's

JSON_HEADERS = [(b"content-type", b"application/json")]
# The router's own 403s (an admin route asked on the wrong port or unsigned): the code as AWS's REST-JSON
# services name it, which botocore reads.
REFUSAL_HEADERS = [*JSON_HEADERS, (ROUTER_REFUSAL, b"AccessDeniedException")]


def raw_target(scope: Scope) -> bytes:
    """The request target as the caller sent it (percent-encoding kept), refused when it holds a byte that
    could end the upstream request line (a space, CR, LF or another control character); the decoded `path`
    is never put on the wire (`%0D%0A` would become a line break in it)."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    query: bytes = scope.get("query_string", b"")
    target = raw + b"?" + query if query else raw
    if not target.startswith(b"/") or any(byte <= 0x20 or byte == 0x7F for byte in target):
        raise InvalidInput(
            "request target: holds a space or a control character",
            field="path",
            value=target[:80].decode("latin-1"),
            allowed="a path and query of visible ASCII characters, percent-encoded",
        )
    return target


def refusal_headers(error_type: str) -> list[tuple[bytes, bytes]]:
    """The headers of the router's own retryable refusal (429 shed, 502 variant unreachable, 503 variant
    restarting): a pause to take, and SageMaker's error code for it (`x-amzn-ErrorType`), by which local up's
    SageMaker front tells it from a container's own error (which it reports as a ModelError)."""
    return [(b"retry-after", b"1"), (ROUTER_REFUSAL, error_type.encode())]


def local_port(scope: Scope) -> int | None:
    """The port the request came in on (ASGI's `server`: the listening socket's address)."""
    server = scope.get("server")
    return int(server[1]) if server and len(server) > 1 and server[1] is not None else None


def admin_refusal(method: str, path: str) -> bytes:
    message = (
        "the router's admin routes answer only on its control port, which local up records in its state file for "
        "the CLI; this port serves inference requests"
    )
    error = {"type": "AccessDenied", "message": message, "field": "path", "value": f"{method} {path[:200]}",
             "allowed": "inference routes here; /_servestack/ routes on the control port"}  # fmt: skip
    return orjson.dumps({"message": message, "error": error})


def restarting_body(backend: Backend) -> bytes:
    """The refusal while a variant's container starts again: retryable (503 with Retry-After)."""
    message = f"variant {backend.name}: its container exited and is starting again; retry"
    return orjson.dumps({"error": {"type": "VariantRestarting", "message": message}})


def returned_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(name, value) for name, value in headers if name in RETURNED]


async def respond(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
