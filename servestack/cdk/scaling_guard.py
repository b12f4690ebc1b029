"""Refuse at synth an instance type change that SageMaker refuses at deploy time.

SageMaker will not update an endpoint so that a variant registered with Application Auto Scaling changes its
instance type (or is removed): UpdateEndpoint fails until the variant is deregistered. In one CloudFormation
deploy that cannot be arranged: the endpoint is updated before a scaling target that leaves the template is
deleted (deletions run in the clean-up phase), and a new variant name would be a removed variant, refused the
same way. So the change takes two deploys, and servestack says so before the first one fails 20 minutes in:
1. `-c servestack:suspend-scaling=<deployment>` with the old instance type: the deployment's scaling targets
   leave the template, and CloudFormation deregisters them;
2. the new instance type without the flag: the endpoint is updated, then the targets (which depend on the
   endpoint) are registered again.

serving.yaml alone cannot see the previous value, so the check compares with the stack's template from the
last synth in the app's output folder (cdk.out): what the last `cdk deploy` from this folder deployed. Where
there is none (a fresh checkout, as in the pipeline's synth), nothing is compared.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aws_cdk import Stack, Stage
from constructs import Construct

from servestack.aws_rules import AUTOSCALED_INSTANCE_TYPE_RULE

SUSPEND_CONTEXT = "servestack:suspend-scaling"


class InstanceTypeChangeRefused(ValueError):
    """An autoscaled variant's instance type changed since the last synth; the message gives the two deploys."""


def suspended(scope: Construct) -> set[str]:
    """The deployments whose autoscaling `-c servestack:suspend-scaling=a,b` takes out for one deploy."""
    value = scope.node.try_get_context(SUSPEND_CONTEXT) or ""
    return {name.strip() for name in str(value).split(",") if name.strip()}


def previous_template(scope: Construct) -> dict[str, Any] | None:
    """The stack's template from the last synth into this app's output folder, if there is one."""
    stack = Stack.of(scope)
    path = Path(Stage.of(stack).outdir) / stack.template_file  # type: ignore[union-attr]
    try:
        template: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return template


def check_instance_types(
    scope: Construct, *, deployment: str, endpoint_name: str, instance_types: dict[str, str]
) -> None:
    """Raise `InstanceTypeChangeRefused` if a variant (name -> its instance type now) was autoscaled in the
    previous template on another instance type."""
    previous = previous_template(scope)
    if previous is None:
        return
    resources = list(previous.get("Resources", {}).values())
    scaled = {
        str(r.get("Properties", {}).get("ResourceId"))
        for r in resources
        if r.get("Type") == "AWS::ApplicationAutoScaling::ScalableTarget"
    }
    before = {
        str(v.get("VariantName")): v.get("InstanceType")
        for r in resources
        if r.get("Type") == "AWS::SageMaker::EndpointConfig"
        for v in r.get("Properties", {}).get("ProductionVariants", [])
        if isinstance(v, dict)
    }
    for variant, instance_type in instance_types.items():
        old = before.get(variant)
        if isinstance(old, str) and old != instance_type and f"endpoint/{endpoint_name}/variant/{variant}" in scaled:
            raise InstanceTypeChangeRefused(
                f"deployments.{deployment}: variant {variant}'s instance_type {old} -> {instance_type} is not "
                f"deployable in one step while the variant is autoscaled; {AUTOSCALED_INSTANCE_TYPE_RULE}. "
                f"Deploy twice: first with instance_type {old} and `-c {SUSPEND_CONTEXT}={deployment}` "
                "(its scaling targets are removed, which deregisters them), then with instance_type "
                f"{instance_type} and without the flag (they are registered again after the endpoint update). "
                f"Compared with the last synthesized template of {Stack.of(scope).stack_name} in the app's "
                "output folder."
            )
