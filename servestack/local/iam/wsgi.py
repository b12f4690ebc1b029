"""The enforcer's WSGI side, in front of moto: a request read from the WSGI environ, forwarded in its canonical
form, the answer sent back, and the S3 DeleteObjects whose denied keys it reports itself."""

from __future__ import annotations

import base64
import hashlib
import io
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any
from xml.sax.saxutils import escape

from servestack.local.hosting import Reply
from servestack.local.iam.verdicts import Verdict
from servestack.local.iam.wire import HttpRequest

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
TARGET_SERVICES = {
    "AmazonSQS": "sqs",
    "DynamoDB_20120810": "dynamodb",
    "DynamoDBStreams_20120810": "dynamodb",
    "Logs_20140328": "logs",
    "AWSEvents": "events",
    "GraniteServiceVersion20100801": "monitoring",
    "SageMaker": "sagemaker",
}


# ------------------------------------------------------------------------------------------ helpers

DELETE_NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"


def partial_delete(
    environ: dict[str, Any],
    start_response: StartResponse,
    app: WsgiApp,
    request: HttpRequest,
    verdict: Verdict,
) -> Iterable[bytes]:
    """S3 DeleteObjects with some keys denied: moto deletes the rest; the denied ones are reported."""
    assert verdict.operation is not None
    denied = set(verdict.denied_keys)
    allowed = [item for item in verdict.operation.delete_keys if item not in denied]
    errors = "".join(
        f"<Error><Key>{escape(key)}</Key>"
        + (f"<VersionId>{escape(version)}</VersionId>" if version else "")
        + "<Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
        for key, version in verdict.denied_keys
    )
    if not allowed:
        result = f'<?xml version="1.0" encoding="UTF-8"?>\n<DeleteResult xmlns="{DELETE_NAMESPACE}">{errors}'
        result += "</DeleteResult>"
        return _send(start_response, Reply(200, {"Content-Type": "application/xml"}, result.encode()))
    quiet = b"<Quiet>true</Quiet>" in request.body.replace(b" ", b"")
    objects = "".join(
        f"<Object><Key>{escape(key)}</Key>"
        + (f"<VersionId>{escape(version)}</VersionId>" if version else "")
        + "</Object>"
        for key, version in allowed
    )
    new_body = f'<Delete xmlns="{DELETE_NAMESPACE}">{"<Quiet>true</Quiet>" if quiet else ""}{objects}</Delete>'.encode()
    environ["wsgi.input"] = io.BytesIO(new_body)
    environ["CONTENT_LENGTH"] = str(len(new_body))
    environ["HTTP_CONTENT_MD5"] = base64.b64encode(hashlib.md5(new_body).digest()).decode()  # noqa: S324 - S3's Content-MD5
    for key in [key for key in environ if key.startswith("HTTP_X_AMZ_CHECKSUM_")]:
        del environ[key]
    status, headers, reply = _call(app, environ)
    if status.startswith("200") and b"</DeleteResult>" in reply:
        reply = reply.replace(b"</DeleteResult>", errors.encode() + b"</DeleteResult>")
    headers = [(name, value) for name, value in headers if name.lower() != "content-length"]
    start_response(status, [*headers, ("Content-Length", str(len(reply)))])
    return [reply]


def guess_service(request: HttpRequest) -> str:
    """The service an unsigned request to moto's port is for: the X-Amz-Target's, else S3 (whose
    path-style requests carry no other mark)."""
    target = request.header("x-amz-target")
    if target:
        return TARGET_SERVICES.get(target.partition(".")[0], "unknown")
    if "Action" in request.form:
        return "unknown"
    return "s3"


def request_from_environ(environ: dict[str, Any]) -> HttpRequest:
    """The request as sent, from a WSGI environ; its body is read once and put back for the app."""
    stream = environ.get("wsgi.input")
    length = environ.get("CONTENT_LENGTH") or ""
    body = b""
    if stream is not None:
        if length.isdigit():
            body = stream.read(int(length)) if int(length) else b""
        elif environ.get("wsgi.input_terminated") or "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            body = stream.read()
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    environ["wsgi.input_terminated"] = False
    environ.pop("HTTP_TRANSFER_ENCODING", None)
    raw_uri = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw_uri:
        if "://" in raw_uri.split("?", 1)[0]:
            raw_uri = urllib.parse.urlsplit(raw_uri)._replace(scheme="", netloc="").geturl()
        raw_path = raw_uri.split("?", 1)[0]
    else:
        raw_path = urllib.parse.quote(environ.get("PATH_INFO", "/").encode("latin-1"), safe="/~!$&'()*+,;=:@")
    headers: dict[str, str] = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            headers[key[5:].lower().replace("_", "-")] = value
    if environ.get("CONTENT_TYPE"):
        headers["content-type"] = environ["CONTENT_TYPE"]
    if length:
        headers["content-length"] = str(len(body))
    return HttpRequest(
        environ.get("REQUEST_METHOD", "GET"),
        raw_path or "/",
        environ.get("QUERY_STRING", ""),
        headers,
        body,
        environ.get("REMOTE_ADDR", "127.0.0.1"),
    )


def _forward_as(environ: dict[str, Any], request: HttpRequest) -> None:
    """Make `environ` the canonical request: what moto reads is what the enforcer authorized."""
    environ["HTTP_HOST"] = request.headers["host"]
    environ["QUERY_STRING"] = request.raw_query
    environ["PATH_INFO"] = urllib.parse.unquote_to_bytes(request.raw_path).decode("latin-1")
    raw_uri = request.raw_path + (f"?{request.raw_query}" if request.raw_query else "")
    environ["RAW_URI"] = environ["REQUEST_URI"] = raw_uri
    environ["wsgi.input"] = io.BytesIO(request.body)
    environ["CONTENT_LENGTH"] = str(len(request.body))
    if request.header("content-type") is not None:
        environ["CONTENT_TYPE"] = request.headers["content-type"]
    if request.header("x-amz-target") is not None:  # as the enforcer read it (canonical.json_target)
        environ["HTTP_X_AMZ_TARGET"] = request.headers["x-amz-target"]
    for name in ("HTTP_CONTENT_ENCODING", "HTTP_CONTENT_MD5"):
        if name[5:].lower().replace("_", "-") not in request.headers:
            environ.pop(name, None)


def _send(start_response: StartResponse, reply: Reply) -> list[bytes]:
    headers = [(name, value) for name, value in reply.headers.items() if name.lower() != "content-length"]
    start_response(f"{reply.status} {_reason(reply.status)}", [*headers, ("Content-Length", str(len(reply.body)))])
    return [reply.body]


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _call(app: WsgiApp, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
    """Run `app` and collect its whole response (only for the small S3 replies that may be rewritten)."""
    captured: dict[str, Any] = {}

    def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        captured["status"], captured["headers"] = status, headers
        return lambda data: None

    result = app(environ, capture)
    try:
        body = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return captured.get("status", "500 Internal Server Error"), list(captured.get("headers", [])), body
