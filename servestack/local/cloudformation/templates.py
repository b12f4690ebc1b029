"""Synthesized CloudFormation templates, read the way `local up` needs them: resources, their physical
names, and intrinsic functions resolved to local values.

CloudFormation itself decides three things `cdk deploy` never writes down, and this module decides them the
same way for local mode:
- **Physical names** of resources whose template gives none: `<stack>-<logicalId>-<suffix>`, each part
  truncated so the whole fits the service's limit, lower-cased where the service wants it (S3). CloudFormation
  draws the suffix at random; here it is a hash of the stack and logical id, so a name stays the same across
  `local up` restarts (the emulator's data survives them) and two projects never collide.
- **What `Ref` and `Fn::GetAtt` return** for each resource type (a queue's `Ref` is its URL, a function's is
  its name, a task definition's its ARN...), as the CloudFormation resource reference documents them: the
  table is servestack/local/cloudformation/return_values.py; a type or attribute it does not list is an error, not a
  guess.
- **Pseudo parameters**: the local account (`123456789012`, moto's default) and region.
Every intrinsic `cdk synth` emits is resolved (`Ref`, `Fn::GetAtt`, `Fn::Join`, `Fn::Sub`, `Fn::Select`,
`Fn::Split`, `Fn::If` with the template's conditions, `Fn::Equals`, `Fn::Not`, `Fn::And`, `Fn::Or`,
`Fn::Base64`, `Fn::GetAZs`); anything else is an error naming the function and where it was found.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servestack.local.cloudformation.return_values import PARTITION, RETURN_VALUES, URL_SUFFIX, ReturnValues, Subject

ACCOUNT = "123456789012"
DEFAULT_REGION = "us-east-1"
NO_VALUE = object()  # `Ref: AWS::NoValue`: the property is dropped
_SUB_VARIABLE = re.compile(r"\$\{([^}!][^}]*)\}")
_SUFFIX_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


class TemplateError(ValueError):
    """The template holds something local mode cannot read; the message names the resource and the value."""


@dataclass(frozen=True)
class Resource:
    logical_id: str
    type: str
    properties: Mapping[str, Any]
    condition: str | None = None


@dataclass
class StackTemplate:
    """One stack's template as `cdk synth` wrote it (`<stack>.template.json` in the cloud assembly)."""

    name: str
    path: Path
    body: dict[str, Any]
    resources: dict[str, Resource] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, stack_name: str) -> StackTemplate:
        body: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        resources = {
            logical_id: Resource(logical_id, r["Type"], r.get("Properties", {}), r.get("Condition"))
            for logical_id, r in body.get("Resources", {}).items()
        }
        return cls(stack_name, path, body, resources)

    def of_type(self, *types: str) -> list[Resource]:
        return [r for r in self.resources.values() if r.type in types]

    def tag(self, name: str) -> str | None:
        """A stack tag as the CDK copies it onto resources (`servestack:deployment`, `servestack:mode`)."""
        for resource in self.resources.values():
            tags = resource.properties.get("Tags")
            if isinstance(tags, list):
                for tag in tags:
                    if isinstance(tag, dict) and tag.get("Key") == name:
                        return str(tag.get("Value"))
            elif isinstance(tags, dict) and name in tags:
                return str(tags[name])
        return None


# ------------------------------------------------------------------------------------------ physical names

# Longest physical name each service accepts, and whether it must be lower case.
NAME_LIMITS: dict[str, tuple[int, bool]] = {
    "AWS::S3::Bucket": (63, True),
    "AWS::SQS::Queue": (80, False),
    "AWS::DynamoDB::Table": (255, False),
    "AWS::Lambda::Function": (64, False),
    "AWS::IAM::Role": (64, False),
    "AWS::SNS::Topic": (256, False),
    "AWS::Logs::LogGroup": (512, False),
    "AWS::KinesisFirehose::DeliveryStream": (64, False),
    "AWS::Logs::LogStream": (512, False),
    "AWS::SageMaker::Model": (63, False),
    "AWS::SageMaker::EndpointConfig": (63, False),
    "AWS::SageMaker::Endpoint": (63, False),
    "AWS::SageMaker::InferenceComponent": (63, False),
    "AWS::Scheduler::Schedule": (64, False),
    "AWS::Scheduler::ScheduleGroup": (64, False),
    "AWS::StepFunctions::StateMachine": (80, False),
}
# The property that carries an explicit physical name, per type.
NAME_PROPERTY = {
    "AWS::S3::Bucket": "BucketName",
    "AWS::SQS::Queue": "QueueName",
    "AWS::DynamoDB::Table": "TableName",
    "AWS::Lambda::Function": "FunctionName",
    "AWS::IAM::Role": "RoleName",
    "AWS::SNS::Topic": "TopicName",
    "AWS::Logs::LogGroup": "LogGroupName",
    "AWS::KinesisFirehose::DeliveryStream": "DeliveryStreamName",
    "AWS::Logs::LogStream": "LogStreamName",
    "AWS::SageMaker::Model": "ModelName",
    "AWS::SageMaker::EndpointConfig": "EndpointConfigName",
    "AWS::SageMaker::Endpoint": "EndpointName",
    "AWS::SageMaker::InferenceComponent": "InferenceComponentName",
    "AWS::Scheduler::Schedule": "Name",
    "AWS::Scheduler::ScheduleGroup": "Name",
    "AWS::ApiGatewayV2::Api": "Name",
    "AWS::ApiGatewayV2::Stage": "StageName",
    "AWS::ApplicationAutoScaling::ScalingPolicy": "PolicyName",
    "AWS::CloudWatch::Alarm": "AlarmName",
    "AWS::CloudWatch::Dashboard": "DashboardName",
    "AWS::CodeBuild::Project": "Name",
    "AWS::CodeDeploy::Application": "ApplicationName",
    "AWS::CodeDeploy::DeploymentConfig": "DeploymentConfigName",
    "AWS::CodeDeploy::DeploymentGroup": "DeploymentGroupName",
    "AWS::CodePipeline::Pipeline": "Name",
    "AWS::ECS::Cluster": "ClusterName",
    "AWS::ECS::TaskDefinition": "Family",
    "AWS::Events::Rule": "Name",
    "AWS::KMS::Alias": "AliasName",
    "AWS::StepFunctions::StateMachine": "StateMachineName",
}


def generated_name(stack: str, logical_id: str, resource_type: str, *, suffix_length: int = 12) -> str:
    """`<stack>-<logicalId>-<SUFFIX>` within the type's length limit, as CloudFormation forms a name the
    template leaves out; the suffix is stable (a hash) instead of random."""
    limit, lower = NAME_LIMITS.get(resource_type, (64, False))
    digest = hashlib.sha256(f"{stack}/{logical_id}".encode()).digest()
    suffix = "".join(_SUFFIX_ALPHABET[b % len(_SUFFIX_ALPHABET)] for b in digest[:suffix_length])
    room = limit - len(suffix) - 2
    stack_part = stack[: max(1, room // 2)] if len(stack) + len(logical_id) > room else stack
    logical_part = logical_id[: room - len(stack_part)]
    name = f"{stack_part}-{logical_part}-{suffix}"
    return name.lower() if lower else name


def short_id(stack: str, logical_id: str, length: int = 10) -> str:
    """An id in the style of API Gateway's (`a1b2c3d4e5`), stable per stack and logical id."""
    return hashlib.sha256(f"{stack}/{logical_id}".encode()).hexdigest()[:length]


# ------------------------------------------------------------------------------------------ resolution


@dataclass(frozen=True)
class LocalValues:
    """What pseudo parameters and a few attributes are on this machine."""

    region: str = DEFAULT_REGION
    account: str = ACCOUNT
    emulator_url: str = "http://127.0.0.1:5000"  # where queue URLs point
    api_urls: Mapping[str, str] = field(default_factory=dict)  # HTTP API logical id -> local URL
    availability_zones: tuple[str, ...] = ()


class Resolver:
    """Resolves intrinsic functions of one stack to local values."""

    def __init__(self, template: StackTemplate, local: LocalValues) -> None:
        self.template = template
        self.local = local
        self._names: dict[str, str] = {}
        self._conditions: dict[str, bool] = {}

    # -------------------------------------------------------------------------------- names and ARNs
    def physical_name(self, logical_id: str) -> str:
        """The resource's name: the template's explicit one, else the generated one."""
        if logical_id in self._names:
            return self._names[logical_id]
        resource = self._resource(logical_id, "a physical name")
        explicit = resource.properties.get(NAME_PROPERTY.get(resource.type, ""))
        if resource.type == "AWS::ApiGatewayV2::Api":
            explicit = None  # Name is a label; the id is generated
        name = str(self.resolve(explicit)) if explicit is not None else None
        if name is None:
            if resource.type == "AWS::ApiGatewayV2::Api":
                name = short_id(self.template.name, logical_id)
            else:
                name = generated_name(self.template.name, logical_id, resource.type)
        self._names[logical_id] = name
        return name

    def arn(self, service: str, resource: str, *, region: bool = True, account: bool = True) -> str:
        return (
            f"arn:{PARTITION}:{service}:{self.local.region if region else ''}:"
            f"{self.local.account if account else ''}:{resource}"
        )

    def ref(self, logical_id: str) -> Any:
        pseudo = self._pseudo(logical_id)
        if pseudo is not None:
            return pseudo
        if logical_id in self.template.body.get("Parameters", {}):
            default = self.template.body["Parameters"][logical_id].get("Default")
            if default is None:
                raise TemplateError(f"{self.template.name}: parameter {logical_id} has no default")
            return default
        subject, values = self._subject(logical_id, "Ref")
        return values.ref(subject)

    def get_att(self, logical_id: str, attribute: str) -> Any:
        subject, values = self._subject(logical_id, f"Fn::GetAtt {attribute}")
        value = values.attributes.get(attribute)
        if value is None:
            raise TemplateError(
                f"{self.template.name}: Fn::GetAtt {logical_id}.{attribute} ({self._resource(logical_id, '').type}) "
                f"is not known to local mode (known: {', '.join(sorted(values.attributes)) or 'none'})"
            )
        return value(subject)

    def _subject(self, logical_id: str, why: str) -> tuple[Subject, ReturnValues]:
        """The resource `why` names, and what CloudFormation documents `Ref` and its attributes to return."""
        resource = self._resource(logical_id, why)
        values = RETURN_VALUES.get(resource.type)
        if values is None:
            raise TemplateError(
                f"{self.template.name}: {why.split()[0]} {logical_id} ({resource.type}): not a type local mode knows "
                "the return values of (servestack/local/cloudformation/return_values.py lists those it knows)"
            )
        subject = Subject(
            self, self.template.name, logical_id, self.physical_name(logical_id), resource.properties,
            self.local.region, self.local.account, self.local.emulator_url, self.local.api_urls.get(logical_id),
        )  # fmt: skip
        return subject, values

    def _pseudo(self, name: str) -> Any:
        return {
            "AWS::AccountId": self.local.account,
            "AWS::Region": self.local.region,
            "AWS::Partition": PARTITION,
            "AWS::URLSuffix": URL_SUFFIX,
            "AWS::StackName": self.template.name,
            "AWS::StackId": self.arn("cloudformation", f"stack/{self.template.name}/local"),
            "AWS::NoValue": NO_VALUE,
            "AWS::NotificationARNs": [],
        }.get(name)

    def _resource(self, logical_id: str, why: str) -> Resource:
        resource = self.template.resources.get(logical_id)
        if resource is None:
            raise TemplateError(f"{self.template.name}: {why} names {logical_id!r}, which is not a resource")
        return resource

    # -------------------------------------------------------------------------------- conditions
    def condition(self, name: str) -> bool:
        if name not in self._conditions:
            definition = self.template.body.get("Conditions", {}).get(name)
            if definition is None:
                raise TemplateError(f"{self.template.name}: condition {name!r} is not defined")
            self._conditions[name] = bool(self.resolve(definition))
        return self._conditions[name]

    def exists(self, resource: Resource) -> bool:
        return resource.condition is None or self.condition(resource.condition)

    # -------------------------------------------------------------------------------- intrinsics
    def resolve(self, value: Any) -> Any:
        """`value` with every intrinsic function replaced by its local result."""
        if isinstance(value, list):
            items = [self.resolve(item) for item in value]
            return [item for item in items if item is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, argument),) = value.items()
            if key == "Ref":
                return self.ref(str(argument))
            if key == "Condition":
                return self.condition(str(argument))
            if key.startswith("Fn::"):
                return self._function(key, argument)
        resolved = {k: self.resolve(v) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not NO_VALUE}

    def _function(self, key: str, argument: Any) -> Any:
        if key == "Fn::GetAtt":
            logical_id, attribute = argument.split(".", 1) if isinstance(argument, str) else argument
            return self.get_att(logical_id, self.resolve(attribute))
        if key == "Fn::Join":
            separator, items = argument
            return str(separator).join(str(self.resolve(item)) for item in self.resolve(items))
        if key == "Fn::Sub":
            return self._sub(argument)
        if key == "Fn::Select":
            index, items = argument
            return self.resolve(items)[int(self.resolve(index))]
        if key == "Fn::Split":
            separator, text = argument
            return str(self.resolve(text)).split(separator)
        if key == "Fn::If":
            name, when_true, when_false = argument
            return self.resolve(when_true if self.condition(name) else when_false)
        if key == "Fn::Equals":
            left, right = (self.resolve(a) for a in argument)
            return left == right
        if key == "Fn::Not":
            return not self.resolve(argument[0])
        if key == "Fn::And":
            return all(self.resolve(a) for a in argument)
        if key == "Fn::Or":
            return any(self.resolve(a) for a in argument)
        if key == "Fn::Base64":
            return base64.b64encode(str(self.resolve(argument)).encode()).decode()
        if key == "Fn::GetAZs":
            return list(self.local.availability_zones or (f"{self.local.region}a", f"{self.local.region}b"))
        raise TemplateError(f"{self.template.name}: {key} is not an intrinsic function local mode resolves")

    def _sub(self, argument: Any) -> str:
        text, variables = (argument, {}) if isinstance(argument, str) else (argument[0], argument[1])
        values = {k: self.resolve(v) for k, v in variables.items()}

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in values:
                return str(values[name])
            if "." in name:
                logical_id, attribute = name.split(".", 1)
                return str(self.get_att(logical_id, attribute))
            return str(self.ref(name))

        return _SUB_VARIABLE.sub(replace, text).replace("${!", "${")


def logical_id_of(value: Any) -> str | None:
    """The logical id a raw property refers to (`{"Ref": X}` or `{"Fn::GetAtt": [X, attr]}`)."""
    if isinstance(value, dict) and len(value) == 1:
        ((key, argument),) = value.items()
        if key == "Ref":
            return str(argument)
        if key == "Fn::GetAtt":
            return str(argument[0] if isinstance(argument, list) else argument.split(".", 1)[0])
    return None


def str_map(value: Any) -> dict[str, str]:
    """A template's map of strings (an environment, tags): JSON for a nested value, as CloudFormation passes it."""
    return {str(k): json.dumps(v) if isinstance(v, dict | list) else str(v) for k, v in (value or {}).items()}


def as_list(value: Any) -> list[Any]:
    """A property that may be one value, a list, or absent, as a list."""
    return value if isinstance(value, list) else [] if value is None else [value]
