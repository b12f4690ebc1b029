"""Batch deployments: the schedule, its target's retry policy and DLQ, the failure alarm, Fargate runner."""

from __future__ import annotations

import json

from aws_cdk.assertions import Capture, Match

from tests.infra.conftest import Synth


def test_schedule_expression_and_timezone_come_from_the_spec(synth: Synth) -> None:
    payload = Capture()

    synth.template("cancer-nightly").has_resource_properties(
        "AWS::Scheduler::Schedule",
        {
            "ScheduleExpression": "cron(0 2 * * ? *)",
            "ScheduleExpressionTimezone": "Europe/Paris",
            "State": "ENABLED",
            "Target": Match.object_like(
                {
                    "RetryPolicy": {"MaximumRetryAttempts": 2, "MaximumEventAgeInSeconds": 3600},
                    "DeadLetterConfig": {"Arn": {"Fn::GetAtt": [Match.any_value(), "Arn"]}},
                    "Input": payload,
                }
            ),
        },
    )
    body = json.loads(json.dumps(payload.as_object()))  # resolved Fn::Join of the JSON payload
    text = "".join(p if isinstance(p, str) else "<ref>" for p in body["Fn::Join"][1])
    assert '"input_prefix":"batch/cancer-nightly/input/"' in text
    assert '"output_prefix":"batch/cancer-nightly/output/"' in text


def test_batch_function_reads_its_input_prefix_and_owns_its_output_prefix_only(synth: Synth) -> None:
    t = synth.template("cancer-nightly")

    t.has_resource_properties("AWS::Lambda::Function", {"Handler": "handlers.batch.handler", "Timeout": 900})
    t.has_resource_properties(
        "AWS::IAM::Policy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        {
                            "Action": "s3:GetObject",
                            "Effect": "Allow",
                            "Resource": {"Fn::Join": ["", [Match.any_value(), "/batch/cancer-nightly/input/*"]]},
                        },
                        {
                            "Action": "s3:ListBucket",
                            "Condition": {"StringLike": {"s3:prefix": ["batch/cancer-nightly/input/*"]}},
                            "Effect": "Allow",
                            "Resource": Match.any_value(),
                        },
                        {
                            # resume reads parts back, and stale parts and error parts are deleted
                            "Action": ["s3:DeleteObject", "s3:GetObject", "s3:PutObject"],
                            "Effect": "Allow",
                            "Resource": {"Fn::Join": ["", [Match.any_value(), "/batch/cancer-nightly/output/*"]]},
                        },
                        {
                            "Action": "s3:ListBucket",
                            "Condition": {"StringLike": {"s3:prefix": ["batch/cancer-nightly/output/*"]}},
                            "Effect": "Allow",
                            "Resource": Match.any_value(),
                        },
                    ]
                )
            }
        },
    )


def test_failure_alarm_counts_failed_runs_and_dead_letters(synth: Synth) -> None:
    synth.template("cancer-nightly").has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": "servestack-cancer-nightly-failures",
            "Threshold": 0,
            "Metrics": Match.array_with([Match.object_like({"Expression": "FILL(failed, 0) + FILL(dlq, 0)"})]),
        },
    )


def test_fargate_runner_runs_the_same_code_in_the_cpu_container(synth: Synth) -> None:
    t = synth.template("digits-weekly")

    t.has_resource_properties(
        "AWS::Scheduler::Schedule",
        {
            "ScheduleExpression": "rate(7 days)",
            "Target": Match.object_like(
                {
                    "EcsParameters": Match.object_like(
                        {"LaunchType": "FARGATE", "TaskDefinitionArn": {"Ref": Match.any_value()}}
                    )
                }
            ),
        },
    )
    t.has_resource_properties(
        "AWS::ECS::TaskDefinition",
        {
            "Cpu": "2048",
            "RuntimePlatform": {"CpuArchitecture": "ARM64", "OperatingSystemFamily": "LINUX"},
            "ContainerDefinitions": [
                Match.object_like(
                    {"EntryPoint": ["python", "-m", "handlers.batch"], "LogConfiguration": Match.any_value()}
                )
            ],
        },
    )
    t.resource_count_is("AWS::EC2::NatGateway", 0)
