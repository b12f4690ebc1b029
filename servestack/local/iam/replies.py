"""Refusals shaped as each service sends them, so boto3 raises the same `ClientError` code as in the cloud.

How botocore reads an error (botocore/parsers.py) decides the shape:
- rest-xml (S3): `<Error><Code>` (a HEAD reply has no body: botocore then uses the status, `403`/`Forbidden`);
- query (SNS, STS, CloudWatch, SQS's old protocol): `<ErrorResponse><Error><Type/><Code/><Message/>`;
- JSON 1.0/1.1 (DynamoDB, CloudWatch Logs, EventBridge, SQS, CloudWatch): `{"__type": "...#Code"}`; services
  that moved from the query protocol (SQS, CloudWatch: `awsQueryCompatible`) also send
  `x-amzn-query-error: Code;Sender`, and botocore reports that code (`_do_query_compatible_error_parse`);
- RPC v2 CBOR (CloudWatch when the client picks it): the same members, CBOR-encoded;
- rest-json (Lambda, SageMaker Runtime, EventBridge Scheduler): the `x-amzn-ErrorType` header names the code.

Codes, statuses and wording, and where each was checked:
- S3: 403 `AccessDenied` with `User: {arn} is not authorized to perform: s3:GetObject on resource:
  "arn:aws:s3:::bucket/key" because no identity-based policy allows the s3:GetObject action` (the quoted
  resource: Amazon S3 User Guide, "Troubleshoot access denied (403 Forbidden) errors", message format for
  same-account requests); 403 `InvalidAccessKeyId`, 403 `SignatureDoesNotMatch`, 400 `InvalidToken`, 400
  `XAmzContentSHA256Mismatch`, 403 `AccessDenied` "Request has expired" (Amazon S3 API Reference, "Error
  responses"); an anonymous request that no bucket policy allows: 403 `AccessDenied` "Access Denied".
- SQS: `AccessDenied` (403), with the action lower-cased in the message: `... is not authorized to
  perform: sqs:sendmessage on resource: arn:aws:sqs:... because no identity-based policy allows the
  sqs:sendmessage action` (quoted from a boto3 SendMessageBatch denial in
  aws/serverless-application-model#3633).
- SNS: 403 `AuthorizationError`, action spelled `SNS:Publish` (public boto3 tracebacks:
  `AuthorizationError ... is not authorized to perform: SNS:Publish on resource: arn:aws:sns:...`).
- DynamoDB: 400 `com.amazon.coral.service#AccessDeniedException` with `Message` (public captures of the
  JSON body), `UnrecognizedClientException`, `InvalidSignatureException`,
  `MissingAuthenticationTokenException` (DynamoDB Developer Guide, "Error handling": common errors).
- CloudWatch: `AccessDenied`; an action on `*` has no "on resource" clause (public capture: `... is not
  authorized to perform: cloudwatch:PutMetricData because no identity-based policy allows the
  cloudwatch:PutMetricData action`).
- Lambda: 403 `AccessDeniedException`, `UnrecognizedClientException`, `InvalidSignatureException`,
  `MissingAuthenticationTokenException` (Lambda API reference, "Common errors").
- SageMaker Runtime: `AccessDeniedException` with `... is not authorized to perform:
  sagemaker:InvokeEndpoint on resource: arn:aws:sagemaker:{region}:{account}:endpoint/{name}` (quoted in
  philschmid/cdk-samples#2); 400, the status SageMaker's control plane sends for it (public Terraform
  captures); 403 `MissingAuthenticationTokenException` "Missing Authentication Token" for an unsigned call
  (quoted with its headers in aws/amazon-sagemaker-examples#290).
- execute-api, an HTTP API route with IAM authorization: 403 `{"message":"Forbidden"}` both for an
  unsigned request and for a signed caller without `execute-api:Invoke` (aws/aws-cdk#21182 shows the
  latter); a bad key or signature gets the SigV4 wording in `message`.
The local reply adds nothing AWS would not send, except for a call servestack did not recognise: its
message ends with `(servestack local: ...)` saying so.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from xml.sax.saxutils import escape

from servestack.local.hosting import Reply, request_id
from servestack.local.iam.canonical import Malformed
from servestack.local.iam.policy import Decision
from servestack.local.iam.sigv4 import MAX_SKEW, AuthFailure, Failure
from servestack.local.iam.wire import HttpRequest

INVALID_TOKEN_TEXT = "The security token included in the request is invalid."  # noqa: S105 - AWS's wording
SIGNATURE_TEXT = (
    "The request signature we calculated does not match the signature you provided. Check your AWS Secret "
    "Access Key and signing method. Consult the service documentation for details."
)
S3_SIGNATURE_TEXT = (
    "The request signature we calculated does not match the signature you provided. Check your key and signing method."
)
QUERY_NAMESPACES = {
    "sns": "http://sns.amazonaws.com/doc/2010-03-31/",
    "sts": "https://sts.amazonaws.com/doc/2011-06-15/",
    "monitoring": "http://monitoring.amazonaws.com/doc/2010-08-01/",
    "sqs": "http://queue.amazonaws.com/doc/2012-11-05/",
}
JSON_VERSIONS = {"dynamodb": "1.0", "sqs": "1.0", "monitoring": "1.0", "logs": "1.1", "events": "1.1"}
SKEW_TEXT = "The difference between the request time and the current time is too large."
SCOPE_FAILURES = frozenset({Failure.WRONG_REGION, Failure.WRONG_SERVICE})
QUERY_COMPATIBLE = frozenset({"sqs", "monitoring"})  # botocore's `awsQueryCompatible` services among ours


@dataclass(frozen=True)
class Refusal:
    """One refusal, before it is shaped: the query-protocol code, the JSON `__type`, the status per family."""

    query_code: str
    json_type: str
    message: str
    query_status: int = 403
    json_status: int = 400
    rest_status: int = 403


def protocol_of(service: str, request: HttpRequest) -> str:
    """`rest-xml`, `query`, `json`, `cbor`, `rest-json` or `execute-api` for a call to `service` (signing name)."""
    if service == "s3":
        return "rest-xml"
    if service == "execute-api":
        return "execute-api"
    if service in ("lambda", "sagemaker", "scheduler") and request.header("x-amz-target") is None:
        return "rest-json"
    if request.header("x-amz-target") is not None:
        return "json"
    if request.path.startswith("/service/") and "/operation/" in request.path:
        return "cbor"
    if service in ("dynamodb", "logs", "events"):
        return "json"
    return "query"


# ------------------------------------------------------------------------------------------ the shapes


def _xml(text: str) -> bytes:
    return ('<?xml version="1.0" encoding="UTF-8"?>\n' + text).encode()


def _s3(request: HttpRequest, status: int, code: str, message: str, **members: str) -> Reply:
    rid = request_id()
    headers = {"Content-Type": "application/xml", "x-amz-request-id": rid, "x-amz-id-2": rid}
    if request.method.upper() == "HEAD":  # S3 sends no body with a HEAD error
        return Reply(status, headers, b"")
    extra = "".join(f"<{name}>{escape(value)}</{name}>" for name, value in members.items())
    body = (
        f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>{extra}"
        f"<RequestId>{rid}</RequestId><HostId>{rid}</HostId></Error>"
    )
    return Reply(status, headers, _xml(body))


def _query(service: str, status: int, code: str, message: str) -> Reply:
    rid = request_id()
    namespace = QUERY_NAMESPACES.get(service, "")
    xmlns = f' xmlns="{namespace}"' if namespace else ""
    body = (
        f"<ErrorResponse{xmlns}><Error><Type>Sender</Type><Code>{code}</Code><Message>{escape(message)}</Message>"
        f"</Error><RequestId>{rid}</RequestId></ErrorResponse>"
    )
    return Reply(status, {"Content-Type": "text/xml", "x-amzn-RequestId": rid}, _xml(body))


def _json(service: str, status: int, json_type: str, query_code: str, message: str) -> Reply:
    rid = request_id()
    headers = {"Content-Type": f"application/x-amz-json-{JSON_VERSIONS.get(service, '1.0')}", "x-amzn-RequestId": rid}
    if service in QUERY_COMPATIBLE:
        headers["x-amzn-query-error"] = f"{query_code};Sender"
    member = "Message" if service == "dynamodb" else "message"
    body = json.dumps({"__type": f"com.amazon.coral.service#{json_type}", member: message}).encode()
    return Reply(status, headers, body)


def _cbor_text(text: str) -> bytes:
    data = text.encode()
    return _cbor_head(3, len(data)) + data


def _cbor_head(major: int, length: int) -> bytes:
    if length < 24:
        return bytes([major << 5 | length])
    if length < 0x100:
        return bytes([major << 5 | 24, length])
    if length < 0x10000:
        return bytes([major << 5 | 25]) + struct.pack(">H", length)
    return bytes([major << 5 | 26]) + struct.pack(">I", length)


def _cbor(service: str, status: int, json_type: str, query_code: str, message: str) -> Reply:
    """The RPC v2 CBOR error: a map of `__type` and `message` (the Smithy RPC v2 CBOR protocol)."""
    rid = request_id()
    members = {"__type": f"com.amazon.coral.service#{json_type}", "message": message}
    body = _cbor_head(5, len(members)) + b"".join(_cbor_text(key) + _cbor_text(value) for key, value in members.items())
    headers = {"Content-Type": "application/cbor", "smithy-protocol": "rpc-v2-cbor", "x-amzn-RequestId": rid}
    if service in QUERY_COMPATIBLE:
        headers["x-amzn-query-error"] = f"{query_code};Sender"
    return Reply(status, headers, body)


def _rest_json(status: int, code: str, message: str, *, member: str = "message") -> Reply:
    rid = request_id()
    headers = {"Content-Type": "application/json", "x-amzn-ErrorType": code, "x-amzn-RequestId": rid}
    body: dict[str, str] = {member: message}
    if member == "Message":  # Lambda's errors carry a Type member too (botocore's lambda service-2.json)
        body = {"Type": "User", "Message": message}
    return Reply(status, headers, json.dumps(body).encode())


def _execute_api(message: str) -> Reply:
    rid = request_id()
    headers = {"Content-Type": "application/json", "x-amzn-RequestId": rid, "apigw-requestid": rid}
    return Reply(403, headers, json.dumps({"message": message}).encode())


def _shape(service: str, request: HttpRequest, refusal: Refusal) -> Reply:
    protocol = protocol_of(service, request)
    # A service that moved from the query protocol keeps its query-protocol status codes.
    json_status = refusal.query_status if service in QUERY_COMPATIBLE else refusal.json_status
    if protocol == "json":
        return _json(service, json_status, refusal.json_type, refusal.query_code, refusal.message)
    if protocol == "cbor":
        return _cbor(service, json_status, refusal.json_type, refusal.query_code, refusal.message)
    if protocol == "rest-json":
        member = "Message" if service == "lambda" else "message"
        return _rest_json(refusal.rest_status, refusal.json_type, refusal.message, member=member)
    return _query(service, refusal.query_status, refusal.query_code, refusal.message)


# ------------------------------------------------------------------------------------------ access denied


def printed_action(action: str) -> str:
    """The action as the service spells it in its messages: SQS lower-cases it, SNS upper-cases its prefix."""
    prefix, _, name = action.partition(":")
    if prefix == "sqs":
        return action.lower()
    if prefix == "sns":
        return f"SNS:{name}"
    return action


def denial_message(caller_arn: str, decision: Decision, *, quote_resource: bool = False) -> str:
    action = printed_action(decision.action)
    resource = f'"{decision.resource}"' if quote_resource else decision.resource
    on = "" if decision.resource == "*" else f" on resource: {resource}"
    return f"User: {caller_arn} is not authorized to perform: {action}{on} {decision.aws_clause(action)}"


def access_denied(
    service: str, request: HttpRequest, caller_arn: str, decision: Decision, *, note: str = "", anonymous: bool = False
) -> Reply:
    """The reply to a request IAM denies (`service` is the signing name)."""
    suffix = f" (servestack local: {note})" if note else ""
    if service == "s3":
        message = "Access Denied" if anonymous else denial_message(caller_arn, decision, quote_resource=True)
        return _s3(request, 403, "AccessDenied", message + suffix)
    if service == "execute-api":
        return _execute_api("Forbidden")
    message = denial_message(caller_arn, decision) + suffix
    if service == "sns":
        return _query(service, 403, "AuthorizationError", message)
    statuses = {"lambda": 403, "sqs": 403, "monitoring": 403, "sts": 403}
    json_status = statuses.get(service, 400)
    refusal = Refusal(
        "AccessDenied", "AccessDeniedException", message, json_status=json_status, rest_status=json_status
    )
    if service == "sagemaker":
        refusal = Refusal("AccessDenied", "AccessDeniedException", message, json_status=400, rest_status=400)
    return _shape(service, request, refusal)


# ------------------------------------------------------------------------------------------ malformed requests


def malformed(service: str, request: HttpRequest, error: Malformed) -> Reply:
    """The reply to a request AWS refuses for its form (servestack/local/iam/canonical.py says which)."""
    if service == "s3":
        return _s3(request, error.s3_status, error.s3_code, error.message, **error.members)
    if service == "execute-api":
        return _execute_api(error.message)
    status = error.status
    refusal = Refusal(
        error.query_code, error.json_type, error.message, query_status=status, json_status=status, rest_status=status
    )
    return _shape(service, request, refusal)


# ------------------------------------------------------------------------------------------ authentication


def authentication_failed(service: str, request: HttpRequest, failure: AuthFailure) -> Reply:
    """The reply to a request whose credentials AWS would refuse before any policy is read."""
    kind = failure.failure
    if service == "s3":
        return _s3_authentication(request, failure)
    if service == "execute-api":
        if kind in (Failure.MISSING, Failure.MALFORMED, Failure.UNSUPPORTED):
            return _execute_api("Forbidden")
        if kind in (Failure.UNKNOWN_KEY, Failure.INVALID_TOKEN):
            return _execute_api(INVALID_TOKEN_TEXT)
        if kind is Failure.EXPIRED:
            return _execute_api("Signature expired")
        if kind in SCOPE_FAILURES:
            return _execute_api(failure.message)
        return _execute_api(SIGNATURE_TEXT)
    refusal = {
        Failure.MISSING: Refusal(
            "MissingAuthenticationToken",
            "MissingAuthenticationTokenException",
            "Missing Authentication Token"
            if protocol_of(service, request) == "rest-json"
            else "Request is missing Authentication Token",
        ),
        Failure.UNKNOWN_KEY: Refusal("InvalidClientTokenId", "UnrecognizedClientException", INVALID_TOKEN_TEXT),
        Failure.INVALID_TOKEN: Refusal("InvalidClientTokenId", "UnrecognizedClientException", INVALID_TOKEN_TEXT),
        Failure.BAD_SIGNATURE: Refusal("SignatureDoesNotMatch", "InvalidSignatureException", SIGNATURE_TEXT),
        Failure.CONTENT_SHA256_MISMATCH: Refusal("SignatureDoesNotMatch", "InvalidSignatureException", SIGNATURE_TEXT),
        Failure.EXPIRED: Refusal("AccessDenied", "AccessDeniedException", "Request has expired"),
        Failure.MALFORMED: Refusal(
            "IncompleteSignature", "IncompleteSignatureException", failure.message, query_status=400
        ),
        Failure.UNSUPPORTED: Refusal(
            "IncompleteSignature", "IncompleteSignatureException", failure.message, query_status=400
        ),
        Failure.HOST_NOT_SIGNED: Refusal(
            "IncompleteSignature", "IncompleteSignatureException", failure.message, query_status=400
        ),
        Failure.WRONG_REGION: Refusal("SignatureDoesNotMatch", "InvalidSignatureException", failure.message),
        Failure.WRONG_SERVICE: Refusal("SignatureDoesNotMatch", "InvalidSignatureException", failure.message),
        Failure.SKEWED: Refusal("SignatureDoesNotMatch", "InvalidSignatureException", failure.message),
    }[kind]
    return _shape(service, request, refusal)


def _s3_authentication(request: HttpRequest, failure: AuthFailure) -> Reply:
    kind = failure.failure
    key = {"AWSAccessKeyId": failure.access_key_id} if failure.access_key_id else {}
    if kind is Failure.MISSING:
        return _s3(request, 403, "AccessDenied", "Access Denied")
    if kind is Failure.UNKNOWN_KEY:
        return _s3(
            request,
            403,
            "InvalidAccessKeyId",
            "The AWS Access Key Id you provided does not exist in our records.",
            **key,
        )
    if kind is Failure.INVALID_TOKEN:
        return _s3(request, 400, "InvalidToken", "The provided token is malformed or otherwise invalid.")
    if kind is Failure.BAD_SIGNATURE:
        return _s3(request, 403, "SignatureDoesNotMatch", S3_SIGNATURE_TEXT, **key)
    if kind is Failure.EXPIRED:
        return _s3(request, 403, "AccessDenied", "Request has expired", **failure.details)
    if kind is Failure.CONTENT_SHA256_MISMATCH:
        return _s3(request, 400, "XAmzContentSHA256Mismatch", failure.message, **failure.details)
    if kind is Failure.UNSUPPORTED:
        return _s3(request, 400, "InvalidRequest", failure.message)
    if kind is Failure.HOST_NOT_SIGNED:
        return _s3(
            request, 403, "AccessDenied", "There were headers present in the request which were not signed",
            HeadersNotSigned="host",
        )  # fmt: skip
    if kind is Failure.SKEWED:
        return _s3(
            request, 403, "RequestTimeTooSkewed", SKEW_TEXT,
            RequestTime=failure.details["RequestTime"], ServerTime=failure.details["ServerTime"],
            MaxAllowedSkewMilliseconds=str(int(MAX_SKEW.total_seconds() * 1000)),
        )  # fmt: skip
    presigned = request.header("authorization") is None
    if kind in SCOPE_FAILURES:
        expected, scoped = failure.details["expected"], failure.details["scoped"]
        start = (
            "Error parsing the X-Amz-Credential parameter;" if presigned else "The authorization header is malformed;"
        )
        if kind is Failure.WRONG_REGION:
            message = f"{start} the region '{scoped}' is wrong; expecting '{expected}'"
            code = "AuthorizationQueryParametersError" if presigned else "AuthorizationHeaderMalformed"
            return _s3(request, 400, code, message, Region=expected)
        message = f"{start} incorrect service '{scoped}'. This endpoint belongs to '{expected}'."
        return _s3(
            request, 400, "AuthorizationQueryParametersError" if presigned else "AuthorizationHeaderMalformed", message
        )
    code = (
        "AuthorizationQueryParametersError"
        if request.header("authorization") is None
        else "AuthorizationHeaderMalformed"
    )
    return _s3(request, 400, code, failure.message)
