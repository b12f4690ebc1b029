"""What `Ref` and `Fn::GetAtt` return for each resource type the synthesized templates use, as the
CloudFormation template reference documents it in each type's "Return values" section
(`https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-<service>-<type>.html`).

Where CloudFormation returns a name, the value is the resource's physical name
(servestack/local/cloudformation/templates.py
forms it). Where it returns an ARN, the ARN is built from that name. Where the service draws an id (a VPC's
`vpc-...`, a KMS key's UUID, an API's `a1bcdef2gh`), local mode draws one of the same shape from a hash of the
stack and the logical id, so it stays the same across `local up` restarts. A type missing from the table, or an
attribute its row does not list, is refused by the resolver rather than guessed (tests/unit/test_return_values.py
quotes the reference for every row).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

PARTITION = "aws"
URL_SUFFIX = "amazonaws.com"


class Site(Protocol):
    """What a return value may need from the resolver of its stack."""

    def resolve(self, value: Any) -> Any: ...

    def ref(self, logical_id: str) -> Any: ...


@dataclass(frozen=True)
class Subject:
    """The resource whose `Ref` or attribute is asked for, and the local values around it."""

    site: Site
    stack: str
    logical_id: str
    name: str  # physical name
    properties: Mapping[str, Any]  # as the template writes them (intrinsics unresolved)
    region: str
    account: str
    emulator_url: str
    api_url: str | None

    def prop(self, key: str, default: Any = None) -> Any:
        return self.site.resolve(self.properties[key]) if key in self.properties else default

    def arn(self, service: str, resource: str, *, region: bool = True, account: bool = True) -> str:
        return f"arn:{PARTITION}:{service}:{self.region if region else ''}:{self.account if account else ''}:{resource}"

    def _digest(self, salt: str) -> bytes:
        return hashlib.sha256(f"{self.stack}/{self.logical_id}/{salt}".encode()).digest()

    def ec2_id(self, prefix: str) -> str:
        """An EC2 id of the current long form (`vpc-0a1b2c3d4e5f67890`: 17 hex digits)."""
        return f"{prefix}-{self._digest(prefix).hex()[:17]}"

    def short_id(self, length: int) -> str:
        """An API Gateway id (`a1bcdef2gh`, or `abcd123` for routes and integrations)."""
        return hashlib.sha256(f"{self.stack}/{self.logical_id}".encode()).hexdigest()[:length]

    def uuid(self, salt: str = "") -> str:
        return str(uuid.UUID(bytes=self._digest(salt or "uuid")[:16]))

    def unique_id(self, prefix: str) -> str:
        """An IAM unique id (`AROA` + 17 characters)."""
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
        return prefix + "".join(alphabet[b % 32] for b in self._digest(prefix)[:17])


Value = Callable[[Subject], Any]


@dataclass(frozen=True)
class ReturnValues:
    ref: Value
    attributes: Mapping[str, Value]


def _name(s: Subject) -> str:
    return s.name


def _sagemaker(kind: str) -> Value:
    # The name is lower-cased in SageMaker ARNs (the reference's example: endpoint/myendpoint for MyEndpoint).
    return lambda s: s.arn("sagemaker", f"{kind}/{s.name.lower()}")


def _function_arn(s: Subject) -> str:
    function = str(s.prop("FunctionName"))
    return function if function.startswith("arn:") else s.arn("lambda", f"function:{function}")


def _queue_url(s: Subject) -> str:
    return f"{s.emulator_url}/{s.account}/{s.name}"


def _scalable_target_id(s: Subject) -> str:
    return f"{s.prop('ResourceId')}|{s.prop('ScalableDimension')}|{s.prop('ServiceNamespace')}"


def _scaling_policy_arn(s: Subject) -> str:
    target = s.prop("ScalingTargetId")
    if target is not None:
        resource, _, namespace = str(target).split("|")
    else:
        resource, namespace = str(s.prop("ResourceId")), str(s.prop("ServiceNamespace"))
    return s.arn("autoscaling", f"scalingPolicy:{s.uuid()}:resource/{namespace}/{resource}:policyName/{s.name}")


def _route_id(s: Subject) -> str:
    # CloudFormation's physical id of a route: its table and destination (the reference says only "the ID").
    return f"{s.prop('RouteTableId')}|{s.prop('DestinationCidrBlock') or s.prop('DestinationIpv6CidrBlock')}"


def _same(ref: Value, *names: str) -> dict[str, Value]:
    return dict.fromkeys(names, ref)


def _ec2(prefix: str, *id_attributes: str, **others: Value) -> ReturnValues:
    def ref(s: Subject) -> str:
        return s.ec2_id(prefix)

    return ReturnValues(ref, {**_same(ref, *id_attributes), **others})


def _task_definition_arn(s: Subject) -> str:
    return s.arn("ecs", f"task-definition/{s.name}:1")  # the first revision of the family


def _lambda_alias_arn(s: Subject) -> str:
    return f"{_function_arn(s)}:{s.prop('Name')}"


def _lambda_version_arn(s: Subject) -> str:
    return f"{_function_arn(s)}:1"


def _subscription_arn(s: Subject) -> str:
    return f"{s.prop('TopicArn')}:{s.uuid()}"


def _state_machine_arn(s: Subject) -> str:
    return s.arn("states", f"stateMachine:{s.name}")


def _schedule_arn(s: Subject) -> str:
    return s.arn("scheduler", f"schedule/{s.prop('GroupName') or 'default'}/{s.name}")


def _api_endpoint(s: Subject) -> str:
    return s.api_url or f"https://{s.short_id(10)}.execute-api.{s.region}.{URL_SUFFIX}"


def _integration_id(s: Subject) -> str:
    return s.short_id(7)


def _event_source_mapping_id(s: Subject) -> str:
    return s.uuid()


RETURN_VALUES: dict[str, ReturnValues] = {
    "AWS::ApiGatewayV2::Api": ReturnValues(_name, {"ApiId": _name, "ApiEndpoint": _api_endpoint}),
    "AWS::ApiGatewayV2::Integration": ReturnValues(_integration_id, {"IntegrationId": _integration_id}),
    "AWS::ApiGatewayV2::Route": ReturnValues(_integration_id, {"RouteId": _integration_id}),
    "AWS::ApiGatewayV2::Stage": ReturnValues(_name, {}),
    "AWS::ApplicationAutoScaling::ScalableTarget": ReturnValues(_scalable_target_id, {"Id": _scalable_target_id}),
    "AWS::ApplicationAutoScaling::ScalingPolicy": ReturnValues(_scaling_policy_arn, {"Arn": _scaling_policy_arn}),
    "AWS::CloudWatch::Alarm": ReturnValues(_name, {"Arn": lambda s: s.arn("cloudwatch", f"alarm:{s.name}")}),
    "AWS::CloudWatch::Dashboard": ReturnValues(_name, {}),
    "AWS::CodeBuild::Project": ReturnValues(_name, {"Arn": lambda s: s.arn("codebuild", f"project/{s.name}")}),
    "AWS::CodeDeploy::Application": ReturnValues(_name, {}),
    "AWS::CodeDeploy::DeploymentConfig": ReturnValues(_name, {}),
    "AWS::CodeDeploy::DeploymentGroup": ReturnValues(_name, {}),
    "AWS::CodePipeline::Pipeline": ReturnValues(_name, {"Version": lambda s: "1"}),
    "AWS::DynamoDB::Table": ReturnValues(_name, {
        "Arn": lambda s: s.arn("dynamodb", f"table/{s.name}"),
        "StreamArn": lambda s: s.arn("dynamodb", f"table/{s.name}/stream/1970-01-01T00:00:00.000"),
    }),
    "AWS::EC2::FlowLog": _ec2("fl", "Id"),
    "AWS::EC2::InternetGateway": _ec2("igw", "InternetGatewayId"),
    "AWS::EC2::Route": ReturnValues(_route_id, {"CidrBlock": lambda s: s.prop("DestinationCidrBlock")}),
    "AWS::EC2::RouteTable": _ec2("rtb", "RouteTableId"),
    "AWS::EC2::SecurityGroup": _ec2("sg", "GroupId", VpcId=lambda s: s.prop("VpcId")),
    "AWS::EC2::Subnet": _ec2(
        "subnet", "SubnetId", VpcId=lambda s: s.prop("VpcId"), CidrBlock=lambda s: s.prop("CidrBlock"),
        AvailabilityZone=lambda s: s.prop("AvailabilityZone", f"{s.region}a"),
    ),
    "AWS::EC2::SubnetRouteTableAssociation": _ec2("rtbassoc", "Id"),
    "AWS::EC2::VPC": _ec2(
        "vpc", "VpcId", CidrBlock=lambda s: s.prop("CidrBlock"),
        DefaultSecurityGroup=lambda s: s.ec2_id("sg"), DefaultNetworkAcl=lambda s: s.ec2_id("acl"),
    ),
    "AWS::EC2::VPCEndpoint": _ec2("vpce", "Id"),
    # CloudFormation's physical id of an internet gateway's attachment: `IGW|<vpc id>`.
    "AWS::EC2::VPCGatewayAttachment": ReturnValues(lambda s: f"IGW|{s.prop('VpcId')}", {}),
    "AWS::ECS::Cluster": ReturnValues(_name, {"Arn": lambda s: s.arn("ecs", f"cluster/{s.name}")}),
    "AWS::ECS::TaskDefinition": ReturnValues(_task_definition_arn, {"TaskDefinitionArn": _task_definition_arn}),
    "AWS::Events::Rule": ReturnValues(_name, {"Arn": lambda s: s.arn("events", f"rule/{s.name}")}),
    "AWS::IAM::Policy": ReturnValues(_name, {"Id": _name}),
    "AWS::IAM::Role": ReturnValues(_name, {
        "Arn": lambda s: s.arn("iam", f"role/{s.name}", region=False), "RoleId": lambda s: s.unique_id("AROA"),
    }),
    "AWS::KinesisFirehose::DeliveryStream": ReturnValues(_name, {
        "Arn": lambda s: s.arn("firehose", f"deliverystream/{s.name}"),
    }),
    "AWS::KMS::Alias": ReturnValues(_name, {}),
    "AWS::KMS::Key": ReturnValues(lambda s: s.uuid(), {
        "KeyId": lambda s: s.uuid(), "Arn": lambda s: s.arn("kms", f"key/{s.uuid()}"),
    }),
    "AWS::Lambda::Alias": ReturnValues(_lambda_alias_arn, {"AliasArn": _lambda_alias_arn}),
    "AWS::Lambda::EventSourceMapping": ReturnValues(_event_source_mapping_id, {
        "Id": _event_source_mapping_id,
        "EventSourceMappingArn": lambda s: s.arn("lambda", f"event-source-mapping:{s.uuid()}"),
    }),
    "AWS::Lambda::Function": ReturnValues(_name, {"Arn": lambda s: s.arn("lambda", f"function:{s.name}")}),
    "AWS::Lambda::Permission": ReturnValues(_name, {}),
    # Local mode publishes version 1 of a function (it runs the bundle the template names).
    "AWS::Lambda::Version": ReturnValues(_lambda_version_arn, {"Version": lambda s: "1", "FunctionArn": _function_arn}),
    "AWS::Logs::LogGroup": ReturnValues(_name, {"Arn": lambda s: s.arn("logs", f"log-group:{s.name}:*")}),
    "AWS::Logs::LogStream": ReturnValues(_name, {}),
    "AWS::Logs::SubscriptionFilter": ReturnValues(_name, {}),
    "AWS::S3::Bucket": ReturnValues(_name, {
        "Arn": lambda s: f"arn:{PARTITION}:s3:::{s.name}",
        "DomainName": lambda s: f"{s.name}.s3.{URL_SUFFIX}",
        "RegionalDomainName": lambda s: f"{s.name}.s3.{s.region}.{URL_SUFFIX}",
        "DualStackDomainName": lambda s: f"{s.name}.s3.dualstack.{s.region}.{URL_SUFFIX}",
        "WebsiteURL": lambda s: f"http://{s.name}.s3-website.{s.region}.{URL_SUFFIX}",
    }),
    "AWS::S3::BucketPolicy": ReturnValues(_name, {}),
    "AWS::SNS::Subscription": ReturnValues(_subscription_arn, {"Arn": _subscription_arn}),
    "AWS::SNS::Topic": ReturnValues(lambda s: s.arn("sns", s.name), {
        "TopicArn": lambda s: s.arn("sns", s.name), "TopicName": _name,
    }),
    "AWS::SNS::TopicPolicy": ReturnValues(_name, {"Id": _name}),
    "AWS::SQS::Queue": ReturnValues(_queue_url, {
        "Arn": lambda s: s.arn("sqs", s.name), "QueueName": _name, "QueueUrl": _queue_url,
    }),
    "AWS::SQS::QueuePolicy": ReturnValues(_name, {"Id": _name}),
    "AWS::SageMaker::Endpoint": ReturnValues(_sagemaker("endpoint"), {"EndpointName": _name}),
    "AWS::SageMaker::EndpointConfig": ReturnValues(_sagemaker("endpoint-config"), {"EndpointConfigName": _name}),
    "AWS::SageMaker::InferenceComponent": ReturnValues(_sagemaker("inference-component"), {
        "InferenceComponentName": _name, "InferenceComponentArn": _sagemaker("inference-component"),
    }),
    "AWS::SageMaker::Model": ReturnValues(_sagemaker("model"), {"ModelName": _name}),
    "AWS::Scheduler::Schedule": ReturnValues(_name, {"Arn": _schedule_arn}),
    "AWS::Scheduler::ScheduleGroup": ReturnValues(_name, {
        "Arn": lambda s: s.arn("scheduler", f"schedule-group/{s.name}"),
    }),
    "AWS::StepFunctions::StateMachine": ReturnValues(_state_machine_arn, {"Arn": _state_machine_arn, "Name": _name}),
    # A custom resource's Ref is the physical id its handler returns; CDK's notifications handler returns none of
    # its own, so CloudFormation's generated one stands.
    "Custom::S3BucketNotifications": ReturnValues(_name, {}),
}  # fmt: skip
