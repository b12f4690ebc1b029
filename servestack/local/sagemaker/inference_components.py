"""The inference components of `local up`'s endpoints, and the two SageMaker control-plane calls that act on them
locally: `DescribeInferenceComponent` and `UpdateInferenceComponentRuntimeConfig` (boto3's `sagemaker` client
with `endpoint_url` = local up's AWS API port; JSON protocol, `X-Amz-Target: SageMaker.<Operation>`).

Each component runs as one container behind its endpoint's router (servestack/local/sagemaker/router.py) whatever its
copy
count, as a variant runs one instance locally. The copy count still matters where SageMaker makes it matter:
- `UpdateInferenceComponentRuntimeConfig` to 0 copies stops the component's container; until a copy is back in
  service, `InvokeEndpoint` on the component answers SageMaker's "has no capacity" ValidationError
  (servestack/local/sagemaker/runtime_front.py). From 0 to N the container starts again, which takes a moment, as a copy
  takes minutes to come up in SageMaker: meanwhile the component is `Updating` and still has no capacity;
- an update while the previous one is still running is refused (not verified against SageMaker, which refuses
  to delete a component during a copy-count update; docs/sagemaker-strictness.md; the wording is ours).
Application Auto Scaling is not emulated: nothing takes a component to zero on its own, or back from it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from servestack.local.hosting import Reply, Request, request_id

logger = logging.getLogger("servestack.components")
TARGET_PREFIX = "SageMaker."
OPERATIONS = ("DescribeInferenceComponent", "UpdateInferenceComponentRuntimeConfig")


@dataclass
class ComponentState:
    """One inference component of the templates, with its copies as SageMaker reports them."""

    name: str
    arn: str
    endpoint_name: str
    endpoint_arn: str
    variant: str
    model_name: str
    compute: dict[str, Any]
    desired_copies: int
    current_copies: int
    status: str = "InService"  # InService | Updating | Failed
    failure_reason: str | None = None
    created: float = field(default_factory=time.time)
    modified: float = field(default_factory=time.time)

    def describe(self) -> dict[str, Any]:
        """DescribeInferenceComponent's answer (botocore's sagemaker service model names these members)."""
        answer: dict[str, Any] = {
            "InferenceComponentName": self.name,
            "InferenceComponentArn": self.arn,
            "EndpointName": self.endpoint_name,
            "EndpointArn": self.endpoint_arn,
            "VariantName": self.variant,
            "Specification": {"ModelName": self.model_name, "ComputeResourceRequirements": self.compute},
            "RuntimeConfig": {"DesiredCopyCount": self.desired_copies, "CurrentCopyCount": self.current_copies},
            "CreationTime": self.created,
            "LastModifiedTime": self.modified,
            "InferenceComponentStatus": self.status,
        }
        if self.failure_reason:
            answer["FailureReason"] = self.failure_reason
        return answer


# Sets a component's copies on its endpoint's router; returns when the copies are in service (raises otherwise).
Scaler = Callable[[ComponentState, int], None]
# The component's copies as its router runs them now, (copies, containers serving), or None when it cannot tell.
Observer = Callable[[ComponentState], "tuple[int, int] | None"]


def copies_on_router(control_url: str, name: str, developer: Any, region: str = "us-east-1") -> tuple[int, int] | None:
    """Component `name`'s copies as its endpoint's router runs them, (copies, containers serving now), from the
    router's control port, signed with `developer`'s keys; None when the router does not answer."""
    from servestack.local.emulator import control

    try:
        status, answer = control("GET", f"{control_url}/_servestack/components", developer, region, timeout_sec=5)
    except OSError:
        return None
    found = answer.get(name) if status == 200 and isinstance(answer, dict) else None
    if not isinstance(found, dict):
        return None
    return int(found.get("copies", 0)), int(found.get("serving", 0))


def json_error(code: str, message: str, status: int = 400) -> Reply:
    """An error of SageMaker's JSON protocol: botocore reads the code from `__type`."""
    headers = {"Content-Type": "application/x-amz-json-1.1", "x-amzn-RequestId": request_id()}
    return Reply(status, headers, json.dumps({"__type": code, "message": message}).encode())


def json_body(request: Request) -> dict[str, Any] | Reply:
    """The JSON object a SageMaker JSON-protocol request carries, or the error SageMaker answers instead."""
    try:
        body = json.loads(request.body or b"{}")
    except json.JSONDecodeError:
        return json_error("SerializationException", "the request body is not JSON")
    if not isinstance(body, dict):
        return json_error("SerializationException", "the request body is not a JSON object")
    return body


def _ok(body: dict[str, Any]) -> Reply:
    headers = {"Content-Type": "application/x-amz-json-1.1", "x-amzn-RequestId": request_id()}
    return Reply(200, headers, json.dumps(body).encode())


class InferenceComponents:
    """The components of every endpoint local up runs, and the control-plane calls on them."""

    def __init__(self, components: dict[str, ComponentState], scale: Scaler, observe: Observer | None = None) -> None:
        self.components = components
        self.scale = scale
        self.observe = observe
        self._lock = threading.Lock()

    @staticmethod
    def is_control_plane(request: Request) -> bool:
        return request.method == "POST" and (request.header("x-amz-target") or "").startswith(TARGET_PREFIX)

    def handle(self, request: Request) -> Reply:
        operation = (request.header("x-amz-target") or "").removeprefix(TARGET_PREFIX)
        if operation not in OPERATIONS:
            return json_error(
                "UnknownOperationException",
                f"SageMaker {operation}: local up's AWS API port answers {' and '.join(OPERATIONS)} for the "
                "templates' inference components, and CreateTransformJob and DescribeTransformJob; the rest of "
                "SageMaker's control plane is the emulator's (its endpoint_url is in the state file)",
            )
        body = json_body(request)
        if isinstance(body, Reply):
            return body
        name = body.get("InferenceComponentName")
        if not isinstance(name, str) or not name:
            return json_error(
                "ValidationException",
                "1 validation error detected: Value null at 'inferenceComponentName' failed to satisfy constraint: "
                "Member must not be null",
            )
        component = self.components.get(name)
        if component is None:
            return json_error("ValidationException", f"Could not find inference component {name!r}.")
        if operation == "DescribeInferenceComponent":
            self._observe(component)
            return _ok(component.describe())
        return self.update_runtime_config(component, body.get("DesiredRuntimeConfig"))

    def update_runtime_config(self, component: ComponentState, desired: Any) -> Reply:
        copies = desired.get("CopyCount") if isinstance(desired, dict) else None
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 0:
            return json_error(
                "ValidationException",
                f"1 validation error detected: Value {copies!r} at 'desiredRuntimeConfig.copyCount' failed to "
                "satisfy constraint: Member must be an integer greater than or equal to 0",
            )
        with self._lock:
            if component.status == "Updating":
                return json_error(
                    "ValidationException",
                    f"Inference component {component.name} is being updated (status Updating); try again when it "
                    "is InService.",
                )
            component.status, component.desired_copies, component.modified = "Updating", copies, time.time()
            if copies == 0:
                component.current_copies = 0  # copies stop taking requests at once
        threading.Thread(
            target=self._apply, args=(component, copies), name=f"scale-{component.name}", daemon=True
        ).start()
        return _ok({"InferenceComponentArn": component.arn})

    def _observe(self, component: ComponentState) -> None:
        """Copies as the router runs them (a container that died and is starting again serves no copy): what
        DescribeInferenceComponent reports never says a copy runs when none does. Not during an update, whose
        own outcome sets them."""
        if self.observe is None or component.status == "Updating":
            return
        observed = self.observe(component)
        if observed is None:
            return
        copies, serving = observed
        with self._lock:
            if component.status == "Updating":
                return
            current = copies if serving else 0
            if (copies, current) != (component.desired_copies, component.current_copies):
                component.desired_copies, component.current_copies = copies, current
                component.modified = time.time()

    def _apply(self, component: ComponentState, copies: int) -> None:
        try:
            self.scale(component, copies)
        except Exception as error:  # the router's answer or its absence: the component reports it
            logger.warning("inference component %s: scaling to %d copies failed: %s", component.name, copies, error)
            with self._lock:
                component.status, component.failure_reason = "Failed", str(error)
            return
        with self._lock:
            component.current_copies, component.status, component.modified = copies, "InService", time.time()
            component.failure_reason = None
