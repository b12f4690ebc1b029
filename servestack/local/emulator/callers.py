"""Calling a running local up as one of its principals: the developer's keys (as its state file records them), a
boto3 session with them, and SigV4-signed HTTP requests, for the CLI commands (invoke, run-batch, put-input,
deploy, status) and local up's own calls to itself and its routers (`control`: local mode's own routes answer
only the developer's signature)."""

from __future__ import annotations

from typing import Any


def developer(about: dict[str, Any]) -> Any:
    from servestack.local.iam import DEVELOPER, Credentials

    keys = about.get("developer")
    if not isinstance(keys, dict):  # a state file that records none: the documented default keys
        return DEVELOPER
    return Credentials.from_dict(keys)


def sagemaker_runtime(about: dict[str, Any]) -> Any:
    import boto3
    from botocore.config import Config

    keys = developer(about)
    session = boto3.session.Session(
        aws_access_key_id=keys.access_key_id,
        aws_secret_access_key=keys.secret_access_key,
        region_name=about.get("region", "us-east-1"),
    )
    config = Config(retries={"mode": "standard", "max_attempts": 1}, read_timeout=960)
    return session, config


def signed(
    method: str,
    url: str,
    credentials: Any,
    region: str,
    *,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    service: str = "execute-api",
    timeout_sec: float = 60,
) -> tuple[int, bytes]:
    """An HTTP request signed with SigV4, as `aws`, the SDKs and `curl --aws-sigv4` sign it."""
    import httpx

    from servestack.signing import sigv4_headers

    sent = sigv4_headers(
        method, url, body, headers or {}, access_key_id=credentials.access_key_id,
        secret_access_key=credentials.secret_access_key, session_token=credentials.session_token,
        service=service, region=region,
    )  # fmt: skip
    response = httpx.request(method, url, content=body, headers=sent, timeout=timeout_sec)
    return response.status_code, response.content


def control(
    method: str, url: str, credentials: Any, region: str, body: Any = None, *, timeout_sec: float = 30
) -> tuple[int, Any]:
    """A call to one of local mode's own routes (`/_servestack/...`: an endpoint router's control port, local
    up's), which answer only the developer's signature: signed with `credentials` (the developer's), `body` sent
    as JSON; the status and the JSON answer. OSError when nothing answers."""
    import json

    import httpx

    data = b"" if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    try:
        status, content = signed(method, url, credentials, region, body=data, headers=headers,
                                 service="sagemaker", timeout_sec=timeout_sec)  # fmt: skip
    except httpx.TransportError as error:
        raise OSError(f"{method} {url}: {error}") from error
    try:
        answer = json.loads(content or b"{}")
    except ValueError:
        answer = {"error": {"message": content[:300].decode(errors="replace")}}
    return status, answer
