"""Every IAM and resource policy the constructs synthesize loads into the local enforcement engine.

Local up resolves the templates' intrinsic functions to local values before handing policies to
servestack/local/iam; here a stand-in resolver puts placeholder ARNs in their place, which is enough to
show that no statement uses an element or condition operator the engine would refuse (`PolicyError`).
"""

from __future__ import annotations

import re
from typing import Any

from servestack.local.iam import compile_policy
from servestack.local.iam.conditions import OPERATORS
from tests.infra.conftest import Synth

PSEUDO = {
    "AWS::Partition": "aws",
    "AWS::Region": "us-east-1",
    "AWS::AccountId": "123456789012",
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::StackName": "stack",
    "AWS::NoValue": "",
}
POLICY_PROPERTIES = {
    "AWS::IAM::Policy": [("PolicyDocument", "identity")],
    "AWS::IAM::ManagedPolicy": [("PolicyDocument", "identity")],
    "AWS::S3::BucketPolicy": [("PolicyDocument", "resource")],
    "AWS::SQS::QueuePolicy": [("PolicyDocument", "resource")],
    "AWS::SNS::TopicPolicy": [("PolicyDocument", "resource")],
    "AWS::IAM::Role": [("AssumeRolePolicyDocument", "resource")],
}


def placeholder(value: Any) -> Any:
    """Intrinsic functions replaced by plausible strings (ARNs for GetAtt and Ref)."""
    if isinstance(value, list):
        return [placeholder(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((key, argument),) = value.items()
        if key == "Ref":
            return PSEUDO.get(argument, f"arn:aws:cloudformation:us-east-1:123456789012:ref/{argument}")
        if key == "Fn::GetAtt":
            return f"arn:aws:cloudformation:us-east-1:123456789012:attribute/{'.'.join(argument)}"
        if key == "Fn::Join":
            separator, parts = argument
            return separator.join(str(placeholder(part)) for part in parts)
        if key == "Fn::Sub":
            text = argument if isinstance(argument, str) else argument[0]
            return re.sub(r"\$\{([^}]+)\}", lambda match: str(PSEUDO.get(match.group(1), "value")), text)
        if key == "Fn::Select":
            index, items = argument
            resolved = placeholder(items)
            return resolved[int(index)] if isinstance(resolved, list) and len(resolved) > int(index) else "value"
        if key == "Fn::Split":
            separator, text = argument
            return str(placeholder(text)).split(separator)
        if key == "Fn::If":
            return placeholder(argument[1])
        if key.startswith("Fn::"):
            return "value"
    return {key: placeholder(item) for key, item in value.items()}


def test_every_synthesized_policy_loads(synth: Synth) -> None:
    loaded = 0
    operators: set[str] = set()
    for stack, template in synth.templates.items():
        for logical_id, resource in template.get("Resources", {}).items():
            for prop, kind in POLICY_PROPERTIES.get(resource["Type"], []):
                documents = [resource.get("Properties", {}).get(prop)]
                if resource["Type"] == "AWS::IAM::Role":  # inline policies of a role are identity policies
                    for inline in resource.get("Properties", {}).get("Policies", []):
                        compile_policy(placeholder(inline["PolicyDocument"]), name=f"{stack}/{logical_id}/inline")
                        loaded += 1
                for document in documents:
                    if document is None:
                        continue
                    resolved = placeholder(document)
                    policy = compile_policy(resolved, name=f"{stack}/{logical_id}", kind=kind)
                    loaded += 1
                    for statement in (
                        resolved["Statement"] if isinstance(resolved["Statement"], list) else [resolved["Statement"]]
                    ):
                        operators.update(statement.get("Condition", {}))
                    assert policy.statements
    # THEN there were policies to load, and the conditions they use are among the engine's operators
    assert loaded >= 10
    assert {operator.removesuffix("IfExists").split(":")[-1] for operator in operators} <= set(OPERATORS) | {"Null"}
