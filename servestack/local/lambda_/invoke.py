"""The Lambda Invoke API (`POST /2015-03-31/functions/{FunctionName}/invocations`) for the functions of one process.

Each `local up` child that hosts Lambda handlers (serverless and async HTTP fronts, the SQS poller, the batch
scheduler) serves this API on its `--invoke-port` for the `LocalFunction`s it already runs, so an invocation
shares the process, the loaded model and the one-event-at-a-time instance of the event source. The AWS front
(servestack/local/up/aws_front.py) routes boto3's `lambda.invoke` here. What follows the Lambda API reference:
- `X-Amz-Invocation-Type`: `RequestResponse` (200 + the handler's result as JSON), `Event` (202 at once; the
  handler runs in the background, without Lambda's two retries), `DryRun` (204 after validation).
- A handler that raises (or times out): 200 with `X-Amz-Function-Error: Unhandled` and
  `{"errorMessage", "errorType", "requestId", "stackTrace"}` (a timeout has only `errorMessage`).
- `X-Amz-Log-Type: Tail`: `X-Amz-Log-Result` is the base64 of the last 4 KB of the invocation's log: the
  `START` / `END` / `REPORT` lines and whatever the handler printed or logged (stdout and stderr) from the
  thread it runs on.
- Request errors in the shapes botocore maps to its exceptions: `InvalidRequestContentException` (payload
  not JSON), `InvalidParameterValueException` (bad header value), `RequestTooLargeException`,
  `ResourceNotFoundException`.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import resource
import sys
import threading
import time
import traceback
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from servestack.local.cloudformation import ACCOUNT
from servestack.local.hosting import LocalHttpServer, Reply, Request, request_id
from servestack.local.lambda_.runtime import REGION, FunctionTimeout, LambdaContext, LocalFunction
from servestack.local.lambda_.runtime import current_context as _current_context

logger = logging.getLogger("servestack.local")
INVOKE_PREFIX, INVOKE_SUFFIX = "/2015-03-31/functions/", "/invocations"
INVOCATION_TYPES = ("RequestResponse", "Event", "DryRun")
LOG_TYPES = ("None", "Tail")
SYNC_PAYLOAD_BYTES = 6 * 1024 * 1024  # Lambda's quota for RequestResponse payloads
EVENT_PAYLOAD_BYTES = 1024 * 1024  # ... and for Event (asynchronous) payloads
TAIL_BYTES = 4096
EXECUTED_VERSION = "$LATEST"  # local mode runs the working tree: every alias points at $LATEST
# Each error shape names its message member its own way (botocore's lambda service-2.json).
MESSAGE_MEMBER = {"ResourceNotFoundException": "Message", "ServiceException": "Message"}


def function_arn(name: str, qualifier: str | None = None) -> str:
    return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}" + (f":{qualifier}" if qualifier else "")


def lambda_error(status: int, error_type: str, message: str, *, kind: str = "User") -> Reply:
    """An error as the Lambda service sends it: `x-amzn-ErrorType` and `{"Type", "Message"|"message"}`."""
    body = {"Type": kind, MESSAGE_MEMBER.get(error_type, "message"): message}
    headers = {"Content-Type": "application/json", "x-amzn-ErrorType": error_type, "x-amzn-RequestId": request_id()}
    return Reply(status, headers, json.dumps(body).encode())


def not_found(name: str, qualifier: str | None = None) -> Reply:
    return lambda_error(404, "ResourceNotFoundException", f"Function not found: {function_arn(name, qualifier)}")


# ------------------------------------------------------------------------------------------ invocation logs


class OutputTee:
    """Wraps sys.stdout / sys.stderr: writes go through, and into the log of the invocation running on the
    writing thread when that invocation collects one (`LambdaContext.log`)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        context = _current_context()
        if context is not None and context.log is not None:
            context.log.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def capture_output() -> None:
    """Install the tees; do it before handlers are imported (their loggers keep the stream they saw)."""
    if not isinstance(sys.stdout, OutputTee):
        sys.stdout = OutputTee(sys.stdout)
    if not isinstance(sys.stderr, OutputTee):
        sys.stderr = OutputTee(sys.stderr)


def _emit(context: LambdaContext, line: str) -> None:
    """A line of the Lambda runtime's own (START/END/REPORT/[ERROR]) into the stream and the invocation log."""
    if context.log is not None:
        context.log.append(line)
    out = sys.stdout.stream if isinstance(sys.stdout, OutputTee) else sys.stdout
    out.write(line)
    out.flush()


def tail(log: list[str], limit: int = TAIL_BYTES) -> str:
    """base64 of the last `limit` bytes of the log, as `X-Amz-Log-Result` carries it."""
    return base64.b64encode("".join(log).encode()[-limit:]).decode()


# ------------------------------------------------------------------------------------------ invoking


@dataclass
class Outcome:
    context: LambdaContext
    payload: bytes
    failed: bool


def _stack_trace(error: BaseException) -> list[str]:
    """The frames from the handler down, as the Python runtime reports them (our runtime's frames dropped)."""
    frames = traceback.extract_tb(error.__traceback__)
    starts = [i for i, frame in enumerate(frames) if frame.name == "_call_with_loop"]
    return traceback.format_list(frames[starts[-1] + 1 :] if starts else frames)


def run(function: LocalFunction, event: Any) -> Outcome:
    """One invocation with its log, whatever the handler does."""
    context = function.new_context()
    context.log = []
    rid = context.aws_request_id
    _emit(context, f"START RequestId: {rid} Version: {EXECUTED_VERSION}\n")
    started = time.perf_counter()
    failed = True
    try:
        result = function.invoke(event, context)
        try:
            payload = json.dumps(result).encode()
            failed = False
        except (TypeError, ValueError) as error:
            body: dict[str, Any] = {
                "errorMessage": f"Unable to marshal response: {error}",
                "errorType": "Runtime.MarshalError",
                "requestId": rid,
                "stackTrace": [],
            }
            payload = json.dumps(body).encode()
    except FunctionTimeout as error:
        payload = json.dumps({"errorMessage": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%S.%fZ} {error}"}).encode()
    except Exception as error:
        stack = _stack_trace(error)
        body = {"errorMessage": str(error), "errorType": type(error).__name__, "requestId": rid, "stackTrace": stack}
        payload = json.dumps(body).encode()
        _emit(context, f"[ERROR] {type(error).__name__}: {error}\nTraceback (most recent call last):\n{''.join(stack)}")
    elapsed_ms = (time.perf_counter() - started) * 1000
    used_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    _emit(context, f"END RequestId: {rid}\n")
    _emit(
        context,
        f"REPORT RequestId: {rid}\tDuration: {elapsed_ms:.2f} ms\tBilled Duration: {math.ceil(elapsed_ms)} ms\t"
        f"Memory Size: {function.memory_mib} MB\tMax Memory Used: {used_mib} MB\t\n",
    )
    return Outcome(context, payload, failed)


def _header_value(request: Request, header: str, allowed: tuple[str, ...], default: str) -> str | Reply:
    value = request.header(header) or default
    if value in allowed:
        return value
    return lambda_error(
        400, "InvalidParameterValueException", f"{header}: {value!r} is not one of {', '.join(allowed)}"
    )


def invoke(function: LocalFunction, request: Request) -> Reply:
    """The Invoke API for one function: validate, then run synchronously, in the background, or not at all."""
    invocation_type = _header_value(request, "X-Amz-Invocation-Type", INVOCATION_TYPES, "RequestResponse")
    if isinstance(invocation_type, Reply):
        return invocation_type
    log_type = _header_value(request, "X-Amz-Log-Type", LOG_TYPES, "None")
    if isinstance(log_type, Reply):
        return log_type
    limit = EVENT_PAYLOAD_BYTES if invocation_type == "Event" else SYNC_PAYLOAD_BYTES
    if len(request.body) > limit:
        message = f"Request must be smaller than {limit} bytes for the InvokeFunction operation"
        return lambda_error(413, "RequestTooLargeException", message)
    try:
        event = json.loads(request.body) if request.body.strip() else {}
    except ValueError as error:
        return lambda_error(400, "InvalidRequestContentException", f"Could not parse request body into json: {error}")
    if invocation_type == "DryRun":
        return Reply(204, {"x-amzn-RequestId": request_id()})
    if invocation_type == "Event":
        threading.Thread(target=_run_event, args=(function, event), name=f"event-{function.name}", daemon=True).start()
        return Reply(202, {"x-amzn-RequestId": request_id()})
    outcome = run(function, event)
    headers = {
        "Content-Type": "application/json",
        "X-Amz-Executed-Version": EXECUTED_VERSION,
        "x-amzn-RequestId": outcome.context.aws_request_id,
    }
    if outcome.failed:
        headers["X-Amz-Function-Error"] = "Unhandled"
    if log_type == "Tail" and outcome.context.log is not None:
        headers["X-Amz-Log-Result"] = tail(outcome.context.log)
    return Reply(200, headers, outcome.payload)


def _run_event(function: LocalFunction, event: Any) -> None:
    outcome = run(function, event)
    if outcome.failed:
        logger.error("%s: event invocation %s failed: %s", function.name, outcome.context.aws_request_id,
                     outcome.payload.decode(errors="replace"))  # fmt: skip


class FunctionHost:
    """The Invoke API for the functions of this process, keyed by function name, on its own port."""

    def __init__(self, functions: dict[str, LocalFunction], port: int = 0, host: str = "127.0.0.1") -> None:
        self.functions = functions
        self.server = LocalHttpServer("lambda-invoke", self.handle, port, host)
        self.url = self.server.url

    def handle(self, request: Request) -> Reply:
        path = request.path
        if request.method != "POST" or not (path.startswith(INVOKE_PREFIX) and path.endswith(INVOKE_SUFFIX)):
            return lambda_error(404, "UnknownOperationException", f"{request.method} {path}: not the Invoke API")
        name = urllib.parse.unquote(path[len(INVOKE_PREFIX) : -len(INVOKE_SUFFIX)])
        function = self.functions.get(name)
        if function is None:
            return not_found(name)
        return invoke(function, request)

    def serve_in_background(self) -> FunctionHost:
        self.server.serve_in_background()
        return self

    def close(self) -> None:
        self.server.close()
