"""API Gateway HTTP APIs of the templates, on this machine: routes, their authorizers, Lambda proxy
integrations (payload format 2.0), as API Gateway runs them.

- A request is matched to the most specific route (`METHOD /exact/path`, then `{param}` paths, then
  `{proxy+}`, then `ANY`, then `$default`); no match is 404 `{"message":"Not Found"}`.
- `AWS_IAM` routes need a SigV4-signed request (service `execute-api`) whose signer may
  `execute-api:Invoke` the route's ARN (`arn:aws:execute-api:{region}:{account}:{apiId}/{stage}/{METHOD}/{path}`);
  anything else is API Gateway's 403. The caller's identity goes into `requestContext.authorizer.iam`.
- The integration invokes the function through the Lambda service (servestack/local/lambda_/service.py) with
  the integration's timeout: past it, 503 `Service Unavailable`; a function error, 500
  `Internal Server Error`; a throttle, 429 `Too Many Requests` (API Gateway's bodies).
- Bodies over HTTP API's 10 MB quota get 413 before they are read.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from servestack.local.apigateway.definitions import HttpApiDef, RouteDef
from servestack.local.hosting import LocalHttpServer, Reply, Request, request_id
from servestack.local.lambda_ import LambdaService, http_api_event

logger = logging.getLogger("servestack.local")
MAX_PAYLOAD_BYTES = 10 * 1024 * 1024  # HTTP API's request quota
STAGE = "$default"

# (request, the execute-api ARN of the route) -> the caller's identity fields, or API Gateway's refusal.
Authorize = Callable[[Request, str], "dict[str, Any] | Reply"]


def gateway_error(status: int, message: str) -> Reply:
    return Reply(status, {"Content-Type": "application/json", "apigw-requestid": request_id()},
                 json.dumps({"message": message}).encode())  # fmt: skip


@dataclass(frozen=True)
class CompiledRoute:
    route: RouteDef
    method: str | None  # None: ANY or $default
    pattern: re.Pattern[str] | None  # None: $default
    rank: tuple[int, int]  # lower is more specific

    @classmethod
    def of(cls, route: RouteDef) -> CompiledRoute:
        if route.route_key == "$default":
            return cls(route, None, None, (9, 0))
        method, _, path = route.route_key.partition(" ")
        regex, greedy, params = "", False, 0
        for segment in path.strip("/").split("/") if path.strip("/") else []:
            if segment.endswith("+}"):
                regex += "/.+"
                greedy = True
            elif segment.startswith("{"):
                regex += "/[^/]+"
                params += 1
            else:
                regex += "/" + re.escape(segment)
        pattern = re.compile("^" + (regex or "/") + "/?$")
        rank = (2 if greedy else 1 if params else 0) + (3 if method == "ANY" else 0)
        return cls(route, None if method == "ANY" else method, pattern, (rank, -len(path)))

    def matches(self, method: str, path: str) -> bool:
        if self.pattern is None:
            return True
        return (self.method is None or self.method == method) and bool(self.pattern.match(path))


class HttpApiFront:
    """One HTTP API on its own port."""

    def __init__(
        self,
        api: HttpApiDef,
        lambdas: LambdaService,
        authorize: Authorize | None,
        *,
        port: int = 0,
    ) -> None:
        self.api = api
        self.lambdas = lambdas
        self.authorize = authorize
        self.routes = sorted((CompiledRoute.of(r) for r in api.routes), key=lambda c: c.rank)
        self.server = LocalHttpServer(
            f"api-{api.api_id}",
            self.handle,
            port,
            max_body_bytes=MAX_PAYLOAD_BYTES,
            too_large=lambda _length: gateway_error(413, "Request Entity Too Large"),
        )
        self.url = self.server.url

    def serve_in_background(self) -> HttpApiFront:
        self.server.serve_in_background()
        return self

    def close(self) -> None:
        self.server.close()

    def handle(self, request: Request) -> Reply:
        path = urllib.parse.unquote(request.path) or "/"
        route = next((c for c in self.routes if c.matches(request.method, path)), None)
        if route is None:
            return gateway_error(404, "Not Found")
        identity: dict[str, Any] | None = None
        if route.route.authorization == "AWS_IAM":
            if self.authorize is None:
                return gateway_error(403, "Forbidden")
            resource = f"{self.api.arn}/{STAGE}/{request.method}{path}"
            checked = self.authorize(request, resource)
            if isinstance(checked, Reply):
                return checked
            identity = checked
        elif route.route.authorization not in ("NONE", ""):
            return gateway_error(500, f"local mode runs NONE and AWS_IAM authorizers, not {route.route.authorization}")
        target = request.path + (f"?{request.raw_query}" if request.raw_query else "")
        host = request.header("host") or urllib.parse.urlsplit(self.url).netloc
        event = http_api_event(request.method, target, request.headers, request.body, host, "127.0.0.1")
        event["routeKey"] = event["requestContext"]["routeKey"] = route.route.route_key
        event["requestContext"]["apiId"] = self.api.api_id
        if identity is not None:
            event["requestContext"]["authorizer"] = {"iam": identity}
        return self._invoke(route.route, event)

    def _invoke(self, route: RouteDef, event: dict[str, Any]) -> Reply:
        try:
            invocation = self.lambdas.invoke(
                route.function, json.dumps(event).encode(), qualifier=route.qualifier,
                timeout_sec=route.timeout_ms / 1000,
            )  # fmt: skip
        except httpx.TimeoutException:
            return gateway_error(503, "Service Unavailable")
        if invocation.status == 429:
            return gateway_error(429, "Too Many Requests")
        if invocation.status != 200 or invocation.function_error:
            logger.error("%s: integration failed: %s", route.function, invocation.body[:2000].decode(errors="replace"))
            return gateway_error(500, "Internal Server Error")
        try:
            response = json.loads(invocation.body)
        except ValueError:
            return gateway_error(500, "Internal Server Error")
        return lambda_response(response)


def lambda_response(response: Any) -> Reply:
    """A Lambda proxy response (payload format 2.0) as API Gateway turns it into HTTP."""
    if not isinstance(response, dict) or "statusCode" not in response:  # 2.0's shorthand: the value is the body
        return Reply(200, {"Content-Type": "application/json"}, json.dumps(response).encode())
    raw = response.get("body") or ""
    try:
        body = base64.b64decode(raw) if response.get("isBase64Encoded") else str(raw).encode()
    except ValueError:
        return gateway_error(500, "Internal Server Error")
    headers = {str(k): str(v) for k, v in (response.get("headers") or {}).items()}
    if response.get("cookies"):
        headers["Set-Cookie"] = ", ".join(str(c) for c in response["cookies"])
    return Reply(int(response["statusCode"]), headers, body)
