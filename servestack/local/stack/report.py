"""`local up --explain`'s report of a stack: every resource of its template, emulated (done as AWS does it) or only
reported (read, or named, but not run), and why."""

from __future__ import annotations

from dataclasses import dataclass

from servestack.local.apigateway import API_GATEWAY_TYPES
from servestack.local.cloudformation import (
    Resolver,
    Resource,
    StackTemplate,
    TemplateError,
)
from servestack.local.cloudwatch import EVALUATED_ALARM, NOT_EVALUATED_ALARM, read_alarms
from servestack.local.codedeploy import CODEDEPLOY_TYPES
from servestack.local.ecs import ECS_TYPES
from servestack.local.events import NOT_PLAYED_RULE, PLAYED_RULE, pattern_of, played, read_rules
from servestack.local.firehose import FIREHOSE_TYPES
from servestack.local.lambda_ import LAMBDA_TYPES
from servestack.local.logs import LOGS_TYPES
from servestack.local.sagemaker import SAGEMAKER_TYPES
from servestack.local.scheduler import SCHEDULER_TYPES, universal_action

# ------------------------------------------------------------------------------------------ the report

EMULATED: dict[str, str] = {
    "AWS::S3::Bucket": "bucket on the emulator (versioning, notifications)",
    "AWS::S3::BucketPolicy": "resource policy, evaluated on every call",
    "Custom::S3BucketNotifications": "the bucket's notification configuration, applied on the emulator with "
    "its handler role's keys, as its handler does on stack create and update",
    "AWS::SQS::Queue": "queue on the emulator (visibility timeout, retention, redrive to its DLQ)",
    "AWS::SQS::QueuePolicy": "resource policy, evaluated on every call and on notification set-up",
    "AWS::DynamoDB::Table": "table on the emulator (keys, billing mode, TTL attribute)",
    "AWS::SNS::Topic": "topic on the emulator",
    "AWS::SNS::Subscription": "subscription on the emulator (SQS, raw delivery)",
    "AWS::SNS::TopicPolicy": "resource policy, evaluated on every call",
    "AWS::IAM::Role": "credentials for the function or container that assumes it",
    "AWS::IAM::Policy": "identity policy, evaluated on every call the role makes",
    **LAMBDA_TYPES,
    **SCHEDULER_TYPES,
    **API_GATEWAY_TYPES,
    **SAGEMAKER_TYPES,
    **ECS_TYPES,
    **CODEDEPLOY_TYPES,
    **LOGS_TYPES,
    **FIREHOSE_TYPES,
}
REPORTED: dict[str, str] = {
    "AWS::CloudWatch::Alarm": NOT_EVALUATED_ALARM,
    "AWS::CloudWatch::Dashboard": "not emulated",
    "AWS::ApplicationAutoScaling::ScalableTarget": "not emulated: one instance per variant (one container per "
    "inference component) locally",
    "AWS::ApplicationAutoScaling::ScalingPolicy": "not emulated: one instance per variant (one container per "
    "inference component) locally",
    "AWS::KMS::Key": "not emulated: data at rest is not encrypted locally",
    "AWS::KMS::Alias": "not emulated: data at rest is not encrypted locally",
    "AWS::CDK::Metadata": "CDK's own metadata",
    "AWS::Events::Rule": NOT_PLAYED_RULE,
}
REPORTED_PREFIXES = {
    "AWS::EC2::": "not emulated: local processes share this machine's network",
    "AWS::ECS::": "not emulated (Fargate tasks)",
    "AWS::ECR::": "not emulated: images are not built locally",
}


@dataclass(frozen=True)
class ResourceReport:
    stack: str
    logical_id: str
    type: str
    physical_name: str
    emulated: bool
    how: str


CREATE_TRANSFORM_JOB = "sagemaker:createTransformJob"
NOT_RUN_UNIVERSAL = (
    "reported: its target is the AWS SDK action {action} (Scheduler's universal target); the local scheduler "
    "does not fire it"
)
RUN_CREATE_TRANSFORM_JOB = (
    "fired by the local scheduler on its expression (also now: `servestack local run-batch`): CreateTransformJob "
    "on local up's SageMaker API as the schedule's role (its sagemaker:CreateTransformJob grant checked on the "
    "job's ARN, the request validated as SageMaker does; refused: retried, then its dead-letter queue), then the "
    "job emulated"
)


def report_of(template: StackTemplate, resolver: Resolver) -> list[ResourceReport]:
    rows: list[ResourceReport] = []
    resources = [r for r in template.resources.values() if resolver.exists(r)]
    rules, refused_rules = read_rules(resolver, resources)
    played_rules = {rule.logical_id for rule in rules}
    alarms, _ = read_alarms(resolver, resources)
    evaluated = {alarm.name for alarm in alarms if alarm.evaluated_locally({rule.name for rule in rules})}
    for resource in template.resources.values():
        how = EMULATED.get(resource.type)
        emulated = how is not None
        if resource.type == "AWS::Events::Rule" and resource.logical_id in played_rules:
            events = played(pattern_of(resolver, resource.properties)) or ""
            how, emulated = PLAYED_RULE.format(events=events), True
        elif resource.type == "AWS::Events::Rule" and resource.logical_id in refused_rules:
            how = refused_rules[resource.logical_id]
        elif resource.type == "AWS::CloudWatch::Alarm" and _alarm_name(resolver, resource) in evaluated:
            how, emulated = EVALUATED_ALARM, True
        if resource.type == "AWS::Scheduler::Schedule":
            action = universal_action(str(resolver.resolve((resource.properties.get("Target") or {}).get("Arn", ""))))
            if action == CREATE_TRANSFORM_JOB:
                how, emulated = RUN_CREATE_TRANSFORM_JOB, True
            elif action is not None:
                how, emulated = NOT_RUN_UNIVERSAL.format(action=action), False
        if how is None:
            how = REPORTED.get(resource.type) or next(
                (text for prefix, text in REPORTED_PREFIXES.items() if resource.type.startswith(prefix)),
                "not emulated: unknown to local mode",
            )
        try:
            physical = resolver.physical_name(resource.logical_id)
        except TemplateError:
            physical = "-"
        rows.append(ResourceReport(template.name, resource.logical_id, resource.type, physical, emulated, how))
    return rows


def _alarm_name(resolver: Resolver, resource: Resource) -> str | None:
    try:
        named = resolver.resolve(resource.properties.get("AlarmName"))
        return str(named or resolver.physical_name(resource.logical_id))
    except TemplateError:
        return None
