"""SageMaker Runtime's `InvokeEndpoint` and `InvokeEndpointAsync` in front of the deployments of `local up`.

The wire format is botocore's sagemaker-runtime service-2.json (protocol rest-json):
- `POST /endpoints/{EndpointName}/invocations` goes to the realtime deployment of that name: its container's
  `/invocations`, with the request headers the container reads (Content-Type, Accept, Target-Model, Custom
  Attributes, Target-Variant, Inference-Id). A 2xx answer comes back with `Content-Type`,
  `x-Amzn-Invoked-Production-Variant` and the container's custom attributes; a 4xx/5xx comes back as
  SageMaker wraps it: 424 `ModelError` with `OriginalStatusCode`, `OriginalMessage` and `LogStreamArn`.
- `POST /endpoints/{EndpointName}/async-invocations` goes to the async deployment of that name: the payload
  (read from `X-Amzn-SageMaker-InputLocation` on the emulator's S3, or the request body) is submitted as a
  job; the answer is 202 `{"InferenceId"}` with `X-Amzn-SageMaker-OutputLocation`, where the worker writes
  the result.
- Bad requests and unknown endpoints are 400 `ValidationError`; a container that does not answer is 503
  `ServiceUnavailable`. Errors carry `x-amzn-ErrorType`, which botocore reads for the exception's class.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

import httpx

from servestack.local.http_server import Reply, Request, request_id
from servestack.local.lambda_runtime import ACCOUNT, REGION

ENDPOINT_PREFIX = "/endpoints/"
ENDPOINT_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
FORWARDED = (
    "content-type",
    "accept",
    "x-amzn-sagemaker-target-model",
    "x-amzn-sagemaker-custom-attributes",
    "x-amzn-sagemaker-target-variant",
    "x-amzn-sagemaker-inference-id",
)
CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"
VARIANT = "x-amzn-invoked-production-variant"
REALTIME_TIMEOUT_SEC = 60.0  # SageMaker gives a container 60 s to answer /invocations


@dataclass(frozen=True)
class RealtimeTarget:
    url: str  # the realtime container (`handlers.realtime serve`)
    variants: tuple[str, ...] = ("primary",)


@dataclass(frozen=True)
class AsyncTarget:
    url: str  # the async deployment's submit API (`POST /jobs`)
    bucket: str
    result_prefix: str
    presign_threshold_bytes: int


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
    """The two invoke operations over the deployments of one `local up`, through one pooled HTTP client."""

    def __init__(self, realtime: dict[str, RealtimeTarget], asynchronous: dict[str, AsyncTarget], s3: Any) -> None:
        self.realtime = realtime
        self.asynchronous = asynchronous
        self.s3 = s3
        self.http = httpx.Client(
            timeout=httpx.Timeout(REALTIME_TIMEOUT_SEC, connect=5.0),
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
        wanted_variant = request.header("x-amzn-sagemaker-target-variant")
        if wanted_variant is not None and wanted_variant not in target.variants:
            return validation_error(
                f"TargetVariant {wanted_variant} is not a production variant of endpoint {name}; "
                f"its variants: {', '.join(target.variants)}"
            )
        headers = {key: value for key in FORWARDED if (value := request.header(key)) is not None}
        try:
            response = self.http.post(f"{target.url}/invocations", content=request.body, headers=headers)
        except httpx.TimeoutException:
            message = f"Your invocation timed out while waiting for a response from container {target.variants[0]}."
            return self._model_error(name, target.variants[0], 0, message)
        except httpx.HTTPError as error:
            return sagemaker_error(
                503, "ServiceUnavailable", f"Endpoint {name}: its container at {target.url} is not answering ({error})"
            )
        variant = response.headers.get(VARIANT) or wanted_variant or target.variants[0]
        if response.status_code >= 400:
            return self._model_error(name, variant, response.status_code, response.text)
        reply_headers = {
            "Content-Type": response.headers.get("content-type", "application/octet-stream"),
            "x-Amzn-Invoked-Production-Variant": variant,
            "x-amzn-RequestId": request_id(),
        }
        if CUSTOM_ATTRIBUTES in response.headers:
            reply_headers["X-Amzn-SageMaker-Custom-Attributes"] = response.headers[CUSTOM_ATTRIBUTES]
        return Reply(200, reply_headers, response.content)

    def _model_error(self, name: str, variant: str, status: int, text: str) -> Reply:
        """A container's 4xx/5xx as SageMaker reports it to the caller."""
        group = f"/aws/sagemaker/Endpoints/{name}"
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
        payload = self._payload(request)
        if isinstance(payload, Reply):
            return payload
        content_type = request.header("x-amzn-sagemaker-content-type")
        accept = request.header("x-amzn-sagemaker-accept")
        inference_id = request.header("x-amzn-sagemaker-inference-id")
        job_id = self._submit(name, target, payload, content_type, accept, inference_id)
        if isinstance(job_id, Reply):
            return job_id
        headers = {
            "Content-Type": "application/json",
            "X-Amzn-SageMaker-OutputLocation": f"s3://{target.bucket}/{target.result_prefix}{job_id}",
            "x-amzn-RequestId": request_id(),
        }
        inference_id = request.header("x-amzn-sagemaker-inference-id") or job_id
        return Reply(202, headers, json.dumps({"InferenceId": inference_id}).encode())

    def _payload(self, request: Request) -> bytes | Reply:
        location = request.header("x-amzn-sagemaker-inputlocation")
        if location is None:
            if request.body:
                return request.body
            return validation_error("InputLocation: an S3 URI (s3://bucket/key) of the request payload is required")
        where = _s3_location(location)
        if where is None:
            return _constraint(location, "inputLocation", "Member must be an S3 URI: s3://bucket/key")
        try:
            return bytes(self.s3.get_object(Bucket=where[0], Key=where[1])["Body"].read())
        except Exception as error:  # botocore's ClientError (NoSuchKey, NoSuchBucket...) or the emulator away
            code = getattr(error, "response", {}).get("Error", {}).get("Code", type(error).__name__)
            return validation_error(f"InputLocation {location}: could not read the payload ({code})")

    def _submit(
        self,
        name: str,
        target: AsyncTarget,
        payload: bytes,
        content_type: str | None,
        accept: str | None,
        inference_id: str | None = None,
    ) -> str | Reply:
        """A job on the async deployment: inline up to its presign threshold, else through a presigned upload.
        `InferenceId` is the client token: it goes as the `Idempotency-Key`, so a retried call is one job."""
        headers = {
            key: value
            for key, value in (("Content-Type", content_type), ("Accept", accept), ("Idempotency-Key", inference_id))
            if value
        }
        try:
            if len(payload) <= target.presign_threshold_bytes:
                response = self.http.post(f"{target.url}/jobs", content=payload, headers=headers)
                if response.status_code != 202:
                    return self._submit_error(name, response)
                return str(response.json()["job_id"])
            response = self.http.post(
                f"{target.url}/jobs/uploads",
                json={"content_type": content_type, "accept": accept},
                headers={"Idempotency-Key": inference_id} if inference_id else None,
            )
            if response.status_code != 201:
                return self._submit_error(name, response)
            job = response.json()
            upload = job["upload"]
            put = self.http.request(upload["method"], upload["url"], content=payload, headers=upload["headers"])
            if put.status_code >= 300:
                return sagemaker_error(
                    500, "InternalFailure", f"Endpoint {name}: storing the payload failed ({put.status_code})"
                )
            confirmed = self.http.post(job["confirm_url"])
            if confirmed.status_code != 202:
                return self._submit_error(name, confirmed)
            return str(job["job_id"])
        except httpx.HTTPError as error:
            return sagemaker_error(
                503, "ServiceUnavailable", f"Endpoint {name}: its submit API at {target.url} is not answering ({error})"
            )

    def _submit_error(self, name: str, response: httpx.Response) -> Reply:
        try:
            detail = response.json()["error"]
            text = "; ".join(
                f"{key}: {detail[key]}" for key in ("message", "field", "value", "allowed") if key in detail
            )
        except (ValueError, KeyError, TypeError):
            text = response.text
        if response.status_code < 500:
            return validation_error(f"Endpoint {name}: the request was refused ({response.status_code}): {text}")
        return sagemaker_error(
            500, "InternalFailure", f"Endpoint {name}: submitting failed ({response.status_code}): {text}"
        )
