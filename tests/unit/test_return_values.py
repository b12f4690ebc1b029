"""`Ref` and `Fn::GetAtt` of every resource type the synthesized templates use, against what the CloudFormation
template reference documents in each type's "Return values" section.

Each row names the type, the properties a template gives it, what `Ref` returns and what each attribute
returns (a literal, or a pattern where CloudFormation draws an id), and the reference's own words. The pages
are `https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-<service>-<type>.html`.
tests/infra/test_local_topology.py checks that every type the app synthesizes has a row in local mode's table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from servestack.local.cloudformation.return_values import RETURN_VALUES
from servestack.local.cloudformation.templates import LocalValues, Resolver, StackTemplate, TemplateError

LOCAL = LocalValues(region="eu-west-1", account="123456789012", emulator_url="http://emu:5000",
                    api_urls={"Subject": "http://127.0.0.1:9000"})  # fmt: skip
ARN = "arn:aws:{service}:eu-west-1:123456789012:{resource}"
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
EC2_ID = r"[0-9a-f]{17}"

# Resources the subject's properties refer to.
NEIGHBOURS: dict[str, Any] = {
    "Vpc": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.0.0.0/16"}},
    "Table": {"Type": "AWS::EC2::RouteTable", "Properties": {"VpcId": {"Ref": "Vpc"}}},
    "Fn": {"Type": "AWS::Lambda::Function", "Properties": {"FunctionName": "fn"}},
    "Topic": {"Type": "AWS::SNS::Topic", "Properties": {"TopicName": "news"}},
    "Target": {"Type": "AWS::ApplicationAutoScaling::ScalableTarget", "Properties": {
        "ResourceId": "endpoint/ep/variant/primary", "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
        "ServiceNamespace": "sagemaker"}},
}  # fmt: skip


@dataclass(frozen=True)
class Row:
    type: str
    documented: str  # the reference's words for Ref (and the attributes, where they say more)
    ref: str  # a regular expression the whole value must match
    properties: dict[str, Any] = field(default_factory=dict)
    attributes: dict[str, str] = field(default_factory=dict)  # attribute -> regular expression


def literal(text: str) -> str:
    return re.escape(text)


ROWS = [
    Row("AWS::ApiGatewayV2::Api", "Ref returns the API ID, such as a1bcdef2gh", "[a-z0-9]{10}", {"Name": "label"},
        {"ApiId": "[a-z0-9]{10}", "ApiEndpoint": literal("http://127.0.0.1:9000")}),
    Row("AWS::ApiGatewayV2::Integration", "Ref returns the Integration resource ID, such as abcd123", "[a-z0-9]{7}",
        attributes={"IntegrationId": "[a-z0-9]{7}"}),
    Row("AWS::ApiGatewayV2::Route", "Ref returns the Route resource ID, such as abcd123", "[a-z0-9]{7}",
        attributes={"RouteId": "[a-z0-9]{7}"}),
    Row("AWS::ApiGatewayV2::Stage", "Ref returns the stage name, such as MyTestStage", literal("$default"),
        {"StageName": "$default"}),
    Row("AWS::ApplicationAutoScaling::ScalableTarget",
        "Ref returns the CloudFormation-generated ID of the resource ... service/resource_ID|scalable_dimension|"
        "service_namespace",
        literal("endpoint/ep/variant/primary|sagemaker:variant:DesiredInstanceCount|sagemaker"),
        NEIGHBOURS["Target"]["Properties"],
        {"Id": literal("endpoint/ep/variant/primary|sagemaker:variant:DesiredInstanceCount|sagemaker")}),
    Row("AWS::ApplicationAutoScaling::ScalingPolicy",
        "Ref returns the Application Auto Scaling scaling policy Amazon Resource Name (ARN). For example: "
        "arn:aws:autoscaling:us-east-2:123456789012:scalingPolicy:12ab3c4d-...:resource/ecs/service/...:policyName/"
        "my-step-scaling-policy",
        literal("arn:aws:autoscaling:eu-west-1:123456789012:scalingPolicy:") + UUID
        + literal(":resource/sagemaker/endpoint/ep/variant/primary:policyName/scale-out"),
        {"PolicyName": "scale-out", "ScalingTargetId": {"Ref": "Target"}}),
    Row("AWS::CloudWatch::Alarm", "Ref returns the alarm name ... Arn: arn:aws:cloudwatch:us-west-2:123456789012:"
        "alarm:myCloudWatchAlarm-CPUAlarm-UXMMZK36R55Z", literal("errors"), {"AlarmName": "errors"},
        {"Arn": literal(ARN.format(service="cloudwatch", resource="alarm:errors"))}),
    Row("AWS::CloudWatch::Dashboard", "Ref returns the value of DashboardName", literal("board"),
        {"DashboardName": "board"}),
    Row("AWS::CodeBuild::Project", "Ref returns the name of the AWS CodeBuild project ... Arn: arn:aws:codebuild:"
        "us-west-2:123456789012:project/myProjectName", literal("smoke"), {"Name": "smoke"},
        {"Arn": literal(ARN.format(service="codebuild", resource="project/smoke"))}),
    Row("AWS::CodeDeploy::Application", "the function returns the application name", literal("app"),
        {"ApplicationName": "app"}),
    Row("AWS::CodeDeploy::DeploymentConfig", "the function returns the deployment configuration name",
        literal("canary"), {"DeploymentConfigName": "canary"}),
    Row("AWS::CodeDeploy::DeploymentGroup", "the function returns the deployment group name", literal("group"),
        {"DeploymentGroupName": "group"}),
    Row("AWS::CodePipeline::Pipeline", "Ref returns the pipeline name ... Version: a new pipeline is always "
        "assigned a version number of 1", literal("pipe"), {"Name": "pipe"}, {"Version": "1"}),
    Row("AWS::DynamoDB::Table", "Ref returns the resource name ... Arn: arn:aws:dynamodb:us-east-2:123456789012:"
        "table/myDynamoDBTable", literal("jobs"), {"TableName": "jobs"},
        {"Arn": literal(ARN.format(service="dynamodb", resource="table/jobs")),
         "StreamArn": literal(ARN.format(service="dynamodb", resource="table/jobs/stream/")) + ".+"}),
    Row("AWS::EC2::FlowLog", "Ref returns the flow log ID, such as fl-123456abc123abc1", "fl-" + EC2_ID,
        attributes={"Id": "fl-" + EC2_ID}),
    Row("AWS::EC2::InternetGateway", "Ref returns the ID of the internet gateway", "igw-" + EC2_ID,
        attributes={"InternetGatewayId": "igw-" + EC2_ID}),
    Row("AWS::EC2::Route", "Ref returns the ID of the route (CloudFormation's physical ID: route table|CIDR)",
        f"rtb-{EC2_ID}" + literal("|0.0.0.0/0"),
        {"RouteTableId": {"Ref": "Table"}, "DestinationCidrBlock": "0.0.0.0/0"},
        {"CidrBlock": literal("0.0.0.0/0")}),
    Row("AWS::EC2::RouteTable", "Ref returns the ID of the route table", "rtb-" + EC2_ID, {"VpcId": {"Ref": "Vpc"}},
        {"RouteTableId": "rtb-" + EC2_ID}),
    Row("AWS::EC2::SecurityGroup", "Ref returns the resource ID ... GroupId: such as sg-94b3a1f6", "sg-" + EC2_ID,
        {"VpcId": {"Ref": "Vpc"}, "GroupDescription": "egress"},
        {"GroupId": "sg-" + EC2_ID, "VpcId": "vpc-" + EC2_ID}),
    Row("AWS::EC2::Subnet", "Ref returns the ID of the subnet", "subnet-" + EC2_ID,
        {"VpcId": {"Ref": "Vpc"}, "CidrBlock": "10.0.0.0/17", "AvailabilityZone": "eu-west-1a"},
        {"SubnetId": "subnet-" + EC2_ID, "VpcId": "vpc-" + EC2_ID, "CidrBlock": literal("10.0.0.0/17"),
         "AvailabilityZone": literal("eu-west-1a")}),
    Row("AWS::EC2::SubnetRouteTableAssociation", "Ref returns the ID of the subnet route table association",
        "rtbassoc-" + EC2_ID, attributes={"Id": "rtbassoc-" + EC2_ID}),
    Row("AWS::EC2::VPC", "Ref returns the ID of the VPC ... DefaultSecurityGroup: sg-b178e0d3", "vpc-" + EC2_ID,
        {"CidrBlock": "10.0.0.0/16"},
        {"VpcId": "vpc-" + EC2_ID, "CidrBlock": literal("10.0.0.0/16"), "DefaultSecurityGroup": "sg-" + EC2_ID,
         "DefaultNetworkAcl": "acl-" + EC2_ID}),
    Row("AWS::EC2::VPCEndpoint", "Ref returns the ID of the VPC endpoint", "vpce-" + EC2_ID,
        attributes={"Id": "vpce-" + EC2_ID}),
    Row("AWS::EC2::VPCGatewayAttachment", "Ref returns the ID of the VPC gateway attachment (physical ID: IGW|vpc)",
        "IGW" + literal("|") + "vpc-" + EC2_ID, {"VpcId": {"Ref": "Vpc"}}),
    Row("AWS::ECS::Cluster", "Ref returns the resource name ... Arn: arn:aws:ecs:us-east-2:123456789012:cluster/"
        "MyECSCluster", literal("batch"), {"ClusterName": "batch"},
        {"Arn": literal(ARN.format(service="ecs", resource="cluster/batch"))}),
    Row("AWS::ECS::TaskDefinition", "Ref returns the Amazon Resource Name (ARN) ... such as arn:aws:ecs:us-west-2:"
        "123456789012:task-definition/TaskDefinitionFamily:1",
        literal(ARN.format(service="ecs", resource="task-definition/weekly:1")), {"Family": "weekly"},
        {"TaskDefinitionArn": literal(ARN.format(service="ecs", resource="task-definition/weekly:1"))}),
    Row("AWS::Events::Rule", "Ref returns event rule ID, such as mystack-ScheduledRule-ABCDEFGHIJK ... Arn: "
        "arn:aws:events:us-east-2:123456789012:rule/example", literal("done"), {"Name": "done"},
        {"Arn": literal(ARN.format(service="events", resource="rule/done"))}),
    Row("AWS::IAM::Policy", "Ref returns the resource name (CloudFormation's generated physical ID)",
        literal("servestack-demo-Subject-") + "[A-Z0-9]{12}", {"PolicyName": "inline"}),
    Row("AWS::IAM::Role", "Ref returns the resource name ... Arn: arn:aws:iam::1234567890:role/MyRole-AJJHDSKSDF ... "
        "RoleId: the stable and unique string identifying the role", literal("runner"), {"RoleName": "runner"},
        {"Arn": literal("arn:aws:iam::123456789012:role/runner"), "RoleId": "AROA[A-Z0-9]{17}"}),
    Row("AWS::KMS::Alias", "Ref returns the alias name, such as alias/exampleAlias", literal("alias/pipeline"),
        {"AliasName": "alias/pipeline", "TargetKeyId": "k"}),
    Row("AWS::KMS::Key", "Ref returns the key ID, such as 1234abcd-12ab-34cd-56ef-1234567890ab ... Arn: arn:aws:kms:"
        "us-west-2:111122223333:key/1234abcd-...", UUID, {},
        {"KeyId": UUID, "Arn": literal(ARN.format(service="kms", resource="key/")) + UUID}),
    Row("AWS::Lambda::Alias", "Ref returns the resource ARN",
        literal(ARN.format(service="lambda", resource="function:fn:live")),
        {"FunctionName": {"Ref": "Fn"}, "Name": "live", "FunctionVersion": "1"},
        {"AliasArn": literal(ARN.format(service="lambda", resource="function:fn:live"))}),
    Row("AWS::Lambda::EventSourceMapping", "Ref returns the mapping's ID", UUID, {"FunctionName": {"Ref": "Fn"}},
        {"Id": UUID, "EventSourceMappingArn": literal(ARN.format(service="lambda", resource="event-source-mapping:"))
         + UUID}),
    Row("AWS::Lambda::Function", "Ref returns the resource name ... Arn: the ARN of the function", literal("fn2"),
        {"FunctionName": "fn2"}, {"Arn": literal(ARN.format(service="lambda", resource="function:fn2"))}),
    Row("AWS::Lambda::Permission", "no Ref documented: CloudFormation's generated physical ID",
        literal("servestack-demo-Subject-") + "[A-Z0-9]{12}", {"FunctionName": {"Ref": "Fn"}}),
    Row("AWS::Lambda::Version", "Ref returns the ARN of the version, such as arn:aws:lambda:us-west-2:123456789012:"
        "function:helloworld:1 ... Version: the version number",
        literal(ARN.format(service="lambda", resource="function:fn:1")), {"FunctionName": {"Ref": "Fn"}},
        {"Version": "1", "FunctionArn": literal(ARN.format(service="lambda", resource="function:fn"))}),
    Row("AWS::KinesisFirehose::DeliveryStream", "Ref returns the delivery stream name, such as "
        "mystack-deliverystream-1ABCD2EF3GHIJ ... Arn: the ARN of the delivery stream, such as "
        "arn:aws:firehose:us-east-2:123456789012:deliverystream/delivery-stream-name", literal("capture"),
        {"DeliveryStreamName": "capture"},
        {"Arn": literal(ARN.format(service="firehose", resource="deliverystream/capture"))}),
    Row("AWS::Logs::LogGroup", "Ref returns the resource name ... Arn: arn:aws:logs:us-west-1:123456789012:"
        "log-group:/mystack-testgroup-12ABC1AB12A1:*", literal("/batch"), {"LogGroupName": "/batch"},
        {"Arn": literal(ARN.format(service="logs", resource="log-group:/batch:*"))}),
    Row("AWS::Logs::LogStream", "Ref returns the resource name", literal("S3Delivery"),
        {"LogGroupName": "/firehose", "LogStreamName": "S3Delivery"}),
    Row("AWS::Logs::SubscriptionFilter", "no Ref documented: CloudFormation's generated physical ID",
        literal("servestack-demo-Subject-") + "[A-Z0-9]{12}", {"LogGroupName": "/g", "FilterPattern": ""}),
    Row("AWS::S3::Bucket", "Ref returns the bucket name ... Arn: arn:aws:s3:::DOC-EXAMPLE-BUCKET; DomainName: "
        "DOC-EXAMPLE-BUCKET.s3.amazonaws.com; RegionalDomainName: DOC-EXAMPLE-BUCKET.s3.us-east-2.amazonaws.com; "
        "DualStackDomainName: DOC-EXAMPLE-BUCKET.s3.dualstack.us-east-2.amazonaws.com; WebsiteURL: "
        "http://DOC-EXAMPLE-BUCKET.s3-website.us-east-2.amazonaws.com",
        literal("data"), {"BucketName": "data"},
        {"Arn": literal("arn:aws:s3:::data"), "DomainName": literal("data.s3.amazonaws.com"),
         "RegionalDomainName": literal("data.s3.eu-west-1.amazonaws.com"),
         "DualStackDomainName": literal("data.s3.dualstack.eu-west-1.amazonaws.com"),
         "WebsiteURL": literal("http://data.s3-website.eu-west-1.amazonaws.com")}),
    Row("AWS::S3::BucketPolicy", "no Ref documented: CloudFormation's generated physical ID",
        literal("servestack-demo-Subject-") + "[A-Z0-9]{12}", {"Bucket": "data"}),
    Row("AWS::SNS::Subscription", "Ref returns the subscription ARN (arn:aws:sns:region:account:topic:id)",
        literal(ARN.format(service="sns", resource="news:")) + UUID, {"TopicArn": {"Ref": "Topic"}, "Protocol": "sqs"},
        {"Arn": literal(ARN.format(service="sns", resource="news:")) + UUID}),
    Row("AWS::SNS::Topic", "Ref returns the topic ARN, for example: arn:aws:sns:us-east-1:123456789012:mystack-"
        "mytopic-NZJ5JSMVGFIE", literal(ARN.format(service="sns", resource="alerts")), {"TopicName": "alerts"},
        {"TopicArn": literal(ARN.format(service="sns", resource="alerts")), "TopicName": literal("alerts")}),
    Row("AWS::SNS::TopicPolicy", "Id: the provider-assigned unique ID (no Ref documented)",
        literal("servestack-demo-Subject-") + "[A-Z0-9]{12}", {"Topics": []},
        {"Id": literal("servestack-demo-Subject-") + "[A-Z0-9]{12}"}),
    Row("AWS::SQS::Queue", "Ref returns the queue URL ... Arn: arn:aws:sqs:us-east-2:123456789012:mystack-myqueue-"
        "15PG5C2FC1CW8", literal("http://emu:5000/123456789012/jobs"), {"QueueName": "jobs"},
        {"Arn": literal(ARN.format(service="sqs", resource="jobs")), "QueueName": literal("jobs"),
         "QueueUrl": literal("http://emu:5000/123456789012/jobs")}),
    Row("AWS::SQS::QueuePolicy", "Id: the provider-assigned unique ID for this managed resource (no Ref documented)",
        literal("servestack-demo-Subject-") + "[A-Z0-9]{12}", {"Queues": []},
        {"Id": literal("servestack-demo-Subject-") + "[A-Z0-9]{12}"}),
    Row("AWS::SageMaker::Endpoint", "Ref returns the Amazon Resource Name (ARN) of the endpoint, such as "
        "arn:aws:sagemaker:us-west-2:012345678901:endpoint/myendpoint",
        literal(ARN.format(service="sagemaker", resource="endpoint/digits-ep")), {"EndpointName": "Digits-Ep"},
        {"EndpointName": literal("Digits-Ep")}),
    Row("AWS::SageMaker::EndpointConfig", "Ref returns the Amazon Resource Name (ARN) of the endpoint configuration",
        literal(ARN.format(service="sagemaker", resource="endpoint-config/cfg")), {"EndpointConfigName": "cfg"},
        {"EndpointConfigName": literal("cfg")}),
    Row("AWS::SageMaker::InferenceComponent", "Ref returns the Amazon Resource Name (ARN) of the inference component",
        literal(ARN.format(service="sagemaker", resource="inference-component/ic")), {"InferenceComponentName": "ic"},
        {"InferenceComponentName": literal("ic"),
         "InferenceComponentArn": literal(ARN.format(service="sagemaker", resource="inference-component/ic"))}),
    Row("AWS::SageMaker::Model", "Ref returns the Amazon Resource Name (ARN) of the model, such as arn:aws:"
        "sagemaker:us-west-2:012345678901:model/mymodel",
        literal(ARN.format(service="sagemaker", resource="model/m1")), {"ModelName": "m1"},
        {"ModelName": literal("m1")}),
    Row("AWS::Scheduler::Schedule", "Ref returns the Name attribute of the schedule ... Arn: the ARN of the schedule",
        literal("nightly"), {"Name": "nightly"},
        {"Arn": literal(ARN.format(service="scheduler", resource="schedule/default/nightly"))}),
    Row("AWS::Scheduler::ScheduleGroup", "Ref returns the Name attribute of the schedule group ... Arn: the ARN of "
        "the schedule group (the API reference's pattern: ...:schedule-group/[0-9a-zA-Z-_.]+)",
        literal("scores"), {"Name": "scores"},
        {"Arn": literal(ARN.format(service="scheduler", resource="schedule-group/scores"))}),
    Row("AWS::StepFunctions::StateMachine", "Ref returns the ARN of the created state machine",
        literal(ARN.format(service="states", resource="stateMachine:flow")), {"StateMachineName": "flow"},
        {"Arn": literal(ARN.format(service="states", resource="stateMachine:flow")), "Name": literal("flow")}),
    Row("Custom::S3BucketNotifications", "a custom resource: the physical ID its handler returns",
        literal("servestack-demo-Subject-") + "[A-Z0-9]{12}", {"BucketName": "data"}),
]  # fmt: skip


def resolver_with(tmp_path: Path, row: Row) -> Resolver:
    resources = {**NEIGHBOURS, "Subject": {"Type": row.type, "Properties": row.properties}}
    path = tmp_path / "t.template.json"
    path.write_text(json.dumps({"Resources": resources}))
    return Resolver(StackTemplate.load(path, "servestack-demo"), LOCAL)


@pytest.mark.parametrize("row", ROWS, ids=[row.type for row in ROWS])
def test_ref_and_getatt_return_what_the_reference_documents(tmp_path: Path, row: Row) -> None:
    # GIVEN a template holding one resource of the type WHEN local mode resolves Ref and each attribute
    resolver = resolver_with(tmp_path, row)
    found = {"Ref": resolver.resolve({"Ref": "Subject"})}
    found |= {name: resolver.resolve({"Fn::GetAtt": ["Subject", name]}) for name in row.attributes}
    # THEN each is the documented value (row.documented quotes the reference)
    expected = {"Ref": row.ref, **row.attributes}
    wrong = {name: value for name, value in found.items() if not re.fullmatch(expected[name], str(value))}
    assert wrong == {}, f"{row.type}: documented as {row.documented!r}"
    # AND resolving again gives the same values (ids are stable across local up restarts)
    assert resolver_with(tmp_path, row).resolve({"Ref": "Subject"}) == found["Ref"]


def test_the_table_covers_every_row_and_nothing_else() -> None:
    assert sorted(RETURN_VALUES) == sorted(row.type for row in ROWS)


def test_an_attribute_the_reference_does_not_list_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    resolver = resolver_with(tmp_path, Row("AWS::ECS::TaskDefinition", "", "", {"Family": "weekly"}))
    with pytest.raises(TemplateError, match=r"Subject.Nope \(AWS::ECS::TaskDefinition\).*known: TaskDefinitionArn"):
        resolver.resolve({"Fn::GetAtt": ["Subject", "Nope"]})


def test_a_type_without_documented_return_values_is_refused_not_guessed(tmp_path: Path) -> None:
    resolver = resolver_with(tmp_path, Row("AWS::Glue::Job", "", "", {}))
    with pytest.raises(TemplateError, match=r"Ref Subject \(AWS::Glue::Job\).*not a type local mode knows"):
        resolver.resolve({"Ref": "Subject"})
