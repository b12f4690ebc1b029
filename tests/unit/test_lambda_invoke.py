"""The Lambda Invoke API of a function host, called in-process on real `LocalFunction`s (no HTTP)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from servestack.local.hosting.http_server import Request
from servestack.local.lambda_.invoke import TAIL_BYTES, capture_output, invoke
from servestack.local.lambda_.runtime import LocalFunction
from servestack.local.lambda_.service import parse_function_name


def request(payload: bytes = b"{}", **headers: str) -> Request:
    lowered = {name.lower().replace("_", "-"): value for name, value in headers.items()}
    return Request("POST", "/2015-03-31/functions/f/invocations", {}, lowered, payload)


def chatty(event: dict[str, Any], context: Any) -> dict[str, Any]:
    print("x" * 100)
    for line in range(int(event.get("lines", 1))):
        print(f"line {line}")
    if event.get("fail"):
        raise ValueError(f"bad value {event['fail']!r}")
    if event.get("sleep"):
        time.sleep(float(event["sleep"]))
    if event.get("unserializable"):
        return {"when": object()}
    return {"echo": event, "function": context.function_name}


def local_function(name: str = "f", timeout_sec: float = 5) -> LocalFunction:
    """A function whose prints are collected per invocation. pytest swaps sys.stdout between test phases (and
    puts its own back afterwards), so the tee goes in from the test body."""
    capture_output()
    return LocalFunction(name, chatty, timeout_sec=timeout_sec)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("digits-api", ("digits-api", None)),
        ("digits-api:live", ("digits-api", "live")),
        ("123456789012:function:digits-api", ("digits-api", None)),
        ("arn:aws:lambda:eu-west-1:999999999999:function:digits-api:$LATEST", ("digits-api", "$LATEST")),
        ("arn:aws-cn:lambda:cn-north-1:1:function:f", ("f", None)),
        ("arn:aws:s3:::bucket", None),
        ("a:b:c:d:e", None),
        ("has space", None),
        ("f:bad/qualifier", None),
    ],
)
def test_function_names_in_every_form_lambda_accepts(raw: str, expected: tuple[str, str | None] | None) -> None:
    assert parse_function_name(raw) == expected


def test_request_response_returns_the_result_and_the_log_tail() -> None:
    function = local_function()
    reply = invoke(function, request(b'{"a": 1}', X_Amz_Log_Type="Tail"))
    assert reply.status == 200
    assert json.loads(reply.body) == {"echo": {"a": 1}, "function": "f"}
    assert "X-Amz-Function-Error" not in reply.headers
    log = base64.b64decode(reply.headers["X-Amz-Log-Result"]).decode()
    rid = reply.headers["x-amzn-RequestId"]
    assert log.splitlines()[:3] == [f"START RequestId: {rid} Version: $LATEST", "x" * 100, "line 0"]
    assert log.splitlines()[-2] == f"END RequestId: {rid}"


def test_log_tail_is_the_last_4_kb() -> None:
    function = local_function()
    reply = invoke(function, request(b'{"lines": 2000}', X_Amz_Log_Type="Tail"))
    log = base64.b64decode(reply.headers["X-Amz-Log-Result"])
    assert len(log) == TAIL_BYTES
    assert b"line 1999\nEND RequestId:" in log
    assert b"START" not in log


def test_a_raising_handler_is_unhandled_with_its_own_frames() -> None:
    function = local_function()
    reply = invoke(function, request(b'{"fail": 7}'))
    assert reply.status == 200
    assert reply.headers["X-Amz-Function-Error"] == "Unhandled"
    error = json.loads(reply.body)
    assert (error["errorType"], error["errorMessage"]) == ("ValueError", "bad value 7")
    assert "in chatty" in error["stackTrace"][0]  # the runtime's own frames are not shown


def test_timeouts_and_unserializable_results_are_unhandled_as_lambda_reports_them() -> None:
    function = local_function(timeout_sec=0.2)
    timed_out = invoke(function, request(b'{"sleep": 1}'))
    assert timed_out.headers["X-Amz-Function-Error"] == "Unhandled"
    assert json.loads(timed_out.body)["errorMessage"].endswith("Task timed out after 0.20 seconds")
    unmarshalled = invoke(local_function("g"), request(b'{"unserializable": true}'))
    assert json.loads(unmarshalled.body)["errorType"] == "Runtime.MarshalError"


def test_request_errors_name_the_value_and_what_is_allowed() -> None:
    function = local_function()
    bad_type = invoke(function, request(X_Amz_Invocation_Type="Later"))
    assert (bad_type.status, bad_type.headers["x-amzn-ErrorType"]) == (400, "InvalidParameterValueException")
    assert json.loads(bad_type.body)["message"] == (
        "X-Amz-Invocation-Type: 'Later' is not one of RequestResponse, Event, DryRun"
    )
    not_json = invoke(function, request(b"{nope"))
    assert (not_json.status, not_json.headers["x-amzn-ErrorType"]) == (400, "InvalidRequestContentException")
    too_big = invoke(function, request(b'"' + b"x" * (1024 * 1024) + b'"', X_Amz_Invocation_Type="Event"))
    assert (too_big.status, too_big.headers["x-amzn-ErrorType"]) == (413, "RequestTooLargeException")
    assert invoke(function, request(X_Amz_Invocation_Type="DryRun")).status == 204
