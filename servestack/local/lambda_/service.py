"""The Lambda service of `local up`: which functions exist (from the templates), where each one's execution
environment answers, and invoking them.

Every invoker goes through here, in the `local up` process, as in the cloud: boto3's `lambda.invoke` (the
AWS front), the HTTP API fronts, the SQS event source mappings and the schedules. Each function runs in its
own child process (servestack/local/lambda_/runner.py) that answers the Invoke API for it.

Names and qualifiers are the templates': a function is found by its physical name, a partial ARN
(`account:function:name`) or a full ARN; a qualifier is `$LATEST`, an alias of the template (`live`) or the
version the template publishes (`1`: local mode runs the working tree, so every qualifier runs the same code).
Anything else is `ResourceNotFoundException`, as in the cloud. Reserved concurrency 0 throttles, as it does
there.

An asynchronous invocation (`Event`: a schedule's, or boto3's with InvocationType Event) is the service's to run,
as Lambda queues the event and invokes the function itself: it is validated (1 MB, JSON), answered 202, and run
synchronously in the background here, so that its outcome is known to the service. A failed invocation (the
handler raised or timed out: `X-Amz-Function-Error`), whoever made it, is counted as Lambda counts it, in the
function's `Errors` metric (`on_failure`, which local up points at the emulator's CloudWatch). Lambda's own
retries of a failed asynchronous invocation (two, minutes apart) are not played.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from servestack.local.hosting import HOP_BY_HOP, Reply, request_id
from servestack.local.lambda_.definitions import FunctionDef
from servestack.local.lambda_.invoke import (
    EVENT_PAYLOAD_BYTES,
    INVOKE_PREFIX,
    INVOKE_SUFFIX,
    function_arn,
    lambda_error,
    not_found,
)

logger = logging.getLogger("servestack.local")

FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
QUALIFIER = re.compile(r"^[a-zA-Z0-9$_-]{1,128}$")
LAMBDA_HEADERS = ("x-amz-invocation-type", "x-amz-log-type", "x-amz-client-context", "content-type")
LOCAL_VERSION = "1"  # what `Fn::GetAtt Version.Version` resolves to locally


def parse_function_name(raw: str) -> tuple[str, str | None] | None:
    """`name`, `name:qualifier`, `account:function:name[:qualifier]` or
    `arn:aws:lambda:region:account:function:name[:qualifier]` -> (name, qualifier); None when malformed."""
    parts = raw.split(":")
    if parts[0] == "arn":
        ok = len(parts) in (7, 8) and parts[1].startswith("aws") and parts[2] == "lambda" and parts[5] == "function"
        parts = parts[6:] if ok else []
    elif len(parts) in (3, 4) and parts[1] == "function":
        parts = parts[2:]
    if not 1 <= len(parts) <= 2 or not FUNCTION_NAME.match(parts[0]):
        return None
    if len(parts) == 2 and not QUALIFIER.match(parts[1]):
        return None
    return parts[0], (parts[1] if len(parts) == 2 else None)


@dataclass(frozen=True)
class HostedFunction:
    definition: FunctionDef
    url: str  # the Invoke API of its execution environment
    versioned: bool  # the template publishes a version of it

    @property
    def name(self) -> str:
        return self.definition.name

    def accepts(self, qualifier: str | None) -> bool:
        return (
            qualifier in (None, "$LATEST")
            or qualifier in self.definition.aliases
            or (self.versioned and qualifier == LOCAL_VERSION)
        )


@dataclass(frozen=True)
class Invocation:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def function_error(self) -> str | None:
        return self.headers.get("x-amz-function-error")

    def reply(self) -> Reply:
        return Reply(self.status, self.headers, self.body)


class LambdaService:
    def __init__(
        self,
        functions: list[HostedFunction],
        http: httpx.Client | None = None,
        *,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.functions = {f.name: f for f in functions}
        # Up to Lambda's 900 s timeout, plus the time a cold environment takes to start.
        self.http = http or httpx.Client(timeout=httpx.Timeout(960.0, connect=5.0))
        self.on_failure = on_failure  # a failed invocation of the named function (its Errors metric)

    def close(self) -> None:
        self.http.close()

    def find(self, raw: str, qualifier: str | None = None) -> tuple[HostedFunction, str | None] | Reply:
        """The function `raw` names (and its qualifier), or the error the Lambda API gives."""
        parsed = parse_function_name(raw)
        if parsed is None:
            return lambda_error(
                400,
                "ValidationException",
                f"1 validation error detected: Value '{raw[:140]}' at 'functionName' failed to satisfy constraint: "
                "Member must be a function name, name:qualifier, or a function ARN",
            )
        name, derived = parsed
        if derived and qualifier and derived != qualifier:
            message = "The derived qualifier from the function name does not match the specified qualifier."
            return lambda_error(400, "InvalidParameterValueException", message)
        qualifier = derived or qualifier
        function = self.functions.get(name)
        if function is None or not function.accepts(qualifier):
            return not_found(name, qualifier)
        return function, qualifier

    def arn(self, raw: str, qualifier: str | None = None) -> str:
        """The ARN IAM evaluates for an invoke of `raw` (qualified when the call names a qualifier)."""
        found = self.find(raw, qualifier)
        if isinstance(found, Reply):
            parsed = parse_function_name(raw)
            return function_arn(*(parsed or (raw, None)))
        function, resolved = found
        return function.definition.arn + (f":{resolved}" if resolved else "")

    def invoke(
        self,
        raw: str,
        payload: bytes,
        *,
        qualifier: str | None = None,
        headers: dict[str, str] | None = None,
        timeout_sec: float | None = None,
    ) -> Invocation:
        """Run the function on `payload` in its environment; Lambda API errors come back as Invocations too.
        `timeout_sec` is the caller's own limit (an API Gateway integration's): past it, httpx's TimeoutException."""
        found = self.find(raw, qualifier)
        if isinstance(found, Reply):
            return Invocation(found.status, found.headers, found.body)
        function, _ = found
        if function.definition.reserved_concurrency == 0:
            reply = lambda_error(429, "TooManyRequestsException", "Rate Exceeded.")
            return Invocation(reply.status, reply.headers, reply.body)
        if _invocation_type(headers) == "Event":
            return self._queue_event(function, payload, headers or {})
        invocation = self._call(function, payload, headers, timeout_sec)
        self._count(function, invocation)
        return invocation

    def _count(self, function: HostedFunction, invocation: Invocation) -> None:
        """A function error (the handler raised or timed out), or an environment that died under it (Lambda's
        Runtime.ExitError), counts in the function's Errors."""
        if (invocation.function_error is not None or invocation.status == 502) and self.on_failure is not None:
            self.on_failure(function.name)

    def _queue_event(self, function: HostedFunction, payload: bytes, headers: dict[str, str]) -> Invocation:
        """Accept an asynchronous invocation as Lambda does (202, or why not), then run it in the background."""
        refused = _event_refusal(payload)
        if refused is not None:
            return Invocation(refused.status, refused.headers, refused.body)
        synchronous = {k: v for k, v in headers.items() if k.lower() not in ("x-amz-invocation-type", "x-amz-log-type")}

        def run() -> None:
            try:
                invocation = self._call(function, payload, synchronous, None)
            except httpx.TimeoutException as error:
                invocation = Invocation(502, {}, f"its execution environment did not answer: {error}".encode())
            if invocation.function_error is not None or invocation.status >= 400:
                logger.error("%s: event invocation failed (%d): %s", function.name, invocation.status,
                             invocation.body[:2000].decode(errors="replace"))  # fmt: skip
            self._count(function, invocation)

        threading.Thread(target=run, name=f"event-{function.name}", daemon=True).start()
        return Invocation(202, {"x-amzn-RequestId": request_id()}, b"")

    def _call(
        self, function: HostedFunction, payload: bytes, headers: dict[str, str] | None, timeout_sec: float | None
    ) -> Invocation:
        """One invocation in the function's environment, as the Invoke API answers it."""
        url = f"{function.url}{INVOKE_PREFIX}{urllib.parse.quote(function.name)}{INVOKE_SUFFIX}"
        try:
            timeout = httpx.Timeout(timeout_sec, connect=5.0) if timeout_sec is not None else httpx.USE_CLIENT_DEFAULT
            response = self.http.post(url, content=payload, headers=headers or {}, timeout=timeout)
        except httpx.TimeoutException:
            raise
        except httpx.HTTPError as error:
            # The environment crashed or is restarting: Lambda reports a service-side failure, retryable.
            reply = lambda_error(
                502, "ServiceException", f"{function.name}: its execution environment is not answering ({error})",
                kind="Service",
            )  # fmt: skip
            return Invocation(reply.status, reply.headers, reply.body)
        kept = {key.lower(): value for key, value in response.headers.items() if key.lower() not in HOP_BY_HOP}
        return Invocation(response.status_code, kept, response.content)

    def forward(self, raw: str, qualifier: str | None, request_headers: dict[str, str], body: bytes) -> Reply:
        """boto3's Invoke, forwarded with the headers the Invoke API reads."""
        headers = {key: value for key in LAMBDA_HEADERS if (value := request_headers.get(key)) is not None}
        return self.invoke(raw, body, qualifier=qualifier, headers=headers).reply()

    @staticmethod
    def invoke_path_name(path: str) -> str:
        return urllib.parse.unquote(path[len(INVOKE_PREFIX) : -len(INVOKE_SUFFIX)])


def _invocation_type(headers: dict[str, str] | None) -> str | None:
    return next((v for k, v in (headers or {}).items() if k.lower() == "x-amz-invocation-type"), None)


def _event_refusal(payload: bytes) -> Reply | None:
    """Why Lambda refuses an asynchronous invocation at once (its payload), or None."""
    if len(payload) > EVENT_PAYLOAD_BYTES:
        message = f"Request must be smaller than {EVENT_PAYLOAD_BYTES} bytes for the InvokeFunction operation"
        return lambda_error(413, "RequestTooLargeException", message)
    try:
        if payload.strip():
            json.loads(payload)
    except ValueError as error:
        return lambda_error(400, "InvalidRequestContentException", f"Could not parse request body into json: {error}")
    return None
