"""A call as the IAM engine authorizes it: the operation it asks for, each check AWS makes, where it was made,
and the reading of a JSON, query or CBOR protocol request that every family of operations shares."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from servestack.local.iam.wire import HttpRequest

ContextValues = Mapping[str, str | tuple[str, ...]]


@dataclass(frozen=True)
class Check:
    """One authorization AWS makes for a call."""

    action: str
    resource: str
    context: ContextValues = field(default_factory=dict)


@dataclass(frozen=True)
class Operation:
    """What a request asks for: the operation and the checks it needs."""

    service: str  # the IAM service prefix (`cloudwatch`, not `monitoring`)
    name: str  # the API operation (`GetObject`), or `UnknownOperation`
    checks: tuple[Check, ...]
    recognised: bool = True
    note: str = ""  # why the call was not recognised
    always_allowed: bool = False  # sts:GetCallerIdentity needs no permission
    # S3 DeleteObjects: S3 decides each key on its own and reports the denied ones in the 200 reply.
    delete_keys: tuple[tuple[str, str | None], ...] = ()
    bucket: str | None = None
    key: str | None = None


def unrecognised(service: str, name: str | None, note: str) -> Operation:
    operation = name or "UnknownOperation"
    return Operation(service, operation, (Check(f"{service}:{operation}", "*"),), recognised=False, note=note)


@dataclass(frozen=True)
class Where:
    """The region (from the credential scope) and account the request's ARNs are built in."""

    region: str
    account: str


# ------------------------------------------------------------------------------------------ JSON and query protocols


def json_body(request: HttpRequest) -> dict[str, Any]:
    if not request.body:
        return {}
    try:
        parsed = json.loads(request.content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def target_operation(request: HttpRequest, prefix: str) -> str | None:
    target = request.header("x-amz-target") or ""
    service, _, operation = target.partition(".")
    return operation if service == prefix and operation else None


def rpc_call(request: HttpRequest, target_prefix: str) -> tuple[str | None, dict[str, Any], str]:
    """(operation, parameters, protocol) of a call in the JSON protocol (X-Amz-Target), the query protocol
    (`Action=`) or the RPC v2 CBOR protocol (`/service/<Service>/operation/<Op>`)."""
    operation = target_operation(request, target_prefix)
    if operation is not None:
        return operation, json_body(request), "json"
    cbor = re.fullmatch(r"/service/[^/]+/operation/([A-Za-z0-9]+)", request.path)
    if cbor:
        return cbor.group(1), _cbor_body(request.content), "cbor"
    params: dict[str, Any] = dict(request.form)
    return params.get("Action"), params, "query"


def _cbor_body(body: bytes) -> dict[str, Any]:
    """A CBOR request body, decoded by botocore's CBOR reader (the one it uses for responses)."""
    if not body:
        return {}
    from botocore.parsers import RpcV2CBORParser

    parser = RpcV2CBORParser()
    try:
        decoded = parser.parse_data_item(parser.get_peekable_stream_from_bytes(body))
    except Exception:  # a malformed body: the operation is still known, its parameters are not
        return {}
    return decoded if isinstance(decoded, dict) else {}
