"""Resource-based policies by resource ARN: S3 bucket policies, SQS queue policies, SNS topic policies, Lambda
permissions, role trust policies.

A request's resource finds the policy of what holds it: an object ARN (`arn:aws:s3:::bucket/key`) the
bucket's, a DynamoDB index ARN the table's, a qualified Lambda ARN (`...:function:name:alias`) the alias's
when it has one, else the function's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from servestack.local.iam.conditions import normalise_context
from servestack.local.iam.policy import Caller, Decision, Policy, compile_policy, evaluate

ContextInput = Mapping[str, str | list[str] | tuple[str, ...]]


def holders(resource_arn: str) -> Iterator[str]:
    """The ARNs whose resource policy governs `resource_arn`, most specific first."""
    yield resource_arn
    if resource_arn.startswith("arn:aws:s3:::") and "/" in resource_arn:
        yield resource_arn.split("/", 1)[0]
    elif resource_arn.startswith("arn:aws:dynamodb:") and resource_arn.count("/") >= 3:
        yield "/".join(resource_arn.split("/", 2)[:2])
    elif resource_arn.startswith("arn:aws:lambda:") and resource_arn.count(":") == 7:
        yield resource_arn.rsplit(":", 1)[0]


class ResourcePolicies:
    """Compiled resource-based policies by the ARN they are attached to (thread-safe, copy-on-write)."""

    def __init__(self) -> None:
        self._by_arn: dict[str, Policy] = {}
        self._lock = threading.Lock()

    def put(self, resource_arn: str, document: Mapping[str, Any] | str, *, name: str | None = None) -> Policy:
        """Attach (or replace) the policy of `resource_arn`; `PolicyError` if IAM would refuse it."""
        policy = compile_policy(document, name=name or resource_arn, kind="resource")
        with self._lock:
            self._by_arn = {**self._by_arn, resource_arn: policy}
        return policy

    def remove(self, resource_arn: str) -> None:
        with self._lock:
            self._by_arn = {arn: policy for arn, policy in self._by_arn.items() if arn != resource_arn}

    def get(self, resource_arn: str) -> Policy | None:
        return self._by_arn.get(resource_arn)

    def for_resource(self, resource_arn: str) -> Policy | None:
        by_arn = self._by_arn
        for holder in holders(resource_arn):
            policy = by_arn.get(holder)
            if policy is not None:
                return policy
        return None

    def __len__(self) -> int:
        return len(self._by_arn)


def lambda_permission(
    function_arn: str,
    principal: str,
    *,
    action: str = "lambda:InvokeFunction",
    source_arn: str | None = None,
    source_account: str | None = None,
    sid: str | None = None,
) -> dict[str, Any]:
    """The statement Lambda adds for an `AWS::Lambda::Permission` / `AddPermission` (a service principal
    such as `apigateway.amazonaws.com`, or an account or role ARN), as `GetPolicy` shows it."""
    principal_element: dict[str, str] = (
        {"Service": principal} if principal.endswith(".amazonaws.com") else {"AWS": principal}
    )
    statement: dict[str, Any] = {
        "Effect": "Allow",
        "Principal": principal_element,
        "Action": action,
        "Resource": function_arn,
    }
    if sid:
        statement["Sid"] = sid
    condition: dict[str, dict[str, str]] = {}
    if source_arn:
        condition["ArnLike"] = {"AWS:SourceArn": source_arn}
    if source_account:
        condition["StringEquals"] = {"AWS:SourceAccount": source_account}
    if condition:
        statement["Condition"] = condition
    return statement


def evaluate_service_principal(
    policy: Policy | Mapping[str, Any],
    *,
    service: str = "s3.amazonaws.com",
    action: str,
    resource: str,
    context: ContextInput | None = None,
) -> Decision:
    """May the AWS service `service` do `action` on `resource` under this resource policy? For example S3
    sending a bucket's notifications to a queue (`sqs:SendMessage` with `aws:SourceArn` = the bucket ARN and
    `aws:SourceAccount`). A service has no identity policies: only the resource policy can allow."""
    compiled = (
        policy if isinstance(policy, Policy) else compile_policy(policy, name=f"policy of {resource}", kind="resource")
    )
    full_context = normalise_context(
        {
            "aws:SecureTransport": "true",
            "aws:PrincipalIsAWSService": "true",
            "aws:PrincipalServiceName": service,
            **{key: tuple(value) if not isinstance(value, str) else value for key, value in (context or {}).items()},
        }
    )
    return evaluate(
        Caller.of_service(service), action, resource, full_context, identity_policies=None, resource_policy=compiled
    )
