"""Call a Lambda handler the way the Lambda service does: one event at a time, a context, a timeout.

`LocalFunction` imports the handler by its dotted path (the same string the CDK stacks use), runs each
invocation on its own "instance" thread (with an event loop, as Mangum expects) and gives up after the
function's timeout. A timed-out instance is abandoned and a fresh one takes the next event, as Lambda
replaces a timed-out execution environment (Python cannot kill the thread; its result is discarded).
`HttpFront` turns plain HTTP requests into API Gateway HTTP API (v2) events for a `LocalFunction`.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import importlib
import logging
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from servestack.local.cloudformation import ACCOUNT
from servestack.local.hosting import BODY_TIMEOUT_SEC, MAX_BODY_BYTES, LocalHttpServer, Reply, Request

logger = logging.getLogger("servestack.local")

Handler = Callable[[dict[str, Any], Any], Any]
REGION = "us-east-1"


class FunctionTimeout(Exception):
    """The handler ran past its timeout (Lambda reports `Task timed out after N seconds`)."""


class FunctionThrottled(Exception):
    """No instance of the function became free before the caller's deadline (Lambda throttles, it never queues)."""


class LambdaContext:
    """The attributes and method of the context object the Lambda Python runtime passes to a handler."""

    def __init__(self, function_name: str, timeout_sec: float, memory_mib: int) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function_name}"
        self.memory_limit_in_mb = memory_mib
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = f"{datetime.now(UTC):%Y/%m/%d}/[$LATEST]{uuid.uuid4().hex}"
        self._timeout_sec = timeout_sec
        self._deadline = time.monotonic() + timeout_sec
        self.log: list[str] | None = None  # set to collect what this invocation prints (Lambda's LogType=Tail)

    def restart_clock(self, timeout_sec: float | None = None) -> None:
        self._deadline = time.monotonic() + (self._timeout_sec if timeout_sec is None else timeout_sec)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def import_handler(path: str) -> Handler:
    """`servestack.adapters.asynchronous.worker_handler` -> the function (imported once, as Lambda's init does)."""
    module_name, _, attribute = path.rpartition(".")
    handler: Handler = getattr(importlib.import_module(module_name), attribute)
    return handler


_running = threading.local()


def current_context() -> LambdaContext | None:
    """The context of the invocation running on this thread, if any."""
    context: LambdaContext | None = getattr(_running, "context", None)
    return context


def _call_with_loop(handler: Handler, event: Any, context: LambdaContext) -> Any:
    """Run one invocation with a current event loop (Mangum runs the ASGI app on it), then close it."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    _running.context = context
    try:
        return handler(event, context)
    finally:
        _running.context = None
        asyncio.set_event_loop(None)
        loop.close()


class LocalFunction:
    """A Lambda function on this machine: `invoke(event)` returns the handler's result or raises."""

    def __init__(self, name: str, handler: str | Handler, *, timeout_sec: float, memory_mib: int = 2048) -> None:
        self.name = name
        self.handler = import_handler(handler) if isinstance(handler, str) else handler
        self.timeout_sec = timeout_sec
        self.memory_mib = memory_mib
        self._lock = threading.Lock()
        self._instance = self._new_instance()

    def _new_instance(self) -> concurrent.futures.ThreadPoolExecutor:
        return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self.name)

    def close(self) -> None:
        self._instance.shutdown(wait=True, cancel_futures=True)

    def new_context(self) -> LambdaContext:
        return LambdaContext(self.name, self.timeout_sec, self.memory_mib)

    def invoke(self, event: Any, context: LambdaContext | None = None, *, deadline: float | None = None) -> Any:
        """Run the handler on `event` (any JSON value, as Lambda allows); the timeout starts once it runs.

        `deadline` (time.monotonic()): the caller gives up then, so the wait for the instance and the run
        together end by it: `FunctionThrottled` if the instance is still busy then, `FunctionTimeout` if the
        run is cut short by it. Without one, the call waits for the instance as long as it takes."""
        wait_sec = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._lock.acquire(timeout=wait_sec):  # one event at a time per instance, as Lambda runs them
            raise FunctionThrottled(f"{self.name}: no free instance within {wait_sec:.2f}s")
        try:
            run_sec = self.timeout_sec if deadline is None else min(self.timeout_sec, deadline - time.monotonic())
            context = context or self.new_context()
            context.restart_clock(run_sec)
            future = self._instance.submit(_call_with_loop, self.handler, event, context)
            try:
                return future.result(timeout=max(0.0, run_sec))
            except concurrent.futures.TimeoutError:
                self._instance.shutdown(wait=False, cancel_futures=True)
                self._instance = self._new_instance()
                message = f"{context.aws_request_id} Task timed out after {max(0.0, run_sec):.2f} seconds"
                logger.error("%s: %s", self.name, message)
                raise FunctionTimeout(message) from None
        finally:
            self._lock.release()


def http_api_event(
    method: str, target: str, headers: dict[str, str], body: bytes, host: str, source_ip: str
) -> dict[str, Any]:
    """An API Gateway HTTP API (payload format 2.0) event, field for field as API Gateway sends it."""
    parsed = urllib.parse.urlsplit(target)
    lowered = {name.lower(): value for name, value in headers.items()}
    lowered.setdefault("x-forwarded-proto", "http")
    lowered["host"] = host
    try:
        text, binary = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, binary = base64.b64encode(body).decode(), True
    now = datetime.now(UTC)
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": parsed.path,
        "rawQueryString": parsed.query,
        "headers": lowered,
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": "local",
            "domainName": host,
            "domainPrefix": host.split(".")[0],
            "http": {
                "method": method,
                "path": parsed.path,
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": lowered.get("user-agent", ""),
            },
            "requestId": uuid.uuid4().hex[:16],
            "routeKey": "$default",
            "stage": "$default",
            "time": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "timeEpoch": int(now.timestamp() * 1000),
        },
        "isBase64Encoded": binary,
    }
    if "cookie" in lowered:
        event["cookies"] = [c.strip() for c in lowered.pop("cookie").split(";")]
    if parsed.query:
        query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
        event["queryStringParameters"] = {k: ",".join(v) for k, v in query.items()}
    if body:
        event["body"] = text
    return event


class HttpFront:
    """A local HTTP API: each request becomes a v2 event for `function`; its response goes back as HTTP.

    Served by local mode's one HTTP stack (servestack/local/hosting/http_server.py): bodies chunked or sized, at most
    `max_body_bytes` (Lambda's 6 MB payload limit by default), within the read deadline; refusals carry
    API Gateway's `{"message": ...}`. A request waits for the function's instance no longer than the
    function's timeout: then it is throttled (429), as Lambda throttles rather than queues."""

    def __init__(
        self,
        function: LocalFunction,
        port: int,
        host: str = "127.0.0.1",
        *,
        max_body_bytes: int = MAX_BODY_BYTES,
        body_timeout_sec: float = BODY_TIMEOUT_SEC,
    ) -> None:
        self.function = function
        self.host = host
        self.server = LocalHttpServer(
            f"front-{function.name}",
            self.handle,
            port,
            host,
            max_body_bytes=max_body_bytes,
            body_timeout_sec=body_timeout_sec,
        )
        self.port = self.server.port
        self.url = self.server.url

    def handle(self, request: Request) -> Reply:
        target = request.path + (f"?{request.raw_query}" if request.raw_query else "")
        event = http_api_event(
            request.method, target, request.headers, request.body, f"{self.host}:{self.port}", request.source_ip
        )
        return Reply(*self.call(event))

    def call(self, event: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        """Invoke the function for one request; the request ends within the function's timeout, waiting
        for the instance included (a caller stuck behind others would otherwise outlive its timeout)."""
        try:
            response = self.function.invoke(event, deadline=time.monotonic() + self.function.timeout_sec)
        except FunctionThrottled:
            return 429, {"content-type": "application/json"}, b'{"message":"Too Many Requests"}'
        except FunctionTimeout:
            return 504, {"content-type": "application/json"}, b'{"message":"Endpoint request timed out"}'
        except Exception:
            logger.exception("%s: the handler raised", self.function.name)
            return 500, {"content-type": "application/json"}, b'{"message":"Internal Server Error"}'
        if not isinstance(response, dict) or "statusCode" not in response:  # HTTP API's 2.0 shorthand
            import json

            return 200, {"content-type": "application/json"}, json.dumps(response).encode()
        raw = response.get("body") or ""
        payload = base64.b64decode(raw) if response.get("isBase64Encoded") else raw.encode()
        headers = {str(k): str(v) for k, v in (response.get("headers") or {}).items()}
        return int(response["statusCode"]), headers, payload

    def serve_in_background(self) -> HttpFront:
        self.server.serve_in_background()
        return self

    def close(self) -> None:
        self.server.close()
