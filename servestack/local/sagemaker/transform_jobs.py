"""SageMaker's `CreateTransformJob` and `DescribeTransformJob` on `local up`'s AWS API port (boto3's `sagemaker`
client; JSON protocol, `X-Amz-Target: SageMaker.<Operation>`), so that the call an engine: transform schedule
makes in AWS is made locally too, as the schedule's role, and refused as SageMaker refuses it.

In AWS, EventBridge Scheduler's universal target `aws-sdk:sagemaker:createTransformJob` sends the schedule's
input as the CreateTransformJob request, signed as the schedule's role (servestack/cdk/batch.py). Here:
- the AWS front authorizes the call first (`sagemaker:CreateTransformJob` / `sagemaker:DescribeTransformJob`
  on `arn:aws:sagemaker:{region}:{account}:transform-job/{name lower-cased}`; servestack/local/iam/operations.py);
- the request is checked against botocore's own service model of SageMaker: required members, string lengths
  and patterns, enums, integer bounds, as SageMaker's front door does, with its message format
  ("1 validation error detected: Value 'x' at 'transformResources.instanceCount' failed to satisfy
  constraint: ..."); botocore's client checks only some of these (required members, minimums) before sending;
- then what the API reference adds: `MaxPayloadInMB` at most 100, the model must exist, a name is used once
  (SageMaker keeps every job's record; a name cannot be reused even after the job ended);
- an `S3Prefix` input under which no object exists is refused as SageMaker refuses it, before any job runs
  (`ValidationException` "No S3 objects found under S3 URL ...", quoted in aws/amazon-sagemaker-examples issue
  #2414): an engine: transform run over an empty prefix fails at its schedule's call, which is retried, then
  dead-lettered, and counted by the deployment's failure alarm (docs/batch.md, "A run with no input");
- the job is recorded `InProgress`. `servestack local run-batch` runs it (servestack/local/sagemaker/transform.py) and
  reports its end here (`Completed`, or `Failed` with the reason), which DescribeTransformJob then answers.
  That report is local up's own route (`POST /_servestack/transform-jobs/{name}`), not an AWS API.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from servestack.local.hosting import Reply, Request, request_id
from servestack.local.sagemaker.inference_components import TARGET_PREFIX, json_body, json_error

OPERATIONS = ("CreateTransformJob", "DescribeTransformJob")
REPORT_PREFIX = "/_servestack/transform-jobs/"
# The API reference of CreateTransformJob, MaxPayloadInMB: "The value of MaxPayloadInMB cannot be greater than
# 100 MB." botocore's model gives only the minimum (0).
MAX_PAYLOAD_MB = 100
ENDED = ("Completed", "Failed", "Stopped")


@cache
def _shapes() -> dict[str, Any]:
    """botocore's SageMaker service model (its shapes), loaded once: the constraints SageMaker publishes."""
    from botocore.loaders import Loader

    shapes: dict[str, Any] = Loader().load_service_model("sagemaker", "service-2")["shapes"]
    return shapes


def _member_path(parent: str, member: str) -> str:
    """SageMaker names members in camelCase, nested with dots: `transformResources.instanceCount`."""
    name = member[:1].lower() + member[1:]
    return f"{parent}.{name}" if parent else name


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)[:100]


def constraint_errors(shape_name: str, value: Any, path: str = "") -> list[str]:
    """Each way `value` breaks the published constraints of `shape_name`, in SageMaker's words."""
    shape = _shapes()[shape_name]
    kind = shape["type"]
    found: list[str] = []

    def failed(constraint: str) -> None:
        found.append(f"Value '{_shown(value)}' at '{path}' failed to satisfy constraint: {constraint}")

    if kind == "structure":
        if not isinstance(value, dict):
            failed("Member must be a structure")
            return found
        for member in shape.get("required", []):
            if value.get(member) is None:
                missing = _member_path(path, member)
                found.append(f"Value null at '{missing}' failed to satisfy constraint: Member must not be null")
        for member, spec in shape.get("members", {}).items():
            if value.get(member) is not None:
                found += constraint_errors(spec["shape"], value[member], _member_path(path, member))
    elif kind == "string":
        if not isinstance(value, str):
            failed("Member must be a string")
        elif "enum" in shape and value not in shape["enum"]:
            failed(f"Member must satisfy enum value set: [{', '.join(shape['enum'])}]")
        elif len(value) < shape.get("min", 0) or len(value) > shape.get("max", len(value)):
            failed(f"Member must have length between {shape.get('min', 0)} and {shape.get('max', 'any')}")
        elif "pattern" in shape and re.fullmatch(shape["pattern"], value) is None:
            # SageMaker's message anchors the pattern (public reports quote "pattern: ^[a-zA-Z0-9](-*...").
            failed(f"Member must satisfy regular expression pattern: ^{shape['pattern'].removeprefix('^')}")
    elif kind in ("integer", "long"):
        if isinstance(value, bool) or not isinstance(value, int):
            failed("Member must be an integer")
        elif "min" in shape and value < shape["min"]:
            failed(f"Member must have value greater than or equal to {shape['min']}")
        elif "max" in shape and value > shape["max"]:
            failed(f"Member must have value less than or equal to {shape['max']}")
    elif kind in ("list", "map"):
        if not isinstance(value, list | dict):
            failed(f"Member must be a {kind}")
        elif len(value) < shape.get("min", 0) or len(value) > shape.get("max", len(value)):
            failed(f"Member must have length between {shape.get('min', 0)} and {shape.get('max', 'any')}")
    elif kind == "boolean" and not isinstance(value, bool):
        failed("Member must be a boolean")
    return found


def validation_exception(errors: list[str]) -> Reply:
    count = f"{len(errors)} validation error{'s' if len(errors) > 1 else ''} detected"
    return json_error("ValidationException", f"{count}: {'; '.join(errors)}")


@dataclass
class TransformJob:
    """One job's record, as DescribeTransformJob reports it."""

    request: dict[str, Any]
    arn: str
    status: str = "InProgress"
    failure_reason: str | None = None
    created: float = field(default_factory=time.time)
    ended: float | None = None

    def describe(self) -> dict[str, Any]:
        answer: dict[str, Any] = {
            key: self.request[key]
            for key in (
                "TransformJobName", "ModelName", "MaxConcurrentTransforms", "ModelClientConfig", "MaxPayloadInMB",
                "BatchStrategy", "Environment", "TransformInput", "TransformOutput", "DataCaptureConfig",
                "TransformResources", "DataProcessing", "ExperimentConfig",
            )
            if key in self.request
        }  # fmt: skip
        answer |= {
            "TransformJobArn": self.arn,
            "TransformJobStatus": self.status,
            "CreationTime": self.created,
            "TransformStartTime": self.created,
        }
        if self.ended is not None:
            answer["TransformEndTime"] = self.ended
        if self.failure_reason:
            answer["FailureReason"] = self.failure_reason[:1024]
        return answer


def _ok(body: dict[str, Any]) -> Reply:
    headers = {"Content-Type": "application/x-amz-json-1.1", "x-amzn-RequestId": request_id()}
    return Reply(200, headers, json.dumps(body).encode())


class TransformJobs:
    """The transform jobs created on one `local up`, by name."""

    CONTROL_ROUTES = (("POST", f"{REPORT_PREFIX}{{job}}"),)  # local up's own (the developer's signature)

    def __init__(
        self,
        models: Iterable[str],
        region: str,
        account: str,
        *,
        has_objects: Callable[[str, str], bool] | None = None,
        model_roles: Mapping[str, str] | None = None,
    ) -> None:
        self.models = frozenset(models)
        self.region = region
        self.account = account
        # (bucket, prefix) -> whether any object is there, as SageMaker lists the input before it creates a job
        # (None: not checked); and each model's execution role, which SageMaker's refusal names
        self.has_objects = has_objects
        self.model_roles = dict(model_roles or {})
        self.jobs: dict[str, TransformJob] = {}
        self._lock = threading.Lock()

    @staticmethod
    def is_control_plane(request: Request) -> bool:
        target = request.header("x-amz-target") or ""
        return request.method == "POST" and target.removeprefix(TARGET_PREFIX) in OPERATIONS

    @staticmethod
    def is_report(request: Request) -> bool:
        return request.method == "POST" and request.path.startswith(REPORT_PREFIX)

    def arn(self, name: str) -> str:
        # SageMaker ARNs carry the name lower-cased (as its endpoint and inference component ARNs do).
        return f"arn:aws:sagemaker:{self.region}:{self.account}:transform-job/{name.lower()}"

    def handle(self, request: Request) -> Reply:
        operation = (request.header("x-amz-target") or "").removeprefix(TARGET_PREFIX)
        body = json_body(request)
        if isinstance(body, Reply):
            return body
        if operation == "DescribeTransformJob":
            return self.describe(body)
        return self.create(body)

    def describe(self, body: dict[str, Any]) -> Reply:
        errors = constraint_errors("DescribeTransformJobRequest", body)
        if errors:
            return validation_exception(errors)
        name = body["TransformJobName"]
        job = self.jobs.get(name)
        if job is None:
            return json_error("ValidationException", f"Could not find requested job with name {name}")
        with self._lock:
            return _ok(job.describe())

    def create(self, body: dict[str, Any]) -> Reply:
        errors = constraint_errors("CreateTransformJobRequest", body)
        payload = body.get("MaxPayloadInMB")
        if isinstance(payload, int) and payload > MAX_PAYLOAD_MB:
            errors.append(
                f"Value '{payload}' at 'maxPayloadInMB' failed to satisfy constraint: Member must have value less "
                f"than or equal to {MAX_PAYLOAD_MB}"
            )
        if errors:
            return validation_exception(errors)
        name, model = body["TransformJobName"], body["ModelName"]
        if model not in self.models:
            return json_error(
                "ValidationException",
                f'Could not find model "arn:aws:sagemaker:{self.region}:{self.account}:model/{model.lower()}".',
            )
        refused = self._no_input(body["TransformInput"], model)
        if refused is not None:
            return refused
        with self._lock:
            if name in self.jobs:
                return json_error(
                    "ResourceInUse",
                    f"Job name must be unique within an AWS account and region, and a job with this name already "
                    f"exists ({self.arn(name)})",
                )
            job = TransformJob(dict(body), self.arn(name))
            self.jobs[name] = job
        return _ok({"TransformJobArn": job.arn})

    def _no_input(self, transform_input: dict[str, Any], model: str) -> Reply | None:
        """SageMaker's refusal of a job whose `S3Prefix` input holds no object (its words, as quoted in
        aws/amazon-sagemaker-examples issue #2414), or None."""
        source = (transform_input.get("DataSource") or {}).get("S3DataSource") or {}
        if self.has_objects is None or source.get("S3DataType") != "S3Prefix":
            return None
        uri = str(source.get("S3Uri", ""))
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if self.has_objects(bucket, prefix):
            return None
        role = self.model_roles.get(model, "")
        return json_error(
            "ValidationException",
            f'No S3 objects found under S3 URL "{uri}" given in input data source. Please ensure that the bucket '
            f"exists in the selected region ({self.region}), that objects exist under that S3 prefix, and that the "
            f'role "{role}" has "s3:ListBucket" permissions on bucket "{bucket}".',
        )

    def report(self, request: Request) -> Reply:
        """The emulation's end of a job (`local run-batch`): `{"status": "Completed"|"Failed", "reason": ...}`."""
        name = request.path.removeprefix(REPORT_PREFIX)
        try:
            body = json.loads(request.body or b"{}")
        except json.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            body = {}
        status, reason = body.get("status"), body.get("reason")
        if status not in ENDED:
            return json_error("ValidationException", f"status {status!r}: allowed {', '.join(ENDED)}")
        with self._lock:
            job = self.jobs.get(name)
            if job is None:
                return json_error("ValidationException", f"Could not find requested job with name {name}")
            if job.status != "InProgress":
                return json_error("ValidationException", f"job {name} already ended ({job.status})")
            job.status, job.ended = status, time.time()
            job.failure_reason = str(reason) if reason else None
            return _ok(job.describe())
