"""The local topology, read from the synthesized templates: what `local up` creates and runs, and the
report of every resource it emulates or only reports (`local up --explain`).

Nothing here comes from serving.yaml: names, environments, timeouts, batch sizes, schedules, routes, IAM
policies and SageMaker variants are the templates' own, resolved by servestack/local/cloudformation/templates.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from servestack.local.apigateway import HttpApiDef, read_http_apis
from servestack.local.cloudformation import (
    PARTITION,
    Resolver,
    Resource,
    StackTemplate,
    TemplateError,
    as_list,
    logical_id_of,
)
from servestack.local.cloudwatch import AlarmDef, read_alarms
from servestack.local.codedeploy import LambdaDeploymentDef, read_lambda_deployments
from servestack.local.ecs import read_task_definitions
from servestack.local.events import RuleDef, read_rules
from servestack.local.firehose import DeliveryDef, read_deliveries
from servestack.local.lambda_ import EventSourceMappingDef, FunctionDef, read_functions, read_lambda
from servestack.local.sagemaker import (
    EndpointDef,
    TransformDef,
    read_endpoint,
    read_transforms,
)
from servestack.local.scheduler import ScheduleDef, TaskDef, read_schedules
from servestack.local.stack.notification_resources import BucketNotificationsDef, read_bucket_notifications
from servestack.local.stack.report import ResourceReport, report_of

# ------------------------------------------------------------------------------------------ definitions


@dataclass(frozen=True)
class RoleDef:
    logical_id: str
    name: str
    arn: str
    trusted_services: tuple[str, ...]
    policies: tuple[dict[str, Any], ...]  # identity-based policy documents, resolved
    managed_policy_arns: tuple[str, ...] = ()


@dataclass(frozen=True)
class QueueDef:
    logical_id: str
    name: str
    url: str
    arn: str
    attributes: dict[str, str]  # SetQueueAttributes form; RedrivePolicy as JSON
    dead_letter_arn: str | None


@dataclass(frozen=True)
class BucketDef:
    logical_id: str
    name: str
    arn: str
    versioned: bool
    notifications: dict[str, Any] = field(default_factory=dict)  # PutBucketNotificationConfiguration form


@dataclass(frozen=True)
class TableDef:
    logical_id: str
    name: str
    arn: str
    create: dict[str, Any]  # CreateTable arguments
    ttl_attribute: str | None


@dataclass(frozen=True)
class TopicDef:
    logical_id: str
    name: str
    arn: str
    subscriptions: tuple[tuple[str, str, bool], ...]  # (protocol, endpoint, raw message delivery)


@dataclass
class StackTopology:
    """Everything one stack (one deployment) asks for, resolved."""

    stack: str
    deployment: str
    mode: str
    roles: dict[str, RoleDef] = field(default_factory=dict)
    functions: dict[str, FunctionDef] = field(default_factory=dict)
    queues: dict[str, QueueDef] = field(default_factory=dict)
    buckets: dict[str, BucketDef] = field(default_factory=dict)
    tables: dict[str, TableDef] = field(default_factory=dict)
    topics: dict[str, TopicDef] = field(default_factory=dict)
    mappings: list[EventSourceMappingDef] = field(default_factory=list)
    schedules: list[ScheduleDef] = field(default_factory=list)
    apis: dict[str, HttpApiDef] = field(default_factory=dict)
    endpoints: dict[str, EndpointDef] = field(default_factory=dict)
    tasks: dict[str, TaskDef] = field(default_factory=dict)
    transforms: list[TransformDef] = field(default_factory=list)
    models: list[str] = field(default_factory=list)  # the SageMaker models' names (CreateTransformJob's ModelName)
    resource_policies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # resource ARN -> docs
    versioned: set[str] = field(default_factory=set)  # functions the template publishes a version of
    outputs: dict[str, str] = field(default_factory=dict)
    report: list[ResourceReport] = field(default_factory=list)
    lambda_deployments: list[LambdaDeploymentDef] = field(default_factory=list)  # CodeDeploy's, for `local deploy`
    bucket_notifications: list[BucketNotificationsDef] = field(default_factory=list)  # applied as their handler
    rules: list[RuleDef] = field(default_factory=list)  # the EventBridge rules local mode plays
    alarms: list[AlarmDef] = field(default_factory=list)  # the alarms local mode can evaluate
    deliveries: list[DeliveryDef] = field(default_factory=list)  # Firehose streams fed by log subscriptions

    def function_by_arn(self, arn: str) -> FunctionDef | None:
        base = ":".join(arn.split(":")[:7])
        return next((f for f in self.functions.values() if f.arn == base), None)


def read_stack(template: StackTemplate, resolver: Resolver) -> StackTopology:
    """The stack's topology; raises `TemplateError` for a template local mode cannot run faithfully."""
    deployment = template.tag("servestack:deployment") or template.name
    mode = template.tag("servestack:mode") or "unknown"
    topology = StackTopology(template.name, deployment, mode, report=report_of(template, resolver))
    resources = [r for r in template.resources.values() if resolver.exists(r)]
    r = resolver.resolve
    name = resolver.physical_name

    for res in resources:
        p = res.properties
        if res.type == "AWS::IAM::Role":
            trust = r(p.get("AssumeRolePolicyDocument", {}))
            services = tuple(
                str(s)
                for statement in as_list(trust.get("Statement"))
                for s in as_list((statement.get("Principal") or {}).get("Service"))
            )
            inline = tuple(r(policy["PolicyDocument"]) for policy in as_list(p.get("Policies")))
            topology.roles[res.logical_id] = RoleDef(
                res.logical_id,
                name(res.logical_id),
                resolver.get_att(res.logical_id, "Arn"),
                services,
                inline,
                tuple(str(a) for a in r(p.get("ManagedPolicyArns", []))),
            )
    for res in resources:
        p = res.properties
        if res.type == "AWS::IAM::Policy":
            document = r(p["PolicyDocument"])
            for role_ref in as_list(p.get("Roles")):
                role_id = logical_id_of(role_ref)
                if role_id in topology.roles:
                    role = topology.roles[role_id]
                    topology.roles[role_id] = RoleDef(
                        role.logical_id, role.name, role.arn, role.trusted_services,
                        (*role.policies, document), role.managed_policy_arns,
                    )  # fmt: skip
        elif res.type == "AWS::S3::Bucket":
            versioned = (r(p.get("VersioningConfiguration")) or {}).get("Status") == "Enabled"
            notifications = r(p.get("NotificationConfiguration")) or {}
            topology.buckets[res.logical_id] = BucketDef(
                res.logical_id,
                name(res.logical_id),
                resolver.get_att(res.logical_id, "Arn"),
                versioned,
                _notification_form(notifications),
            )
        elif res.type == "AWS::SQS::Queue":
            attributes: dict[str, str] = {}
            for key in ("VisibilityTimeout", "MessageRetentionPeriod", "DelaySeconds", "MaximumMessageSize",
                        "ReceiveMessageWaitTimeSeconds", "FifoQueue", "ContentBasedDeduplication"):  # fmt: skip
                if key in p:
                    attributes[key] = str(r(p[key])).lower() if isinstance(p[key], bool) else str(r(p[key]))
            redrive = r(p.get("RedrivePolicy"))
            dead_letter = None
            if redrive:
                dead_letter = str(redrive["deadLetterTargetArn"])
                attributes["RedrivePolicy"] = json.dumps(
                    {"deadLetterTargetArn": dead_letter, "maxReceiveCount": str(redrive["maxReceiveCount"])}
                )
            topology.queues[res.logical_id] = QueueDef(
                res.logical_id,
                name(res.logical_id),
                resolver.ref(res.logical_id),
                resolver.get_att(res.logical_id, "Arn"),
                attributes,
                dead_letter,
            )
        elif res.type == "AWS::DynamoDB::Table":
            create: dict[str, Any] = {
                "TableName": name(res.logical_id),
                "KeySchema": r(p["KeySchema"]),
                "AttributeDefinitions": r(p["AttributeDefinitions"]),
                "BillingMode": r(p.get("BillingMode", "PROVISIONED")),
            }
            if create["BillingMode"] == "PROVISIONED":
                create["ProvisionedThroughput"] = r(p.get("ProvisionedThroughput")) or {
                    "ReadCapacityUnits": 5,
                    "WriteCapacityUnits": 5,
                }
            for key in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes", "StreamSpecification"):
                if key in p:
                    create[key] = r(p[key])
            ttl = r(p.get("TimeToLiveSpecification")) or {}
            topology.tables[res.logical_id] = TableDef(
                res.logical_id,
                name(res.logical_id),
                resolver.get_att(res.logical_id, "Arn"),
                create,
                ttl.get("AttributeName") if ttl.get("Enabled") else None,
            )
        elif res.type == "AWS::SNS::Topic":
            subscriptions = tuple((str(s["Protocol"]), str(s["Endpoint"]), False) for s in r(p.get("Subscription", [])))
            topology.topics[res.logical_id] = TopicDef(
                res.logical_id, name(res.logical_id), resolver.ref(res.logical_id), subscriptions
            )
    for res in resources:
        p = res.properties
        if res.type == "AWS::SNS::Subscription":
            topic_id = logical_id_of(p["TopicArn"])
            if topic_id in topology.topics:
                topic = topology.topics[topic_id]
                subscription = (str(r(p["Protocol"])), str(r(p["Endpoint"])), bool(r(p.get("RawMessageDelivery"))))
                topology.topics[topic_id] = TopicDef(
                    topic.logical_id, topic.name, topic.arn, (*topic.subscriptions, subscription)
                )
        elif res.type in ("AWS::S3::BucketPolicy", "AWS::SQS::QueuePolicy", "AWS::SNS::TopicPolicy"):
            document = r(p["PolicyDocument"])
            for arn in _policy_targets(res, p, topology, resolver):
                topology.resource_policies.setdefault(arn, []).append(document)
    topology.functions = read_functions(template, resolver, resources, topology.roles)
    found = read_lambda(template, resolver, resources, topology.functions)
    topology.functions, topology.versioned, topology.mappings = found.functions, found.versioned, found.mappings
    for arn, document in found.permissions:
        topology.resource_policies.setdefault(arn, []).append(document)
    topology.tasks = read_task_definitions(template, resolver, resources)
    topology.schedules = read_schedules(resolver, resources)
    for res in resources:
        if res.type == "AWS::SageMaker::Endpoint":
            topology.endpoints[res.logical_id] = read_endpoint(template, resolver, res, resources)
    hosted = {c.logical_id for e in topology.endpoints.values() for c in e.components}
    for res in resources:
        if res.type == "AWS::SageMaker::InferenceComponent" and res.logical_id not in hosted:
            raise TemplateError(
                f"{template.name}: inference component {res.logical_id} names an endpoint that is not in the stack"
            )
    topology.transforms = read_transforms(template, resolver, resources, topology.schedules)
    topology.models = [resolver.physical_name(m.logical_id) for m in resources if m.type == "AWS::SageMaker::Model"]
    topology.apis = read_http_apis(template, resolver, resources, topology.function_by_arn)
    for key, output in template.body.get("Outputs", {}).items():
        topology.outputs[key] = str(resolver.resolve(output["Value"]))
    topology.lambda_deployments = read_lambda_deployments(template, resolver)
    topology.bucket_notifications = read_bucket_notifications(template, resolver)
    topology.rules, _ = read_rules(resolver, resources)
    topology.alarms, _ = read_alarms(resolver, resources)
    topology.deliveries, _ = read_deliveries(resolver, resources)
    return topology


def _notification_form(configuration: Mapping[str, Any]) -> dict[str, Any]:
    """A template's `NotificationConfiguration` in PutBucketNotificationConfiguration's shape."""
    form: dict[str, Any] = {}
    for template_key, api_key, target_key, api_target in (
        ("QueueConfigurations", "QueueConfigurations", "Queue", "QueueArn"),
        ("TopicConfigurations", "TopicConfigurations", "Topic", "TopicArn"),
        ("LambdaConfigurations", "LambdaFunctionConfigurations", "Function", "LambdaFunctionArn"),
    ):
        items = []
        for item in configuration.get(template_key, []):
            entry: dict[str, Any] = {
                api_target: item[target_key],
                "Events": as_list(item.get("Events") or item.get("Event")),
            }
            rules = ((item.get("Filter") or {}).get("S3Key") or {}).get("Rules")
            if rules:
                entry["Filter"] = {"Key": {"FilterRules": [{"Name": x["Name"], "Value": x["Value"]} for x in rules]}}
            items.append(entry)
        if items:
            form[api_key] = items
    return form


def _policy_targets(res: Resource, p: Mapping[str, Any], topology: StackTopology, resolver: Resolver) -> list[str]:
    if res.type == "AWS::S3::BucketPolicy":
        bucket = str(resolver.resolve(p["Bucket"]))
        return [f"arn:{PARTITION}:s3:::{bucket}"]
    if res.type == "AWS::SQS::QueuePolicy":
        urls = [str(u) for u in resolver.resolve(p["Queues"])]
        return [q.arn for q in topology.queues.values() if q.url in urls]
    return [str(t) for t in resolver.resolve(p["Topics"])]
