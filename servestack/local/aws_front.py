"""The AWS API front of `local up`: one port where boto3's `sagemaker-runtime` and `lambda` clients work unchanged.

`boto3.client("sagemaker-runtime", endpoint_url=URL)` and `boto3.client("lambda", endpoint_url=URL)` talk to
this server (their paths do not collide):
- `/endpoints/{EndpointName}/...`: servestack/local/sagemaker_front.py;
- `/2015-03-31/functions/{FunctionName}/invocations`: routed here by function name (a name, `name:qualifier`,
  a partial or full ARN of any account and region) to the child process that runs that function, whose
  Invoke API (servestack/local/lambda_invoke.py) runs the handler. Function names: servestack/local/resources.py
  `function_names`. Qualifiers: `$LATEST` and any alias run the working tree; a numbered version is not found.
"""

from __future__ import annotations

import re
import urllib.parse

import httpx

from servestack.local.http_server import HOP_BY_HOP, LocalHttpServer, Reply, Request
from servestack.local.lambda_invoke import INVOKE_PREFIX, INVOKE_SUFFIX, lambda_error, not_found
from servestack.local.sagemaker_front import ENDPOINT_PREFIX, SageMakerRuntime

FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
QUALIFIER = re.compile(r"^[a-zA-Z0-9$_-]{1,128}$")
LAMBDA_HEADERS = ("x-amz-invocation-type", "x-amz-log-type", "x-amz-client-context", "content-type")


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


class LambdaRouter:
    """`lambda.invoke` by function name -> the Invoke API of the child process that runs the function."""

    def __init__(self, names: dict[str, str], hosts: dict[str, str], http: httpx.Client) -> None:
        self.names = names  # public name -> function (see resources.function_names)
        self.hosts = hosts  # function -> its child's Invoke API URL
        self.http = http

    def handle(self, request: Request) -> Reply:
        raw = urllib.parse.unquote(request.path[len(INVOKE_PREFIX) : -len(INVOKE_SUFFIX)])
        parsed = parse_function_name(raw)
        if parsed is None:
            return lambda_error(
                400,
                "ValidationException",
                f"1 validation error detected: Value '{raw[:140]}' at 'functionName' failed to satisfy constraint: "
                "Member must be a function name, name:qualifier, or a function ARN",
            )
        name, qualifier = parsed
        query_qualifier = request.query.get("Qualifier") or None
        if qualifier and query_qualifier and qualifier != query_qualifier:
            message = "The derived qualifier from the function name does not match the specified qualifier."
            return lambda_error(400, "InvalidParameterValueException", message)
        qualifier = qualifier or query_qualifier
        function = self.names.get(name)
        if function is None or (qualifier is not None and qualifier.isdigit()):
            return not_found(name, qualifier)  # local mode has no numbered versions, only $LATEST and aliases
        headers = {key: value for key in LAMBDA_HEADERS if (value := request.header(key)) is not None}
        url = f"{self.hosts[function]}{INVOKE_PREFIX}{urllib.parse.quote(function)}{INVOKE_SUFFIX}"
        try:
            response = self.http.post(url, content=request.body, headers=headers)
        except httpx.HTTPError as error:
            return lambda_error(
                500, "ServiceException", f"{name}: its process is not answering ({error})", kind="Service"
            )
        kept = {key: value for key, value in response.headers.items() if key.lower() not in HOP_BY_HOP}
        return Reply(response.status_code, kept, response.content)


class AwsFront:
    """SageMaker Runtime and Lambda Invoke on one port."""

    def __init__(self, sagemaker: SageMakerRuntime, functions: LambdaRouter, port: int = 0) -> None:
        self.sagemaker = sagemaker
        self.functions = functions
        self.server = LocalHttpServer("aws-api", self.handle, port)
        self.url = self.server.url

    def handle(self, request: Request) -> Reply:
        path = request.path
        if path.startswith(ENDPOINT_PREFIX):
            return self.sagemaker.handle(request)
        if request.method == "POST" and path.startswith(INVOKE_PREFIX) and path.endswith(INVOKE_SUFFIX):
            return self.functions.handle(request)
        return lambda_error(
            404,
            "UnknownOperationException",
            f"{request.method} {path}: local up answers SageMaker Runtime InvokeEndpoint/InvokeEndpointAsync "
            "and Lambda Invoke here",
        )

    def serve_in_background(self) -> AwsFront:
        self.server.serve_in_background()
        return self

    def close(self) -> None:
        self.server.close()
        self.sagemaker.close()
        self.functions.http.close()
