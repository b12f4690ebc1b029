"""SigV4 as AWS checks it, beyond the signature itself: the credential scope names the endpoint's region and
service, `host` is signed, and the request time is within 15 minutes of the server's clock.

Requests are signed by botocore's own signers and handed to the enforcer as a server receives them; the
answers are the ones each service sends (S3's XML, the query protocol's ErrorResponse, JSON `__type`).
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest.mock import patch

import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from servestack.local.hosting.http_server import Reply
from servestack.local.iam import IamEnforcer, IdentityStore
from servestack.local.iam.wire import HttpRequest

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
ENDPOINT = "http://127.0.0.1:4566"
S3_URL = f"{ENDPOINT}/jobs/in/a"
LAMBDA_URL = f"{ENDPOINT}/2015-03-31/functions/fn/invocations"
SQS_BODY = b"Action=ListQueues&Version=2012-11-05"
DYNAMODB_BODY = b"{}"


class UnsignedHostSigV4(SigV4Auth):  # type: ignore[misc]  # botocore is untyped
    """botocore's signer with `host` left out of the signed headers (no SDK does this; a hand-made client may)."""

    def headers_to_sign(self, request: AWSRequest) -> Any:
        headers = super().headers_to_sign(request)
        del headers["host"]
        return headers


class UnsignedHostS3SigV4(S3SigV4Auth):  # type: ignore[misc]
    def headers_to_sign(self, request: AWSRequest) -> Any:
        headers = super().headers_to_sign(request)
        del headers["host"]
        return headers


def enforcer(clock: datetime = NOW) -> tuple[IamEnforcer, Credentials]:
    store = IdentityStore()
    developer = store.developer()
    return IamEnforcer(store, log=lambda line: None, clock=lambda: clock), Credentials(
        developer.access_key_id, developer.secret_access_key
    )


def signed(
    credentials: Credentials,
    service: str,
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    region: str = "us-east-1",
    at: datetime = NOW,
    without_host: bool = False,
) -> HttpRequest:
    """What the server receives for `url` signed at `at` for `service` in `region`."""
    request = AWSRequest(method="POST" if service != "s3" else "GET", url=url, data=body, headers=dict(headers))
    if service == "s3":
        request.headers["X-Amz-Content-SHA256"] = hashlib.sha256(body).hexdigest()
        signer: Any = (UnsignedHostS3SigV4 if without_host else S3SigV4Auth)(credentials, service, region)
    else:
        signer = (UnsignedHostSigV4 if without_host else SigV4Auth)(credentials, service, region)
    with patch("botocore.auth.get_current_datetime", lambda: at.replace(tzinfo=None)):  # the signer's clock
        signer.add_auth(request)
    split = urllib.parse.urlsplit(url)
    sent = {name.lower(): str(value) for name, value in request.headers.items()}
    sent.setdefault("host", split.netloc)
    return HttpRequest(request.method, split.path, split.query, sent, body)


REQUESTS: dict[str, tuple[str, bytes, dict[str, str], str | None]] = {
    # service -> (url, body, headers, the front's service hint or None for the emulator's port)
    "s3": (S3_URL, b"", {}, None),
    "sqs": (f"{ENDPOINT}/", SQS_BODY, {"Content-Type": "application/x-www-form-urlencoded"}, None),
    "dynamodb": (
        f"{ENDPOINT}/",
        DYNAMODB_BODY,
        {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "DynamoDB_20120810.ListTables"},
        None,
    ),
    "lambda": (LAMBDA_URL, b"{}", {"Content-Type": "application/json"}, "lambda"),
}


def answer(engine: IamEnforcer, service: str, request: HttpRequest) -> Reply | None:
    hint = REQUESTS[service][3]
    verdict = engine.evaluate_request(request, service_hint=hint)
    return verdict.reply


def code_of(service: str, reply: Reply) -> tuple[int, str, str]:
    """(status, code, message) as botocore would read them."""
    body = reply.body.decode()
    if service in ("s3", "sqs"):
        code = body.split("<Code>", 1)[1].split("</Code>", 1)[0]
        message = body.split("<Message>", 1)[1].split("</Message>", 1)[0]
        return reply.status, code, message
    if service == "lambda":
        return reply.status, reply.headers["x-amzn-ErrorType"], json.loads(body)["Message"]
    parsed = json.loads(body)
    return reply.status, parsed["__type"].rsplit("#", 1)[-1], parsed.get("Message") or parsed.get("message", "")


@pytest.mark.parametrize("service", list(REQUESTS))
def test_a_request_signed_for_the_endpoints_region_and_time_passes(service: str) -> None:
    engine, credentials = enforcer()
    url, body, headers, _ = REQUESTS[service]
    assert answer(engine, service, signed(credentials, service, url, body, headers)) is None


EXPECTED_REGION = {
    "s3": (
        400,
        "AuthorizationHeaderMalformed",
        "The authorization header is malformed; the region 'eu-west-1' is wrong; expecting 'us-east-1'",
    ),
    "sqs": (403, "SignatureDoesNotMatch", "Credential should be scoped to a valid region, not 'eu-west-1'. "),
    "dynamodb": (400, "InvalidSignatureException", "Credential should be scoped to a valid region, not 'eu-west-1'. "),
    "lambda": (403, "InvalidSignatureException", "Credential should be scoped to a valid region, not 'eu-west-1'. "),
}


@pytest.mark.parametrize("service", list(REQUESTS))
def test_a_signature_scoped_to_another_region_is_refused(service: str) -> None:
    engine, credentials = enforcer()
    url, body, headers, _ = REQUESTS[service]
    reply = answer(engine, service, signed(credentials, service, url, body, headers, region="eu-west-1"))
    assert reply is not None
    assert code_of(service, reply) == EXPECTED_REGION[service]
    if service == "s3":
        assert "<Region>us-east-1</Region>" in reply.body.decode()


def test_a_signature_scoped_to_another_service_is_refused_with_the_services_name() -> None:
    engine, credentials = enforcer()
    url, body, headers, _ = REQUESTS["lambda"]
    request = signed(credentials, "sagemaker", url, body, headers)
    reply = engine.evaluate_request(request, service_hint="lambda").reply
    assert reply is not None
    assert code_of("lambda", reply) == (
        403,
        "InvalidSignatureException",
        "Credential should be scoped to correct service: 'lambda'. ",
    )


EXPECTED_HOST = {
    "s3": (403, "AccessDenied", "There were headers present in the request which were not signed"),
    "sqs": (400, "IncompleteSignature", "'Host' or ':authority' must be a 'SignedHeader' in the AWS Authorization."),
    "dynamodb": (
        400,
        "IncompleteSignatureException",
        "'Host' or ':authority' must be a 'SignedHeader' in the AWS Authorization.",
    ),
    "lambda": (
        403,
        "IncompleteSignatureException",
        "'Host' or ':authority' must be a 'SignedHeader' in the AWS Authorization.",
    ),
}


@pytest.mark.parametrize("service", list(REQUESTS))
def test_a_signature_that_leaves_out_host_is_refused(service: str) -> None:
    engine, credentials = enforcer()
    url, body, headers, _ = REQUESTS[service]
    request = signed(credentials, service, url, body, headers, without_host=True)
    assert "host" not in request.header("authorization").split("SignedHeaders=", 1)[1].split(",", 1)[0].split(";")  # type: ignore[union-attr]
    reply = answer(engine, service, request)
    assert reply is not None
    assert code_of(service, reply) == EXPECTED_HOST[service]
    if service == "s3":
        assert "<HeadersNotSigned>host</HeadersNotSigned>" in reply.body.decode()


@pytest.mark.parametrize("service", list(REQUESTS))
@pytest.mark.parametrize("offset_min", [-16, 16])
def test_a_request_time_more_than_15_minutes_off_is_refused(service: str, offset_min: int) -> None:
    engine, credentials = enforcer()
    url, body, headers, _ = REQUESTS[service]
    at = NOW + timedelta(minutes=offset_min)
    reply = answer(engine, service, signed(credentials, service, url, body, headers, at=at))
    assert reply is not None
    status, code, message = code_of(service, reply)
    stamp = at.strftime("%Y%m%dT%H%M%SZ")
    if service == "s3":
        assert (status, code) == (403, "RequestTimeTooSkewed")
        assert message == "The difference between the request time and the current time is too large."
        assert f"<RequestTime>{stamp}</RequestTime>" in reply.body.decode()
        assert "<MaxAllowedSkewMilliseconds>900000</MaxAllowedSkewMilliseconds>" in reply.body.decode()
        return
    expected_code = {"sqs": "SignatureDoesNotMatch"}.get(service, "InvalidSignatureException")
    assert code == expected_code
    if offset_min < 0:
        assert (
            message == f"Signature expired: {stamp} is now earlier than 20261201T114500Z (20261201T120000Z - 15 min.)"
        )
    else:
        assert message == (
            f"Signature not yet current: {stamp} is still later than 20261201T121500Z (20261201T120000Z + 15 min.)"
        )


@pytest.mark.parametrize("service", list(REQUESTS))
def test_a_request_time_within_15_minutes_passes(service: str) -> None:
    engine, credentials = enforcer()
    url, body, headers, _ = REQUESTS[service]
    for offset in (-14, 14):
        at = NOW + timedelta(minutes=offset)
        assert answer(engine, service, signed(credentials, service, url, body, headers, at=at)) is None
