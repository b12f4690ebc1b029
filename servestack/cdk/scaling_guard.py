"""Refuse at synth the SageMaker endpoint updates that SageMaker refuses at deploy time, by comparing a
deployment's variants with those of the template that is deployed.

Two rules, each of which fails `UpdateEndpoint` tens of minutes into a deploy:
- An autoscaled variant's instance type cannot change (nor can the variant be removed) while it is registered
  with Application Auto Scaling (AUTOSCALED_INSTANCE_TYPE_RULE). In one CloudFormation deploy that cannot be
  arranged: the endpoint is updated before a scaling target that leaves the template is deleted (deletions run
  in the clean-up phase). So the change takes two deploys, and the refusal names them:
  1. `-c servestack:suspend-scaling=<deployment>` with the old instance type: the deployment's scaling targets
     leave the template, and CloudFormation deregisters them;
  2. the new instance type without the flag: the endpoint is updated, then the targets (which depend on the
     endpoint) are registered again.
- Under a blue/green update policy (every instance-based realtime endpoint of servestack has one), the new
  endpoint configuration must keep the old variant names (BLUE_GREEN_VARIANT_NAME_RULE): renaming or removing
  an A/B variant is refused. A variant keeps its name when its model, version or weight changes.

serving.yaml alone cannot see what is deployed, so the guards compare with a template of the stack, read from
(`-c servestack:compare-with=...`, else the environment variable SERVESTACK_COMPARE_WITH):
- `deployed`: the deployed stack's template, by CloudFormation's GetTemplate. The pipeline's synth step sets it
  (servestack/cdk/pipeline.py), with a role that may call exactly that on the app's stacks: its checkout is
  fresh, so there is no earlier synth to compare with. A stack that does not exist is a first deploy.
- `last-synth` (the default): the stack's template from the last synth into the app's output folder (cdk.out,
  or local mode's `.servestack/cdk.out`): what the last deploy from this folder deployed. No earlier synth is a
  first deploy from here, as before.
Where `deployed` cannot read the template (no credentials, no permission, no network) and there is no earlier
synth either, a guarded endpoint is refused: nothing can say whether the update is one SageMaker accepts.
`-c servestack:accept-replacement=<deployment>` accepts the deployment's variants as synthesized, unchecked.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk import Stack, Stage, Token
from constructs import Construct

from servestack.aws_rules import AUTOSCALED_INSTANCE_TYPE_RULE, BLUE_GREEN_VARIANT_NAME_RULE

SUSPEND_CONTEXT = "servestack:suspend-scaling"
ACCEPT_CONTEXT = "servestack:accept-replacement"
COMPARE_CONTEXT = "servestack:compare-with"
COMPARE_ENVIRONMENT = "SERVESTACK_COMPARE_WITH"
DEPLOYED = "deployed"
LAST_SYNTH = "last-synth"


class DeployedChangeRefused(ValueError):
    """A deployment's variants changed in a way SageMaker refuses, or cannot be compared; the message says
    what to do."""


class InstanceTypeChangeRefused(DeployedChangeRefused):
    """An autoscaled variant's instance type changed since the compared template; the message gives the two
    deploys."""


class VariantRenameRefused(DeployedChangeRefused):
    """A variant of a blue/green endpoint was renamed or removed since the compared template."""


class UnverifiableChange(DeployedChangeRefused):
    """Neither the deployed template nor an earlier synth could be read; the message names the flag."""


def _names(scope: Construct, key: str) -> set[str]:
    value = scope.node.try_get_context(key) or ""
    return {name.strip() for name in str(value).split(",") if name.strip()}


def suspended(scope: Construct) -> set[str]:
    """The deployments whose autoscaling `-c servestack:suspend-scaling=a,b` takes out for one deploy."""
    return _names(scope, SUSPEND_CONTEXT)


def accepted(scope: Construct) -> set[str]:
    """The deployments whose variants `-c servestack:accept-replacement=a,b` deploys without the comparison."""
    return _names(scope, ACCEPT_CONTEXT)


def compare_with(scope: Construct) -> str:
    """`deployed` or `last-synth`: the context key first (local mode pins `last-synth`), then the environment."""
    value = scope.node.try_get_context(COMPARE_CONTEXT) or os.environ.get(COMPARE_ENVIRONMENT) or LAST_SYNTH
    if value not in (DEPLOYED, LAST_SYNTH):
        raise DeployedChangeRefused(
            f"{COMPARE_CONTEXT}={value!r} is not one of {DEPLOYED!r} (the deployed stack's template, by "
            f"CloudFormation's GetTemplate) and {LAST_SYNTH!r} (the last synth in the app's output folder): "
            f"pass -c {COMPARE_CONTEXT}={DEPLOYED} or unset {COMPARE_ENVIRONMENT}"
        )
    return str(value)


@dataclass(frozen=True)
class Compared:
    """What the guards compare with: a template, or None when nothing is deployed; `source` says which."""

    template: dict[str, Any] | None
    source: str


def previous_template(scope: Construct) -> dict[str, Any] | None:
    """The stack's template from the last synth into this app's output folder, if there is one."""
    stack = Stack.of(scope)
    path = Path(Stage.of(stack).outdir) / stack.template_file  # type: ignore[union-attr]
    try:
        template: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return template


class _Unreadable(Exception):
    """GetTemplate answered something other than a template or "does not exist"; the message says what."""


def deployed_template(stack: Stack) -> dict[str, Any] | None:
    """The deployed template of `stack` (CloudFormation's GetTemplate, as the credentials of the environment),
    or None when the stack does not exist; `_Unreadable` when it cannot be read."""
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise _Unreadable("boto3 is not installed (pip install 'servestack[aws]')") from None
    region = None if Token.is_unresolved(stack.region) else stack.region  # else the environment's
    try:
        # A session of its own: boto3's default one keeps the credentials it found first in this process.
        client = boto3.session.Session(region_name=region).client(
            "cloudformation",
            config=Config(connect_timeout=5, read_timeout=20, retries={"mode": "standard", "max_attempts": 3}),
        )
        # The template as submitted (`Original`): what `cdk deploy` sent, as this synth writes it.
        body = client.get_template(StackName=stack.stack_name, TemplateStage="Original")["TemplateBody"]
    except ClientError as error:
        said = error.response.get("Error", {})
        # A stack that was never created (or was deleted: by name, GetTemplate finds running stacks only) is
        # CloudFormation's common ValidationError, "Stack with id <name> does not exist"
        # (https://docs.aws.amazon.com/AWSCloudFormation/latest/APIReference/API_GetTemplate.html,
        # https://docs.aws.amazon.com/AWSCloudFormation/latest/APIReference/CommonErrors.html; the message as the
        # service sends it: https://github.com/boto/boto3/issues/2807). Nothing is deployed: a first deploy.
        if said.get("Code") == "ValidationError" and "does not exist" in str(said.get("Message", "")):
            return None
        raise _Unreadable(f"{said.get('Code', 'error')}: {said.get('Message', error)}") from None
    except BotoCoreError as error:  # no credentials, no region, no network
        raise _Unreadable(str(error)) from None
    if isinstance(body, str):  # botocore decodes a JSON body; a YAML one (not servestack's) stays text
        try:
            body = json.loads(body)
        except ValueError:
            raise _Unreadable("its template is not JSON") from None
    if not isinstance(body, dict):
        raise _Unreadable("its template is not a JSON object")
    return body


def compared_template(scope: Construct, *, deployment: str, endpoint: str) -> Compared:
    """The template the guards compare `scope`'s stack with (module docstring); `UnverifiableChange` when there
    is none to read and something may be deployed."""
    stack = Stack.of(scope)
    unreadable = ""
    if compare_with(scope) == DEPLOYED:
        try:
            return Compared(deployed_template(stack), f"the deployed stack {stack.stack_name} (GetTemplate)")
        except _Unreadable as error:
            unreadable = str(error)
    previous = previous_template(scope)
    source = f"the last synthesized template of {stack.stack_name} in the app's output folder"
    if previous is not None or not unreadable:
        return Compared(previous, source)
    raise UnverifiableChange(
        f"deployments.{deployment}: cannot compare endpoint {endpoint}'s variants with the deployed stack "
        f"{stack.stack_name}: GetTemplate failed ({unreadable}), and this folder has no earlier synth of it; a "
        "changed instance type of an autoscaled variant, or a renamed or removed variant, would fail at "
        f"UpdateEndpoint. Let this synth call cloudformation:GetTemplate on {stack.stack_name}, or pass "
        f"-c {ACCEPT_CONTEXT}={deployment} to deploy its variants as synthesized, unchecked"
    )


def _variants(template: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """The template's production variants (name -> instance type) and its autoscaled resource ids."""
    resources = [r for r in template.get("Resources", {}).values() if isinstance(r, dict)]
    scaled = {
        str(r.get("Properties", {}).get("ResourceId"))
        for r in resources
        if r.get("Type") == "AWS::ApplicationAutoScaling::ScalableTarget"
    }
    variants = {
        str(v.get("VariantName")): v.get("InstanceType")
        for r in resources
        if r.get("Type") == "AWS::SageMaker::EndpointConfig"
        for v in r.get("Properties", {}).get("ProductionVariants", [])
        if isinstance(v, dict)
    }
    return variants, scaled


def check_variants(
    scope: Construct, *, deployment: str, endpoint_name: str, instance_types: dict[str, str], blue_green: bool
) -> None:
    """Refuse what SageMaker would refuse of an update of endpoint `endpoint_name` to these variants (name ->
    its instance type now): an autoscaled variant on another instance type (`InstanceTypeChangeRefused`) and,
    when the update is `blue_green`, a variant renamed or removed (`VariantRenameRefused`)."""
    if deployment in accepted(scope):
        return
    compared = compared_template(scope, deployment=deployment, endpoint=endpoint_name)
    if compared.template is None:
        return
    before, scaled = _variants(compared.template)
    for variant, instance_type in instance_types.items():
        old = before.get(variant)
        if isinstance(old, str) and old != instance_type and f"endpoint/{endpoint_name}/variant/{variant}" in scaled:
            raise InstanceTypeChangeRefused(
                f"deployments.{deployment}: variant {variant}'s instance_type {old} -> {instance_type} is not "
                f"deployable in one step while the variant is autoscaled; {AUTOSCALED_INSTANCE_TYPE_RULE}. "
                f"Deploy twice: first with instance_type {old} and `-c {SUSPEND_CONTEXT}={deployment}` "
                "(its scaling targets are removed, which deregisters them), then with instance_type "
                f"{instance_type} and without the flag (they are registered again after the endpoint update). "
                f"Compared with {compared.source}."
            )
    gone = sorted(set(before) - set(instance_types))
    if blue_green and gone:
        raise VariantRenameRefused(
            f"deployments.{deployment}: variant(s) {', '.join(gone)} of endpoint {endpoint_name} would be renamed "
            f"or removed (now: {', '.join(instance_types)}), which its blue/green update refuses; "
            f"{BLUE_GREEN_VARIANT_NAME_RULE}. Keep the variant names (a variant's model, version and weight can "
            "change under its name), or declare the new variants as another deployment (a new endpoint) and "
            f"remove this one once its callers moved. Compared with {compared.source}; if that is not what is "
            f"deployed, -c {ACCEPT_CONTEXT}={deployment} deploys the variants as synthesized, unchecked."
        )
