"""One reading of a request: the form the enforcer authorizes and then forwards to moto, and nothing else.

moto reads requests more loosely than AWS: an SQS queue from the last `/` segment of a `QueueUrl` (so
`…/jobs?x=/dlq` is the dead-letter queue), or from the path when the parameters name none; the URL's query
string before the body; any dotted `Host` as a virtual-hosted bucket; the first of repeated parameters. An
enforcer that reads a request its own way and passes the original on authorizes one request and lets moto
run another. So every request to the emulator is first put in a canonical form (`canonical_request`):

- every service: each parameter once (repeated names in the query string, in a form body, or in both, are
  refused), the `Host` the emulator's own address;
- S3: path-style `/{bucket}/{key}`, the bucket taken from a `Host` of `<bucket>.<one of the emulator's host
  names>` or else from the path; a `Host` that is neither the emulator nor a bucket under it is refused as
  S3 refuses a host naming a bucket that does not exist (`NoSuchBucket`, the host as `BucketName`); no body
  on a GET, HEAD, DELETE or OPTIONS (S3 reads none; moto reads a form-typed one as parameters), and a PUT or
  POST whose body is a form or multipart form is refused (`NotImplemented`: moto would read it as parameters
  and store nothing);
- query protocol (SQS's old protocol, SNS, STS, CloudWatch): the parameters as one form body posted to `/`;
- JSON protocol (`X-Amz-Target`): `X-Amz-Target` of `<Prefix>.<Operation>` (one dot, an operation name of
  letters and digits), no query string, a JSON object without repeated keys, posted to `/` as the JSON the
  enforcer parsed, written anew (`json_wire`: `&` and `=` escaped, never empty, not compressed) under a JSON
  content type;
- query protocol: the parameters, `Action` among them, as one form body;
- RPC v2 CBOR (CloudWatch): the body as sent, with `?Action=<the path's operation>`;
- SQS: one queue, named by a `QueueUrl` of the form `{scheme}://{host}/{account}/{name}` (no query, no
  fragment; or a bare queue name, the caller's queue of that name) or by the path the query protocol may
  post to, not by both unless they agree; `QueueName` only where the operation takes it (CreateQueue,
  GetQueueUrl), or naming the same queue. The forwarded `QueueUrl` is rebuilt from the queue's account and
  name. A queue of another account does not exist locally (one account), nor one whose URL's AWS host
  names another region.

Why the JSON body is written anew, and the CBOR call gets a query string (issue 37, finding 1). moto 5.2's
`BaseResponse.setup_class` (moto/core/responses.py) builds `self.querystring`, from which `_get_action` and
`_get_param` read first, from the first of these that is not empty: the form (werkzeug's `request.form`,
for a form or multipart content type), the URL's query string, the body parsed as a form (`parse_qsl` of
the decoded body, whatever its content type, unless the class sets `use_raw_body`, as only S3 does), and
last the request headers. `_get_action` then takes `querystring["Action"]` before `X-Amz-Target`'s
operation (and that operation is the target's *last* dot-separated part), and `_get_param(name)` takes
`querystring[name]` before the JSON body's member. So a JSON call whose body held `a&Action=DeleteQueue&b`
(a message, a key value, a log line; gzip bodies too, moto decompresses them) ran DeleteQueue on the queue
the JSON named, though SendMessage was authorized; `&logGroupName=other` named another group. What moto is
handed instead can only be read one way:
- JSON: the body holds no `&` and no `=` (JSON lets a string spell them `\\u0026` and `\\u003d`), so its
  form reading is one name (the whole body, which starts with `{`) with an empty value: no `Action`, no
  parameter. It is never empty (`{}`: an empty body would let moto read the headers, and a signed header
  `Action: DeleteTopic` with them). The content type is a JSON one (a form content type would make
  werkzeug parse the body as the form), and the target is the one the enforcer read.
- query protocol: every parameter, `Action` among them, in one form body, so the form is the querystring
  (no Action is AWS's `MissingAction`).
- CBOR: its strings are raw UTF-8 that cannot be escaped, so moto is given a query string of one
  parameter, `Action=<the operation the path names>`: the querystring is that, never the body. (moto 5.2.5
  routes no RPC v2 CBOR path, a 404, and botocore's CloudWatch client speaks JSON to it; this holds for a
  moto that does.)

The enforcer then describes (servestack/local/iam/operations.py) and authorizes the canonical request and,
when it is allowed, hands exactly that request to moto. Refusals carry AWS's codes: S3 `InvalidArgument`
(400, with `ArgumentName`/`ArgumentValue`) for a repeated parameter; the query protocol's
`InvalidParameterValue` (400); SQS's `InvalidAddress` (404) for a queue URL that is not one, or a queue
named two ways; SQS's `AWS.SimpleQueueService.NonExistentQueue` for a queue of another account; JSON
services' `SerializationException` for a body that is not one JSON object with unique keys.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from servestack.local.iam.wire import HttpRequest

DEFAULT_HOST_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}(\.fifo)?$")
ACCOUNT_ID = re.compile(r"^\d{12}$")
SQS_HOST_REGION = re.compile(r"^(?:sqs\.(?P<a>[a-z0-9-]+)\.amazonaws\.com|(?P<b>[a-z0-9-]+)\.queue\.amazonaws\.com)$")
SQS_QUEUE_NAME_OPERATIONS = frozenset({"CreateQueue", "GetQueueUrl"})
SQS_NO_QUEUE_OPERATIONS = frozenset({"ListQueues", "CreateQueue", "GetQueueUrl"})
FORM = "application/x-www-form-urlencoded; charset=utf-8"
JSON_1_0, JSON_1_1 = "application/x-amz-json-1.0", "application/x-amz-json-1.1"
TARGET = re.compile(r"^[A-Za-z][A-Za-z0-9_]*\.[A-Za-z][A-Za-z0-9]*$")  # `<Prefix>.<Operation>`, one dot
S3_NO_BODY = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
S3_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
# Headers that describe the body as sent; a rebuilt body drops them (its length is set anew).
BODY_HEADERS = ("content-length", "content-encoding", "content-md5", "transfer-encoding")


@dataclass(frozen=True)
class Endpoint:
    """The emulator as clients reach it: `authority` (`host:port`, what forwarded requests carry) and the host
    names that mean the emulator itself (a virtual-hosted bucket is `<bucket>.<one of them>`)."""

    authority: str
    names: frozenset[str] = DEFAULT_HOST_NAMES


class Malformed(Exception):
    """A request AWS would refuse before authorization, in the words of each protocol (replies.py shapes it)."""

    def __init__(
        self,
        message: str,
        *,
        s3_code: str = "InvalidArgument",
        s3_status: int = 400,
        query_code: str = "InvalidParameterValue",
        json_type: str = "ValidationException",
        status: int = 400,
        members: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.s3_code = s3_code
        self.s3_status = s3_status
        self.query_code = query_code
        self.json_type = json_type
        self.status = status
        self.members = members or {}


def _unique_pairs(pairs: Iterable[tuple[str, str]], where: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for key, value in pairs:
        if key in params:
            raise Malformed(
                f"The parameter {key} is given more than once {where}; it takes one value.",
                members={"ArgumentName": key, "ArgumentValue": value},
            )
        params[key] = value
    return params


def query_pairs(raw_query: str) -> list[tuple[str, str]]:
    return urllib.parse.parse_qsl(raw_query, keep_blank_values=True)


def _host_name(request: HttpRequest) -> str:
    host = (request.header("host") or "").strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _with(request: HttpRequest, endpoint: Endpoint, **changes: Any) -> HttpRequest:
    headers = {**request.headers, "host": endpoint.authority}
    body = changes.get("body")
    if body is not None and body != request.body:
        headers = {key: value for key, value in headers.items() if key not in BODY_HEADERS}
        headers["content-length"] = str(len(body))
    return replace(request, headers=headers, **changes)


# ------------------------------------------------------------------------------------------ S3


def canonical_s3(request: HttpRequest, endpoint: Endpoint) -> HttpRequest:
    _unique_pairs(query_pairs(request.raw_query), "in the query string")
    host = _host_name(request)
    raw_path = request.raw_path or "/"
    if host and host not in endpoint.names:
        under = next((name for name in endpoint.names if host.endswith("." + name)), None)
        bucket = host[: -len(under) - 1] if under else None
        if bucket is None or not BUCKET_NAME.match(bucket):
            # S3 reads a host that is not one of its endpoints as a bucket name (a CNAME); none exists here.
            raise Malformed(
                "The specified bucket does not exist",
                s3_code="NoSuchBucket",
                s3_status=404,
                members={"BucketName": host},
            )
        raw_path = f"/{bucket}{raw_path}"
    segment = raw_path[1:].split("/", 1)[0]
    bucket = urllib.parse.unquote(segment)
    if segment and (bucket != segment or not BUCKET_NAME.match(bucket)):
        raise Malformed(
            "The specified bucket is not valid.", s3_code="InvalidBucketName", members={"BucketName": bucket}
        )
    method = request.method.upper()
    if method in S3_NO_BODY:
        # S3 reads no body on these; moto reads a form-typed one as parameters (`versionId` of a DeleteObject
        # authorized as s3:DeleteObject, `response-*` overrides of a GetObject): none is forwarded.
        return _with(request, endpoint, raw_path=raw_path, body=b"")
    content_type = (request.header("content-type") or "").lower()
    if request.body and content_type.startswith(S3_FORM_TYPES):
        # moto would read this body as the form fields of its parameters (and store none of it): local mode
        # cannot give it to S3 as the data AWS stores.
        raise Malformed(
            f"A {method} with a {content_type.split(';')[0]} body is not emulated: the emulator reads such a body "
            "as parameters, not data. Send the data with another Content-Type.",
            s3_code="NotImplemented",
            s3_status=501,
        )
    return _with(request, endpoint, raw_path=raw_path)


# ------------------------------------------------------------------------------------------ query and JSON protocols


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise Malformed(
                f"The member {key} is given more than once in the JSON body.", json_type="SerializationException"
            )
        seen[key] = value
    return seen


def json_params(request: HttpRequest) -> dict[str, Any]:
    """The body of a JSON-protocol call: one JSON object, each key once (an empty body is `{}`)."""
    if request.raw_query:
        names = ", ".join(sorted({key for key, _ in query_pairs(request.raw_query)})) or request.raw_query[:40]
        raise Malformed(f"A JSON-protocol call takes its parameters in the body only; the query string names {names}.")
    if not request.content.strip():
        return {}
    try:
        parsed = json.loads(request.content, object_pairs_hook=_reject_duplicate_keys)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise Malformed("The request body is not valid JSON.", json_type="SerializationException") from error
    if not isinstance(parsed, dict):
        raise Malformed("The request body is not a JSON object.", json_type="SerializationException")
    return parsed


def form_params(request: HttpRequest) -> dict[str, str]:
    """The parameters of a query-protocol call, from the query string and a form body; each name once."""
    pairs = query_pairs(request.raw_query)
    content_type = (request.header("content-type") or "").lower()
    if request.body and content_type.startswith("application/x-www-form-urlencoded"):
        try:
            text = request.content.decode("utf-8")
        except UnicodeDecodeError as error:
            raise Malformed("The form body is not UTF-8.") from error
        pairs += query_pairs(text)
    return _unique_pairs(pairs, "in the query string and the body")


def json_wire(params: dict[str, Any]) -> bytes:
    """`params` as the JSON body moto is handed: the same JSON, with `&` and `=` (which only strings can hold)
    escaped as `\\u0026` and `\\u003d`, so that no reading of it as a form finds a parameter (see the module's
    docstring)."""
    text = json.dumps(params)
    return text.replace("&", "\\u0026").replace("=", "\\u003d").encode()


def json_target(request: HttpRequest) -> str:
    """The `X-Amz-Target` of a JSON-protocol call, `<Prefix>.<Operation>`; anything else is AWS's
    UnknownOperationException (moto would run the target's last dot-separated part, the enforcer its first)."""
    target = (request.header("x-amz-target") or "").strip()
    if not TARGET.match(target):
        raise Malformed(
            f"X-Amz-Target {target[:100]!r} does not name one operation", json_type="UnknownOperationException"
        )
    return target


def canonical_json(request: HttpRequest, endpoint: Endpoint, params: dict[str, Any]) -> HttpRequest:
    """A JSON-protocol call as moto is handed it: `params` written anew (`json_wire`) under a JSON content type
    (the version sent, 1.0 unless it was 1.1), the target as read, posted to `/` with no query string."""
    target = json_target(request)
    sent = (request.header("content-type") or "").split(";", 1)[0].strip().lower()
    headers = {key: value for key, value in request.headers.items() if key not in BODY_HEADERS}
    body = json_wire(params)
    headers |= {
        "host": endpoint.authority,
        "x-amz-target": target,
        "content-type": JSON_1_1 if sent == JSON_1_1 else JSON_1_0,
        "content-length": str(len(body)),
    }
    return replace(request, method="POST", raw_path="/", raw_query="", headers=headers, body=body)


def protocol(request: HttpRequest) -> str:
    """`json` (X-Amz-Target), `cbor` (RPC v2 path) or `query`."""
    if request.header("x-amz-target") is not None:
        return "json"
    if re.fullmatch(r"/service/[^/]+/operation/[A-Za-z0-9]+", request.path):
        return "cbor"
    return "query"


# ------------------------------------------------------------------------------------------ SQS


@dataclass(frozen=True)
class Queue:
    account: str
    name: str


def _invalid_address(value: str) -> Malformed:
    return Malformed(
        f"The address {value[:200]} is not valid for this endpoint.",
        query_code="InvalidAddress",
        json_type="InvalidAddress",
        status=404,
    )


def queue_from_url(url: str, region: str) -> Queue:
    """`{scheme}://{host}/{account}/{name}` and nothing more; `_invalid_address` otherwise."""
    split = urllib.parse.urlsplit(url)
    if split.scheme not in ("http", "https") or not split.netloc or split.query or split.fragment or "#" in url:
        raise _invalid_address(url)
    parts = split.path.split("/")
    if len(parts) != 3 or parts[0] or not ACCOUNT_ID.match(parts[1]) or not QUEUE_NAME.match(parts[2]):
        raise _invalid_address(url)
    host_region = SQS_HOST_REGION.match(split.hostname or "")
    if host_region and (host_region.group("a") or host_region.group("b")) != region:
        raise _invalid_address(url)
    return Queue(parts[1], parts[2])


def queue_from_path(path: str) -> Queue | None:
    if path in ("", "/"):
        return None
    parts = path.split("/")
    if len(parts) != 3 or parts[0] or not ACCOUNT_ID.match(parts[1]) or not QUEUE_NAME.match(parts[2]):
        raise _invalid_address(path)
    return Queue(parts[1], parts[2])


def resolve_queue(operation: str | None, params: dict[str, Any], path: str, region: str, account: str) -> Queue | None:
    """The one queue a call names (None for calls that name none by URL), or `Malformed`."""
    named: list[Queue] = []
    url = params.get("QueueUrl")
    if url is not None:
        if not isinstance(url, str):
            raise _invalid_address(str(url))
        # A bare queue name is taken as the caller's own queue of that name (moto, after AWS, accepts it).
        named.append(Queue(account, url) if QUEUE_NAME.match(url) else queue_from_url(url, region))
    on_path = queue_from_path(path)
    if on_path is not None:
        named.append(on_path)
    queue = named[0] if named else None
    if any(other != queue for other in named):
        raise _invalid_address(f"{url} (the request's path names {path})")
    name = params.get("QueueName")
    if name is not None and operation not in SQS_QUEUE_NAME_OPERATIONS and (queue is None or name != queue.name):
        raise _invalid_address(f"QueueName {str(name)[:80]} (the call names {queue.name if queue else 'no queue'})")
    if queue is not None and queue.account != account:
        raise Malformed(
            "The specified queue does not exist.",
            query_code="AWS.SimpleQueueService.NonExistentQueue",
            json_type="QueueDoesNotExist",
        )
    return queue


def _queue_url(endpoint: Endpoint, queue: Queue) -> str:
    return f"http://{endpoint.authority}/{queue.account}/{queue.name}"


def canonical_sqs(request: HttpRequest, endpoint: Endpoint, region: str, account: str) -> HttpRequest:
    kind = protocol(request)
    if kind == "json":
        params: dict[str, Any] = json_params(request)
        operation = (request.header("x-amz-target") or "").partition(".")[2] or None
    else:
        params = dict(form_params(request))
        operation = params.get("Action")
    queue = resolve_queue(operation, params, request.path, region, account)
    if queue is not None:
        params["QueueUrl"] = _queue_url(endpoint, queue)
    if kind == "json":
        return canonical_json(request, endpoint, params)
    return _as_form(request, endpoint, params)


# ------------------------------------------------------------------------------------------ dispatch


def canonical_request(request: HttpRequest, service: str, endpoint: Endpoint, region: str, account: str) -> HttpRequest:
    """`request` in the one form the enforcer authorizes and forwards (see the module's docstring)."""
    if service == "s3":
        return canonical_s3(request, endpoint)
    if service == "sqs":
        return canonical_sqs(request, endpoint, region, account)
    kind = protocol(request)
    if kind == "json":
        return canonical_json(request, endpoint, json_params(request))
    if kind == "cbor":
        _unique_pairs(query_pairs(request.raw_query), "in the query string")
        operation = request.path.rsplit("/", 1)[1]
        return _with(request, endpoint, raw_query=urllib.parse.urlencode({"Action": operation}))
    params = form_params(request)
    if service == "sns":
        _one_sns_target(params)
    return _as_form(request, endpoint, params)


def _as_form(request: HttpRequest, endpoint: Endpoint, params: dict[str, Any]) -> HttpRequest:
    """A query-protocol call as one form body POSTed to `/` (the protocol takes GET or POST alike)."""
    if not isinstance(params.get("Action"), str) or not params["Action"]:
        raise Malformed("The request must contain the parameter Action.", query_code="MissingAction")
    body = urllib.parse.urlencode(params).encode()
    canonical = _with(request, endpoint, method="POST", raw_path="/", raw_query="", body=body)
    return replace(canonical, headers={**canonical.headers, "content-type": FORM})


def _one_sns_target(params: dict[str, str]) -> None:
    """SNS Publish names one destination: moto reads `PhoneNumber`, then `TargetArn`, then `TopicArn`."""
    given = [name for name in ("TopicArn", "TargetArn", "PhoneNumber") if params.get(name)]
    if params.get("Action") in ("Publish", "PublishBatch") and len(given) > 1:
        raise Malformed(
            f"Invalid parameter: only one of TopicArn, TargetArn and PhoneNumber may be given (got {', '.join(given)})",
            query_code="InvalidParameter",
            json_type="InvalidParameterException",
        )


LAMBDA_FUNCTION_PATH = re.compile(r"^/\d{4}-\d{2}-\d{2}/functions/(?P<name>[^/]+)/")


def canonical_front_request(request: HttpRequest, service: str, region: str, account: str) -> None:
    """servestack's own AWS fronts (SageMaker Runtime, Lambda Invoke) read their query string once: a
    parameter repeated there is refused rather than read as its first or last value; a SageMaker control-plane
    call is one JSON body. A Lambda function named
    by an ARN (or `account:function:name`) of another region or account does not exist locally: the front
    serves the templates' functions by name, so it would run the local one under a foreign ARN's grant."""
    if service not in ("lambda", "sagemaker"):
        return  # an HTTP API passes repeated query parameters on to its integration, as API Gateway does
    if request.header("x-amz-target") is not None:
        json_target(request)  # one operation, as the front's handlers read it
        json_params(request)  # SageMaker's control plane: the body alone, each key once
        return
    _unique_pairs(query_pairs(request.raw_query), "in the query string")
    matched = LAMBDA_FUNCTION_PATH.match(request.raw_path) if service == "lambda" else None
    if matched is None:
        return
    raw = urllib.parse.unquote(matched.group("name"))
    parts = raw.split(":")
    if parts[0] == "arn" and len(parts) in (7, 8):
        foreign = parts[3] != region or parts[4] != account
    elif len(parts) in (3, 4) and parts[1] == "function":
        foreign = parts[0] != account
    else:
        foreign = False
    if foreign:
        raise Malformed(f"Function not found: {raw}", json_type="ResourceNotFoundException", status=404)
