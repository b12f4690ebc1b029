"""SageMaker Runtime's `InvokeEndpoint` (and, for asynchronous endpoints, `InvokeEndpointAsync`) in front of
the SageMaker endpoints of the templates, refusing what SageMaker refuses, with its error codes and words.

The wire format is botocore's sagemaker-runtime service-2.json (protocol rest-json):
- `POST /endpoints/{EndpointName}/invocations` goes to the endpoint's router (servestack/local/sagemaker/endpoint.py):
  the container's `/invocations`, with the request headers the container reads. A 2xx comes back with
  `Content-Type`, `x-Amzn-Invoked-Production-Variant` and the custom attributes; a container 4xx/5xx comes
  back as SageMaker wraps it: 424 `ModelError` with `OriginalStatusCode`, `OriginalMessage`, `LogStreamArn`.
- Only endpoints the templates declare exist. An async deployment on Lambda has no SageMaker endpoint,
  so `InvokeEndpointAsync` on its name fails as it would in the cloud.

What SageMaker refuses (docs/sagemaker-strictness.md traces each rule to its source):
- an unknown endpoint: 400 `ValidationError` "Endpoint X of account N not found.";
- `TargetModel` on a single-model endpoint: 400 `ValidationError` "Endpoint X is not a multi-model endpoint
  and does not support target model header.";
- an unknown `TargetVariant`: 400 `ValidationError`;
- a body over 6 MB (6,291,456 bytes): 413 "HTTP content length exceeded 6291456 bytes.";
- a container that takes more than 60 s: 424 `ModelError` "Received server error (0) from <variant> with
  message "Your invocation timed out while waiting for a response from container <variant>. ..."";
- `InvokeEndpointAsync` without `InputLocation`, or with an input over 1 GB: 400 `ValidationError`.
On an endpoint hosting inference components (`InferenceComponentName`, header
`X-Amzn-SageMaker-Inference-Component`, routes to that component's container):
- no component name: 400 `ValidationError` "Inference Component Name header is required for endpoints to which
  you plan to deploy inference components. Please include Inference Component Name header or consider using
  SageMaker models.";
- a component the endpoint does not host (or a name on an endpoint without components): 400 `ValidationError`;
- a component with no copy (scaled to zero): 400 `ValidationError` "Inference Component has no capacity to
  process this request. ApplicationAutoScaling may be in-progress (if configured) or try to increase the capacity
  by invoking UpdateInferenceComponentRuntimeConfig API.", until a copy is in service again.
Errors carry `x-amzn-ErrorType`, which botocore reads for the exception's class.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from servestack.aws_rules import SAGEMAKER_ASYNC, SAGEMAKER_REALTIME
from servestack.local.cloudformation import ACCOUNT
from servestack.local.cloudformation import DEFAULT_REGION as REGION
from servestack.local.hosting import Reply, Request, request_id

ENDPOINT_PREFIX = "/endpoints/"
ENDPOINT_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
FORWARDED = (
    "content-type",
    "accept",
    "x-amzn-sagemaker-target-model",
    "x-amzn-sagemaker-custom-attributes",
    "x-amzn-sagemaker-target-variant",
    "x-amzn-sagemaker-inference-id",
    "x-amzn-sagemaker-inference-component",
)
CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"
VARIANT = "x-amzn-invoked-production-variant"
INFERENCE_COMPONENT = "x-amzn-sagemaker-inference-component"
# SageMaker's words for an endpoint with inference components (docs/sagemaker-strictness.md says where from).
COMPONENT_NAME_REQUIRED = (
    "Inference Component Name header is required for endpoints to which you plan to deploy inference components. "
    "Please include Inference Component Name header or consider using SageMaker models."
)
NO_CAPACITY = (
    "Inference Component has no capacity to process this request. ApplicationAutoScaling may be in-progress (if "
    "configured) or try to increase the capacity by invoking UpdateInferenceComponentRuntimeConfig API."
)
REALTIME_TIMEOUT_SEC = float(SAGEMAKER_REALTIME.timeout_sec)  # a container's time to answer /invocations


# InvokeEndpoint's Body: "Maximum length of 6291456"; asynchronous payloads: up to 1 GB (servestack/aws_rules.py).
MAX_BODY_BYTES = SAGEMAKER_REALTIME.max_payload_bytes
MAX_ASYNC_INPUT_BYTES = SAGEMAKER_ASYNC.max_payload_bytes


class ComponentCapacity(Protocol):
    """What the front needs of an inference component: its variant and its copies in service now."""

    @property
    def variant(self) -> str: ...

    @property
    def current_copies(self) -> int: ...


@dataclass(frozen=True)
class RealtimeTarget:
    url: str  # the endpoint's router
    variants: tuple[str, ...] = ("primary",)
    multi_model: bool = False  # the model's container Mode is MultiModel
    multi_model_front: Any = None  # servestack.local.sagemaker.multi_model.MultiModelFront, for MultiModel endpoints
    # Inference components the endpoint hosts, by name (servestack.local.sagemaker.inference_components.ComponentState).
    components: Mapping[str, ComponentCapacity] = field(default_factory=dict)
    # The body InvokeEndpoint takes: 6 MB, or Serverless Inference's 4 MB.
    max_body_bytes: int = MAX_BODY_BYTES


@dataclass(frozen=True)
class AsyncTarget:
    """A SageMaker asynchronous endpoint: `submit(bucket, key, content_type, accept, inference_id)` queues
    the invocation and returns its output location and failure location (None without an S3FailurePath)."""

    submit: Callable[[str, str, str | None, str | None, str], tuple[str, str | None]]


def sagemaker_error(status: int, code: str, message: str, **members: Any) -> Reply:
    """An error botocore turns into `client.exceptions.<code>`, its modeled members parsed from the body."""
    headers = {"Content-Type": "application/json", "x-amzn-ErrorType": code, "x-amzn-RequestId": request_id()}
    return Reply(status, headers, json.dumps({"Message": message, **members}).encode())


def validation_error(message: str) -> Reply:
    return sagemaker_error(400, "ValidationError", message)


def _constraint(value: str, member: str, constraint: str) -> Reply:
    return validation_error(
        f"1 validation error detected: Value '{value[:100]}' at '{member}' failed to satisfy constraint: {constraint}"
    )


def _validate(request: Request, name: str) -> Reply | None:
    """The server-side checks SageMaker makes that botocore does not make before sending."""
    if len(name) > 63 or not ENDPOINT_NAME.match(name):
        return _constraint(
            name, "endpointName", f"Member must satisfy regular expression pattern: {ENDPOINT_NAME.pattern}"
        )
    attributes = request.header(CUSTOM_ATTRIBUTES)
    if attributes is not None and (len(attributes) > 1024 or not attributes.isascii()):
        return _constraint(attributes, "customAttributes", "Member must be at most 1024 US-ASCII characters")
    inference_id = request.header("x-amzn-sagemaker-inference-id")
    if inference_id is not None and not 1 <= len(inference_id) <= 64:
        return _constraint(inference_id, "inferenceId", "Member must have length between 1 and 64")
    for header, member, low, high in (
        ("x-amzn-sagemaker-requestttlseconds", "requestTTLSeconds", 60, 21600),
        ("x-amzn-sagemaker-invocationtimeoutseconds", "invocationTimeoutSeconds", 1, 3600),
    ):
        raw = request.header(header)
        if raw is not None and (not raw.isdigit() or not low <= int(raw) <= high):
            return _constraint(raw, member, f"Member must be an integer between {low} and {high}")
    return None


def _s3_location(uri: str) -> tuple[str, str] | None:
    parsed = urllib.parse.urlsplit(uri)
    key = parsed.path.lstrip("/")
    return (parsed.netloc, key) if parsed.scheme == "s3" and parsed.netloc and key else None


class SageMakerRuntime:
    """The invoke operations over the endpoints of one `local up`, through one pooled HTTP client."""

    def __init__(
        self,
        realtime: dict[str, RealtimeTarget],
        asynchronous: dict[str, AsyncTarget],
        s3: Any,
        *,
        invocation_timeout_sec: float = REALTIME_TIMEOUT_SEC,
    ) -> None:
        self.realtime = realtime
        self.asynchronous = asynchronous
        self.s3 = s3
        self.http = httpx.Client(
            timeout=httpx.Timeout(invocation_timeout_sec, connect=5.0),
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
        )

    def close(self) -> None:
        self.http.close()

    def handle(self, request: Request) -> Reply:
        rest = request.path[len(ENDPOINT_PREFIX) :]
        name, _, operation = rest.partition("/")
        name = urllib.parse.unquote(name)
        if request.method != "POST" or operation not in ("invocations", "async-invocations"):
            return sagemaker_error(
                404, "UnknownOperationException", f"{request.method} {request.path}: no such operation"
            )
        invalid = _validate(request, name)
        if invalid is not None:
            return invalid
        if operation == "invocations":
            return self.invoke_endpoint(name, request)
        return self.invoke_endpoint_async(name, request)

    def _missing(self, name: str, operation: str) -> Reply:
        if name in self.realtime or name in self.asynchronous:
            right = "InvokeEndpoint" if name in self.realtime else "InvokeEndpointAsync"
            kind = "a realtime" if name in self.realtime else "an asynchronous"
            return validation_error(
                f"Endpoint {name} of account {ACCOUNT} is {kind} endpoint; call {right}, not {operation}."
            )
        return validation_error(f"Endpoint {name} of account {ACCOUNT} not found.")

    # -------------------------------------------------------------------------------------- InvokeEndpoint
    def invoke_endpoint(self, name: str, request: Request) -> Reply:
        target = self.realtime.get(name)
        if target is None:
            return self._missing(name, "InvokeEndpoint")
        if len(request.body) > target.max_body_bytes:
            # No error type: botocore reports the status code ("An error occurred (413)"), as public threads show.
            body = json.dumps({"message": f"HTTP content length exceeded {target.max_body_bytes} bytes."}).encode()
            return Reply(413, {"Content-Type": "application/json", "x-amzn-RequestId": request_id()}, body)
        target_model = request.header("x-amzn-sagemaker-target-model")
        if target.multi_model and target.multi_model_front is not None:
            # SageMaker's multi-model orchestration: fetch the archive, load it, invoke it (multi_model.py).
            reply: Reply = target.multi_model_front.invoke(target_model, request)
            return reply
        if target_model is not None:
            return validation_error(
                f"Endpoint {name} is not a multi-model endpoint and does not support target model header."
            )
        wanted_variant = request.header("x-amzn-sagemaker-target-variant")
        if wanted_variant is not None and wanted_variant not in target.variants:
            return validation_error(
                f"The variant {wanted_variant} is not a production variant of endpoint {name} "
                f"(its variants: {', '.join(target.variants)})."
            )
        component_name = request.header(INFERENCE_COMPONENT)
        component = None
        if component_name is not None or target.components:
            if component_name is None:
                return validation_error(COMPONENT_NAME_REQUIRED)
            component = target.components.get(component_name)
            if component is None:
                return validation_error(f"Inference Component {component_name} of account {ACCOUNT} not found.")
            if component.current_copies < 1:
                return validation_error(NO_CAPACITY)
        headers = {key: value for key in FORWARDED if (value := request.header(key)) is not None}
        try:
            response = self.http.post(f"{target.url}/invocations", content=request.body, headers=headers)
        except httpx.TimeoutException:
            variant = component.variant if component else wanted_variant or target.variants[0]
            message = (
                f"Your invocation timed out while waiting for a response from container {variant}. Review the "
                "latency metrics for each container in Amazon CloudWatch, resolve the issue, and try again."
            )
            return self._model_error(name, variant, 0, message, component_name)
        except httpx.HTTPError as error:
            return sagemaker_error(
                503, "ServiceUnavailable", f"Endpoint {name}: its container at {target.url} is not answering ({error})"
            )
        # A component's answer names the variant hosting it (the router names the component's container).
        variant = (
            component.variant if component else response.headers.get(VARIANT) or wanted_variant or target.variants[0]
        )
        refusal = response.headers.get("x-amzn-errortype")
        if response.status_code in (429, 502, 503) and refusal in ("ThrottlingException", "ServiceUnavailable"):
            # the endpoint's own refusal (its router: too many requests held, a container unreachable or starting
            # again), not a container's answer: SageMaker's retryable error, as boto3's standard retry mode knows it
            try:
                message = str(response.json()["error"]["message"])
            except (ValueError, KeyError, TypeError):
                message = refusal
            return sagemaker_error(429 if refusal == "ThrottlingException" else 503, refusal, message)
        if response.status_code >= 400:
            return self._model_error(name, variant, response.status_code, response.text, component_name)
        reply_headers = {
            "Content-Type": response.headers.get("content-type", "application/octet-stream"),
            "x-Amzn-Invoked-Production-Variant": variant,
            "x-amzn-RequestId": request_id(),
        }
        if CUSTOM_ATTRIBUTES in response.headers:
            reply_headers["X-Amzn-SageMaker-Custom-Attributes"] = response.headers[CUSTOM_ATTRIBUTES]
        return Reply(200, reply_headers, response.content)

    def _model_error(self, name: str, variant: str, status: int, text: str, component: str | None = None) -> Reply:
        """A container's 4xx/5xx (or its silence) as SageMaker reports it to the caller; a component's container
        logs to its own group."""
        group = f"/aws/sagemaker/InferenceComponents/{component}" if component else f"/aws/sagemaker/Endpoints/{name}"
        kind = "client" if 400 <= status < 500 else "server"
        message = (
            f'Received {kind} error ({status}) from {variant} with message "{text}". See '
            f"https://{REGION}.console.aws.amazon.com/cloudwatch/home?region={REGION}#logEventViewer:group={group} "
            f"in account {ACCOUNT} for more information."
        )
        arn = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}"
        return sagemaker_error(
            424, "ModelError", message, OriginalStatusCode=status, OriginalMessage=text, LogStreamArn=arn
        )

    # --------------------------------------------------------------------------------- InvokeEndpointAsync
    def invoke_endpoint_async(self, name: str, request: Request) -> Reply:
        target = self.asynchronous.get(name)
        if target is None:
            return self._missing(name, "InvokeEndpointAsync")
        location = request.header("x-amzn-sagemaker-inputlocation")
        if location is None:
            return _constraint("null", "inputLocation", "Member must not be null")
        where = _s3_location(location)
        if where is None:
            return _constraint(
                location,
                "inputLocation",
                "Member must satisfy regular expression pattern: ^(https|s3)://([^/]+)/?(.*)$",
            )
        try:
            size = int(self.s3.head_object(Bucket=where[0], Key=where[1])["ContentLength"])
        except Exception as error:  # botocore's ClientError (404, 403...) or the emulator away
            code = getattr(error, "response", {}).get("Error", {}).get("Code", type(error).__name__)
            return validation_error(f"Could not access the input location {location} ({code}).")
        if size > MAX_ASYNC_INPUT_BYTES:
            return validation_error(
                f"The input at {location} is {size} bytes; asynchronous inference accepts up to "
                f"{MAX_ASYNC_INPUT_BYTES} bytes (1 GB)."
            )
        inference_id = request.header("x-amzn-sagemaker-inference-id") or str(uuid.uuid4())
        output, failure = target.submit(
            where[0], where[1], request.header("x-amzn-sagemaker-content-type"),
            request.header("x-amzn-sagemaker-accept"), inference_id,
        )  # fmt: skip
        headers = {
            "Content-Type": "application/json",
            "X-Amzn-SageMaker-OutputLocation": output,
            "x-amzn-RequestId": request_id(),
        }
        if failure is not None:
            headers["X-Amzn-SageMaker-FailureLocation"] = failure
        return Reply(202, headers, json.dumps({"InferenceId": inference_id}).encode())
