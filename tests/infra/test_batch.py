"""Batch deployments: the schedule, its target's retry policy and DLQ, the failure alarm, Fargate runner."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Capture, Match

from servestack.cdk.batch import FARGATE_COMMAND
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


def alarm_metrics(synth: Synth, deployment: str) -> dict[str, dict[str, object]]:
    """The failure alarm's metrics by their id in its math expression (the expression under "expr")."""
    (alarm,) = synth.resources(deployment, "AWS::CloudWatch::Alarm").values()
    assert alarm["Properties"]["AlarmName"] == f"servestack-{deployment}-failures"
    metrics = {}
    for query in alarm["Properties"]["Metrics"]:
        metrics["expr" if "Expression" in query else query["Id"]] = query.get("MetricStat", {}).get("Metric", query)
    return metrics


def test_failure_alarm_counts_failed_runs_target_errors_and_dead_letters(synth: Synth) -> None:
    synth.template("cancer-nightly").has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": "servestack-cancer-nightly-failures",
            "Threshold": 0,
            "Metrics": Match.array_with(
                [Match.object_like({"Expression": "FILL(failed, 0) + FILL(target_errors, 0) + FILL(dlq, 0)"})]
            ),
        },
    )


@pytest.mark.parametrize("deployment", ["cancer-nightly", "digits-weekly", "cancer-transform"])
def test_each_deployment_schedules_in_a_group_of_its_own_and_its_alarm_counts_only_that_group(
    synth: Synth, deployment: str
) -> None:
    # GIVEN a batch deployment of each engine
    resources = synth.templates[f"servestack-{deployment}"]["Resources"]
    # THEN its schedule is in a schedule group named after the deployment, which the stack owns
    ((group_id, group),) = synth.resources(deployment, "AWS::Scheduler::ScheduleGroup").items()
    assert group["Properties"]["Name"] == f"servestack-{deployment}"
    assert group["DeletionPolicy"] == "Delete"
    ((_, schedule),) = synth.resources(deployment, "AWS::Scheduler::Schedule").items()
    assert schedule["Properties"]["GroupName"] == f"servestack-{deployment}"
    assert group_id in schedule["DependsOn"]  # created after its group
    # AND its alarm counts Scheduler's target errors of that group alone, never the account's default group
    target_errors = alarm_metrics(synth, deployment)["target_errors"]
    assert target_errors["Namespace"] == "AWS/Scheduler"
    assert target_errors["MetricName"] == "TargetErrorCount"
    assert target_errors["Dimensions"] == [{"Name": "ScheduleGroup", "Value": f"servestack-{deployment}"}]
    assert '"default"' not in json.dumps({k: v for k, v in resources.items() if v["Type"] == "AWS::CloudWatch::Alarm"})


def test_a_fargate_task_that_fails_feeds_the_failure_alarm_through_a_rule_on_its_cluster(synth: Synth) -> None:
    # GIVEN the Fargate batch deployment
    t = synth.template("digits-weekly")
    ((cluster_id, _),) = synth.resources("digits-weekly", "AWS::ECS::Cluster").items()
    # THEN a rule matches its cluster's tasks that stopped with a non-zero exit code, or never started
    ((rule_id, rule),) = synth.resources("digits-weekly", "AWS::Events::Rule").items()
    assert rule["Properties"]["EventPattern"] == {
        "source": ["aws.ecs"],
        "detail-type": ["ECS Task State Change"],
        "detail": {
            "clusterArn": [{"Fn::GetAtt": [cluster_id, "Arn"]}],
            "lastStatus": ["STOPPED"],
            "$or": [{"containers": {"exitCode": [{"anything-but": 0}]}}, {"stopCode": ["TaskFailedToStart"]}],
        },
    }
    assert rule["Properties"]["State"] == "ENABLED"
    # AND the alarm's failed runs are that rule's matches
    failed = alarm_metrics(synth, "digits-weekly")["failed"]
    assert failed == {
        "Namespace": "AWS/Events",
        "MetricName": "TriggeredRules",
        "Dimensions": [{"Name": "RuleName", "Value": {"Ref": rule_id}}],
    }
    t.resource_count_is("AWS::Events::Rule", 1)


def test_a_failed_transform_job_feeds_the_failure_alarm_through_its_manifest_step(synth: Synth) -> None:
    # GIVEN the transform deployment, whose rule sends a job's end to the manifest step (which raises for Failed)
    (rule,) = synth.resources("cancer-transform", "AWS::Events::Rule").values()
    assert "Failed" in rule["Properties"]["EventPattern"]["detail"]["TransformJobStatus"]
    target_function = rule["Properties"]["Targets"][0]["Arn"]["Fn::GetAtt"][0]
    # THEN the alarm's failed runs are that function's errors
    failed = alarm_metrics(synth, "cancer-transform")["failed"]
    assert failed["MetricName"] == "Errors"
    assert failed["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": target_function}}]


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
            "RuntimePlatform": {"CpuArchitecture": "X86_64", "OperatingSystemFamily": "LINUX"},
            "ContainerDefinitions": [
                Match.object_like(
                    {"EntryPoint": ["python", "-m", "handlers.batch"], "LogConfiguration": Match.any_value()}
                )
            ],
        },
    )
    t.resource_count_is("AWS::EC2::NatGateway", 0)
    # AND the batch bench times that same entry (bench/batch_job.py)
    from bench.batch_job import TASK_ENTRY  # here only: the bench's own imports (moto) are not the infra tests'

    assert ["python", *TASK_ENTRY] == FARGATE_COMMAND


def test_transform_runner_schedules_a_batch_transform_job_of_the_realtime_image_and_model(synth: Synth) -> None:
    t = synth.template("cancer-transform")
    job = Capture()
    # GIVEN engine: transform / THEN the schedule's target is Scheduler's universal CreateTransformJob target
    t.has_resource_properties(
        "AWS::Scheduler::Schedule",
        {
            "ScheduleExpression": "cron(0 4 * * ? *)",
            "Target": Match.object_like(
                {
                    "Arn": {
                        "Fn::Join": [
                            "",
                            ["arn:", {"Ref": "AWS::Partition"}, ":scheduler:::aws-sdk:sagemaker:createTransformJob"],
                        ]
                    },
                    "RoleArn": {"Fn::GetAtt": [Match.string_like_regexp("SchedulerRole"), "Arn"]},
                    "RetryPolicy": {"MaximumRetryAttempts": 2, "MaximumEventAgeInSeconds": 3600},
                    "DeadLetterConfig": {"Arn": {"Fn::GetAtt": [Match.any_value(), "Arn"]}},
                    "Input": job,
                }
            ),
        },
    )
    body = job.as_object() if isinstance(job.as_object(), dict) else {}
    text = "".join(p if isinstance(p, str) else "<ref>" for p in body["Fn::Join"][1])
    # AND each run's job has a unique name, splits lines into mini-batches, on the spec's instances
    assert '"TransformJobName":"servestack-cancer-transform-<aws.scheduler.execution-id>"' in text
    assert '"BatchStrategy":"MultiRecord"' in text
    assert '"MaxPayloadInMB":4' in text
    assert '"SplitType":"Line"' in text
    assert '"ContentType":"text/csv"' in text
    assert '"AssembleWith":"Line"' in text
    # (a CPU type, so no GPU host AMI: none of Batch Transform's carries the driver >= 580 CUDA 13 needs)
    assert '"TransformResources":{"InstanceType":"ml.c5.xlarge","InstanceCount":3}' in text
    assert "/batch/cancer-transform/input/" in text
    assert "/batch/cancer-transform/output" in text
    # AND the model is the realtime (CPU) image with the model data, reporting the job's execution parameters
    t.has_resource_properties(
        "AWS::SageMaker::Model",
        {
            "EnableNetworkIsolation": True,
            "PrimaryContainer": Match.object_like(
                {
                    "ModelDataUrl": Match.any_value(),
                    "Environment": Match.object_like(
                        {"SERVESTACK_TRANSFORM_MAX_PAYLOAD_MB": "4", "SERVESTACK_DEFAULT_MODEL": "breast-cancer"}
                    ),
                }
            ),
        },
    )


def test_transform_scheduler_role_may_only_create_this_deployments_jobs_and_pass_the_job_role(synth: Synth) -> None:
    synth.template("cancer-transform").has_resource_properties(
        "AWS::IAM::Policy",
        {
            "PolicyDocument": {
                "Statement": [
                    {
                        "Action": "sagemaker:CreateTransformJob",
                        "Effect": "Allow",
                        "Resource": {
                            "Fn::Join": [
                                "",
                                Match.array_with([":transform-job/servestack-cancer-transform-*"]),
                            ]
                        },
                    },
                    {
                        "Action": "iam:PassRole",
                        "Condition": {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
                        "Effect": "Allow",
                        "Resource": {"Fn::GetAtt": [Match.string_like_regexp("TransformRole"), "Arn"]},
                    },
                    {  # a run Scheduler cannot start goes to the dead-letter queue
                        "Action": "sqs:SendMessage",
                        "Effect": "Allow",
                        "Resource": {"Fn::GetAtt": [Match.string_like_regexp("DeadLetters"), "Arn"]},
                    },
                ]
            },
            "Roles": [{"Ref": Match.string_like_regexp("SchedulerRole")}],
        },
    )


def test_a_finished_transform_job_runs_the_manifest_step(synth: Synth) -> None:
    t = synth.template("cancer-transform")
    # THEN SageMaker's job state change event of this deployment's jobs runs handlers.batch.transform_done
    t.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventPattern": {
                "source": ["aws.sagemaker"],
                "detail-type": ["SageMaker Transform Job State Change"],
                "detail": {
                    "TransformJobName": [{"prefix": "servestack-cancer-transform-"}],
                    "TransformJobStatus": ["Completed", "Failed", "Stopped"],
                },
            },
            "Targets": [Match.object_like({"DeadLetterConfig": Match.any_value(), "RetryPolicy": Match.any_value()})],
        },
    )
    t.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": "handlers.batch.transform_done",
            "Environment": {
                "Variables": Match.object_like(
                    {
                        "SERVESTACK_BATCH_INPUT_PREFIX": "batch/cancer-transform/input/",
                        "SERVESTACK_BATCH_OUTPUT_PREFIX": "batch/cancer-transform/output/",
                        "SERVESTACK_BATCH_INPUT_FORMAT": "csv",
                    }
                )
            },
        },
    )
