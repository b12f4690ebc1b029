"""The API Gateway HTTP APIs of a template, as local up serves them: each API and its routes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RouteDef:
    route_key: str  # "$default" or "POST /jobs"
    authorization: str  # NONE | AWS_IAM | JWT | CUSTOM
    function: str  # the integration's function name
    qualifier: str | None  # alias or version when the integration targets one
    timeout_ms: int
    payload_format: str


@dataclass(frozen=True)
class HttpApiDef:
    logical_id: str
    api_id: str
    arn: str  # execute-api ARN prefix: arn:aws:execute-api:region:account:apiId
    routes: tuple[RouteDef, ...]
