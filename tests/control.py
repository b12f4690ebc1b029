"""Calls to local mode's own routes (an endpoint router's control port, local up's `/_servestack/...`), signed with
the developer's keys as the CLI signs them: those routes answer no one else (servestack/local/iam/control.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from servestack.local.iam import DEVELOPER
from servestack.signing import sigv4_headers

REGION = "us-east-1"
# What local up gives an endpoint's router: the developer's keys (it checks its control routes' signatures with them).
ROUTER_ENVIRONMENT = {**DEVELOPER.environment(), "AWS_DEFAULT_REGION": REGION}


def control(
    method: str,
    url: str,
    body: Any = None,
    *,
    timeout: float = 30,
    credentials: Any = DEVELOPER,
    service: str = "sagemaker",
) -> httpx.Response:
    """`method url` with `body` as JSON, signed with `credentials` (the developer's by default) for `service`."""
    data = b"" if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    signed = sigv4_headers(
        method, url, data, headers, access_key_id=credentials.access_key_id,
        secret_access_key=credentials.secret_access_key, session_token=credentials.session_token,
        service=service, region=REGION,
    )  # fmt: skip
    return httpx.request(method, url, content=data, headers=signed, timeout=timeout)
