"""`local up --explain`'s report of a stack: every resource of its template, emulated (done as AWS does it) or only
reported (read, or named, but not run), and why."""

from __future__ import annotations

from dataclasses import dataclass

from servestack.local.cloudformation import (
    Resolver,
    StackTemplate,
    TemplateError,
)
from servestack.local.scheduler import universal_action

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
    "AWS::Lambda::Function": "handler run in a local process: the template's handler, environment, timeout, memory",
    "AWS::Lambda::Version": "accepted as an Invoke qualifier (local mode runs the working tree)",
    "AWS::Lambda::Alias": "accepted as an Invoke qualifier (local mode runs the working tree)",
    "AWS::Lambda::EventSourceMapping": "SQS poller: batch size, window, partial failures, maximum concurrency",
    "AWS::Lambda::Permission": "resource policy: checked for the HTTP API and schedule that invoke the function",
    "AWS::Scheduler::Schedule": "local scheduler: expression, time zone, input, retries, DLQ; each run (and "
    "`local run-batch`) started as its role; GetSchedule on local up's AWS API port",
    "AWS::ApiGatewayV2::Api": "local HTTP API front",
    "AWS::ApiGatewayV2::Route": "route with its authorizer (AWS_IAM: SigV4 + execute-api:Invoke)",
    "AWS::ApiGatewayV2::Integration": "Lambda proxy integration (payload 2.0, timeout)",
    "AWS::ApiGatewayV2::Stage": "the $default stage",
    "AWS::SageMaker::Model": "its image run from the staged build context, its model data fetched with its role",
    "AWS::SageMaker::EndpointConfig": "variants, weights, shadow, serverless and async configuration, model mode",
    "AWS::SageMaker::Endpoint": "local endpoint behind the SageMaker Runtime front",
    "AWS::SageMaker::InferenceComponent": "its model's container run locally, invoked by InferenceComponentName; "
    "copies set by UpdateInferenceComponentRuntimeConfig (0 stops it)",
    "AWS::Logs::LogGroup": "on the emulator: each child's output written with its role, and to local up's output",
    "AWS::ECS::TaskDefinition": (
        "its container run from the image's staged build context (COPY, ENV, WORKDIR; the definition's entry "
        "point, command and environment), as its task role; RunTask and PassRole checked as the schedule's role"
    ),
    "AWS::CodeDeploy::Application": "`local deploy` of a serverless deployment: CodeDeploy's API on local up's port",
    "AWS::CodeDeploy::DeploymentConfig": "the release's steps and interval (`local deploy` of a serverless deployment)",
    "AWS::CodeDeploy::DeploymentGroup": "`local deploy` of a serverless deployment: the pre-traffic hook under its "
    "role, the alias shift and alarm reads under the service role (weights recorded: every version runs the same "
    "code locally)",
}
REPORTED: dict[str, str] = {
    "AWS::CloudWatch::Alarm": "not evaluated (the `local deploy` rehearsal evaluates the rollback alarms)",
    "AWS::CloudWatch::Dashboard": "not emulated",
    "AWS::ApplicationAutoScaling::ScalableTarget": "not emulated: one instance per variant (one container per "
    "inference component) locally",
    "AWS::ApplicationAutoScaling::ScalingPolicy": "not emulated: one instance per variant (one container per "
    "inference component) locally",
    "AWS::KMS::Key": "not emulated: data at rest is not encrypted locally",
    "AWS::KMS::Alias": "not emulated: data at rest is not encrypted locally",
    "AWS::CDK::Metadata": "CDK's own metadata",
    "AWS::Events::Rule": (
        "not emulated as a rule: the emulated transform job (`servestack local run-batch`, or its schedule) sends "
        "the SageMaker transform job state change event to the rule's target function when it ends"
    ),
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
    for resource in template.resources.values():
        how = EMULATED.get(resource.type)
        emulated = how is not None
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
