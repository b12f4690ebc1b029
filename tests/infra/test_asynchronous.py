"""Async deployments: encrypted queue + DLQ, worker event source, job table with TTL, scoped IAM, alarms."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Capture, Match

from tests.infra.conftest import Synth


def test_jobs_queue_is_encrypted_tls_only_and_redrives_to_the_dlq(synth: Synth) -> None:
    t = synth.template("cancer-async")
    dlq = Capture()

    t.has_resource_properties(
        "AWS::SQS::Queue",
        {
            "SqsManagedSseEnabled": True,
            "RedrivePolicy": {"deadLetterTargetArn": {"Fn::GetAtt": [dlq, "Arn"]}, "maxReceiveCount": 3},
            "VisibilityTimeout": 6 * 120 + 2,
        },
    )
    queues = synth.resources("cancer-async", "AWS::SQS::Queue")
    assert queues[dlq.as_string()]["Properties"]["SqsManagedSseEnabled"] is True
    t.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})]
                )
            }
        },
    )


def test_worker_consumes_in_batches_and_reports_partial_failures(synth: Synth) -> None:
    synth.template("cancer-async").has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "BatchSize": 20,
            "MaximumBatchingWindowInSeconds": 2,
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
            "ScalingConfig": {"MaximumConcurrency": 10},
        },
    )
    synth.template("cancer-async").has_resource_properties(
        "AWS::Lambda::Function", {"Handler": "handlers.asynchronous.worker_handler", "Timeout": 120}
    )


def test_job_table_has_ttl_encryption_and_point_in_time_recovery(synth: Synth) -> None:
    synth.template("cancer-async").has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": [{"AttributeName": "job_id", "KeyType": "HASH"}],
            "BillingMode": "PAY_PER_REQUEST",
            "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
            "SSESpecification": {"SSEEnabled": True},
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
        },
    )


@pytest.mark.parametrize(("deployment", "days"), [("cancer-async", 7), ("cancer-cpu-async", 3)])
def test_a_jobs_objects_expire_with_its_record(synth: Synth, deployment: str, days: int) -> None:
    # GIVEN an async deployment whose job records expire after result_ttl_days (DynamoDB TTL): the default 7 on
    # the Lambda backend, 3 on the SageMaker one
    (bucket,) = [
        b
        for b in synth.resources(deployment, "AWS::S3::Bucket").values()
        if "VersioningConfiguration" in b["Properties"]
    ]
    rules = bucket["Properties"]["LifecycleConfiguration"]["Rules"]

    # THEN its payloads, uploads, results and failures (all under its prefix, named after its resources)
    # expire after as many days, and the versions that leaves behind a day later
    prefix = f"async/servestack-{deployment}/"
    expiring = [r for r in rules if r.get("Prefix") == prefix]
    assert expiring == [
        {
            "Id": f"expire-async-servestack-{deployment}",
            "Prefix": prefix,
            "ExpirationInDays": days,
            "NoncurrentVersionExpiration": {"NoncurrentDays": 1},
            "Status": "Enabled",
        }
    ]
    # AND the bucket's own rule still ends everyone's noncurrent versions and stale multipart uploads
    assert {
        "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
        "NoncurrentVersionExpiration": {"NoncurrentDays": 30},
        "Status": "Enabled",
    } in rules


def test_submit_and_worker_touch_only_their_own_prefixes_queue_and_table(synth: Synth) -> None:
    policies = synth.resources("cancer-async", "AWS::IAM::Policy")
    notifications = {k: p for k, p in policies.items() if "NotificationsHandler" in k}
    # CDK's bucket-notifications custom resource may only put this bucket's notification configuration
    (handler,) = notifications.values()
    (statement,) = handler["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Action"] == "s3:PutBucketNotification"
    assert statement["Resource"]["Fn::GetAtt"][0].startswith("ArtifactsBucket")
    statements = [
        s for k, p in policies.items() if k not in notifications for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]

    for s in statements:
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        assert not any(a.endswith("*") for a in actions), s
        assert s["Resource"] != "*", s
        resources = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
        for r in resources:
            if any(a.startswith("s3:") for a in actions):
                suffix = r["Fn::Join"][1][-1]
                assert suffix.startswith("/async/servestack-cancer-async/"), suffix
    submit_s3 = [s for s in statements if s["Action"] == "s3:PutObject"]
    assert {s["Resource"]["Fn::Join"][1][-1] for s in submit_s3} == {
        "/async/servestack-cancer-async/requests/*",
        "/async/servestack-cancer-async/results/*",
    }


def test_alarms_on_dead_letters_and_oldest_message_age(synth: Synth) -> None:
    t = synth.template("cancer-async")

    t.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": "servestack-cancer-async-dead-letters",
            "MetricName": "ApproximateNumberOfMessagesVisible",
            "Threshold": 0,
            "ComparisonOperator": "GreaterThanThreshold",
        },
    )
    t.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": "servestack-cancer-async-oldest-message-age",
            "MetricName": "ApproximateAgeOfOldestMessage",
            "Threshold": 900,
        },
    )


def test_submit_api_requires_iam_auth(synth: Synth) -> None:
    t = synth.template("cancer-async")

    t.has_resource_properties("AWS::ApiGatewayV2::Route", {"AuthorizationType": "AWS_IAM"})
    t.has_resource_properties("AWS::Lambda::Function", {"Handler": "handlers.asynchronous.submit_handler"})


def test_gpu_backend_is_a_sagemaker_async_endpoint_scaled_to_zero_on_backlog(synth: Synth) -> None:
    t = synth.template("cancer-gpu-async")

    t.has_resource_properties(
        "AWS::SageMaker::EndpointConfig",
        {
            "AsyncInferenceConfig": {
                "OutputConfig": Match.object_like(
                    {
                        "S3OutputPath": Match.any_value(),
                        "S3FailurePath": Match.any_value(),
                        "NotificationConfig": Match.object_like(
                            {
                                "SuccessTopic": {"Ref": Match.any_value()},
                                "ErrorTopic": {"Ref": Match.any_value()},
                            }
                        ),
                    }
                ),
                "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 4},
            },
            "ProductionVariants": [Match.object_like({"InstanceType": "ml.g5.xlarge"})],
        },
    )
    t.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalableTarget",
        {
            "ResourceId": "endpoint/servestack-cancer-gpu-async/variant/AllTraffic",
            "MinCapacity": 0,
            "MaxCapacity": 3,
        },
    )
    t.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {
            "TargetTrackingScalingPolicyConfiguration": Match.object_like(
                {
                    "CustomizedMetricSpecification": Match.object_like(
                        {"MetricName": "ApproximateBacklogSizePerInstance"}
                    ),
                    "TargetValue": 5,
                }
            )
        },
    )
    t.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": Match.any_value()})
    t.has_resource_properties("AWS::SNS::Subscription", {"Protocol": "sqs", "RawMessageDelivery": True})
    t.has_resource_properties(
        "AWS::Lambda::Function",
        {"Environment": {"Variables": Match.object_like({"SERVESTACK_ASYNC_BACKEND": "sagemaker"})}},
    )


def _ref(value: dict) -> str:
    return value.get("Ref") or value["Fn::GetAtt"][0]


def test_sagemaker_notifications_reach_their_own_queue_and_function(synth: Synth) -> None:
    d = "cancer-gpu-async"
    t = synth.template(d)
    resources = synth.templates[f"servestack-{d}"]["Resources"]
    queues = synth.resources(d, "AWS::SQS::Queue")
    topics = synth.resources(d, "AWS::SNS::Topic")
    (config,) = synth.resources(d, "AWS::SageMaker::EndpointConfig").values()
    notification = config["Properties"]["AsyncInferenceConfig"]["OutputConfig"]["NotificationConfig"]

    # GIVEN SageMaker's success and error topics (the endpoint config's NotificationConfig)
    assert {_ref(notification["SuccessTopic"]), _ref(notification["ErrorTopic"])} == set(topics)
    # THEN each topic delivers raw messages to the notifications queue, which has a DLQ
    subscriptions = synth.resources(d, "AWS::SNS::Subscription").values()
    by_topic = {_ref(s["Properties"]["TopicArn"]): s["Properties"] for s in subscriptions}
    assert set(by_topic) == set(topics)
    queue_ids = {_ref(p["Endpoint"]) for p in by_topic.values()}
    assert len(queue_ids) == 1
    (queue_id,) = queue_ids
    assert all(p["Protocol"] == "sqs" and p["RawMessageDelivery"] is True for p in by_topic.values())
    queue = queues[queue_id]["Properties"]
    assert queue["QueueName"] == "servestack-cancer-gpu-async-notifications"
    dlq_id = _ref(queue["RedrivePolicy"]["deadLetterTargetArn"])
    assert queues[dlq_id]["Properties"]["QueueName"] == "servestack-cancer-gpu-async-notifications-dlq"
    # AND the queue may be written by exactly those topics (SNS's SourceArn condition)
    t.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {
            "Queues": [{"Ref": queue_id}],
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Action": "sqs:SendMessage",
                                "Principal": {"Service": "sns.amazonaws.com"},
                                "Condition": {"ArnEquals": {"aws:SourceArn": {"Ref": Match.any_value()}}},
                            }
                        )
                    ]
                )
            },
        },
    )
    # AND the queue feeds the notification function, which reports partial batch failures
    (mapping,) = synth.resources(d, "AWS::Lambda::EventSourceMapping").values()
    assert _ref(mapping["Properties"]["EventSourceArn"]) == queue_id
    assert mapping["Properties"]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    function = resources[_ref(mapping["Properties"]["FunctionName"])]["Properties"]
    assert function["Handler"] == "handlers.asynchronous.notification_handler"
    # AND there is no Lambda worker and no jobs queue for this backend
    handlers = {f["Properties"]["Handler"] for f in synth.resources(d, "AWS::Lambda::Function").values()}
    assert "handlers.asynchronous.worker_handler" not in handlers
    assert {q["Properties"]["QueueName"] for q in queues.values()} == {
        "servestack-cancer-gpu-async-notifications",
        "servestack-cancer-gpu-async-notifications-dlq",
    }


def test_sagemaker_backend_grants_are_least_privilege(synth: Synth) -> None:
    d = "cancer-gpu-async"
    functions = {
        f["Properties"]["Handler"].rsplit(".", 1)[-1]: _ref(f["Properties"]["Role"])
        for f in synth.resources(d, "AWS::Lambda::Function").values()
        if f["Properties"]["Handler"].startswith("handlers.asynchronous.")
    }
    statements: dict[str, list[dict]] = {name: [] for name in functions}
    for policy in synth.resources(d, "AWS::IAM::Policy").values():
        roles = {_ref(r) for r in policy["Properties"]["Roles"]}
        for name, role in functions.items():
            if role in roles:
                statements[name] += policy["Properties"]["PolicyDocument"]["Statement"]

    def actions(name: str) -> set[str]:
        found: set[str] = set()
        for s in statements[name]:
            found |= set(s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
        return found

    # THEN submit invokes the endpoint asynchronously and never sends to a queue
    submit = actions("submit_handler")
    assert "sagemaker:InvokeEndpointAsync" in submit
    assert not any(a.startswith("sqs:") for a in submit)
    (invoke,) = [s for s in statements["submit_handler"] if s["Action"] == "sagemaker:InvokeEndpointAsync"]
    assert invoke["Resource"]["Fn::Join"][1][-1] == ":endpoint/servestack-cancer-gpu-async"
    # AND the notification function updates job records, reads stored failures and consumes its queue, only
    notifier = actions("notification_handler")
    assert (
        notifier
        - {
            "dynamodb:UpdateItem",
            "dynamodb:GetItem",
            "s3:GetObject",
            "sqs:ReceiveMessage",
            "sqs:ChangeMessageVisibility",
            "sqs:GetQueueUrl",
            "sqs:DeleteMessage",
            "sqs:GetQueueAttributes",
            "logs:CreateLogStream",
            "logs:PutLogEvents",
        }
        == set()
    )
    reads = [s for s in statements["notification_handler"] if s["Action"] == "s3:GetObject"]
    assert [r["Resource"]["Fn::Join"][1][-1] for r in reads] == ["/async/servestack-cancer-gpu-async/failures/*"]
    assert all(s["Resource"] != "*" for name in statements for s in statements[name])


def test_sagemaker_backend_wakes_from_zero_by_awss_documented_recipe(synth: Synth) -> None:
    d = "cancer-gpu-async"
    t = synth.template(d)
    policy = Capture()

    # THEN a step policy adds one instance whenever its alarm fires (the breach has no upper bound)
    t.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {
            "PolicyType": "StepScaling",
            "StepScalingPolicyConfiguration": {
                "AdjustmentType": "ChangeInCapacity",
                "MetricAggregationType": "Average",
                "Cooldown": 300,
                "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}],
            },
        },
    )
    # AND its alarm is HasBacklogWithoutCapacity >= 1, Average over 60 s, 2 of 2 periods, on the endpoint
    t.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": "servestack-cancer-gpu-async-backlog-without-capacity",
            "Namespace": "AWS/SageMaker",
            "MetricName": "HasBacklogWithoutCapacity",
            "Dimensions": [{"Name": "EndpointName", "Value": "servestack-cancer-gpu-async"}],
            "Statistic": "Average",
            "Period": 60,
            "Threshold": 1,
            "ComparisonOperator": "GreaterThanOrEqualToThreshold",
            "EvaluationPeriods": 2,
            "DatapointsToAlarm": 2,
            "AlarmActions": [policy],
        },
    )
    policies = synth.resources(d, "AWS::ApplicationAutoScaling::ScalingPolicy")
    assert policies[policy.as_object()["Ref"]]["Properties"]["PolicyType"] == "StepScaling"
    # AND target tracking on the backlog per instance scales it between 0 and max_instances
    t.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalableTarget",
        {"ResourceId": "endpoint/servestack-cancer-gpu-async/variant/AllTraffic", "MinCapacity": 0, "MaxCapacity": 3},
    )
    t.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": "handlers.asynchronous.submit_handler",
            "Environment": {
                "Variables": Match.object_like(
                    {
                        "SERVESTACK_ASYNC_BACKEND": "sagemaker",
                        "SERVESTACK_ENDPOINT_NAME": "servestack-cancer-gpu-async",
                        "SERVESTACK_FAILURE_PREFIX": "async/servestack-cancer-gpu-async/failures/",
                    }
                )
            },
        },
    )


def test_the_worker_may_send_to_its_dlq_and_is_told_where_it_is(synth: Synth) -> None:
    # GIVEN the async stack's queues, functions and policies
    queues = synth.resources("cancer-async", "AWS::SQS::Queue")
    dlq = next(logical for logical, q in queues.items() if q["Properties"]["QueueName"].endswith("-dlq"))
    functions = synth.resources("cancer-async", "AWS::Lambda::Function")
    worker = next(f for f in functions.values() if f["Properties"]["Handler"] == "handlers.asynchronous.worker_handler")
    submit = next(f for f in functions.values() if f["Properties"]["Handler"] == "handlers.asynchronous.submit_handler")
    policies = synth.resources("cancer-async", "AWS::IAM::Policy").values()
    # WHEN the statements that name the DLQ are gathered, by the role they are attached to
    to_dlq = [
        (policy["Properties"]["Roles"][0], statement)
        for policy in policies
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if statement["Resource"] == {"Fn::GetAtt": [dlq, "Arn"]}
    ]
    # THEN exactly one statement grants the worker's role sqs:SendMessage on the DLQ, and nothing else does
    assert [(role, statement["Action"]) for role, statement in to_dlq] == [
        ({"Ref": worker["Properties"]["Role"]["Fn::GetAtt"][0]}, "sqs:SendMessage")
    ]
    assert submit["Properties"]["Role"] != worker["Properties"]["Role"]
    # AND the worker (as every function of the deployment) gets the DLQ's URL
    assert worker["Properties"]["Environment"]["Variables"]["SERVESTACK_DEAD_LETTER_QUEUE_URL"] == {"Ref": dlq}
    # AND on the job table the worker may read, put (claims, failures), batch-put (successes) and update
    # (uploaded jobs' claims), and nothing else
    worker_role = {"Ref": worker["Properties"]["Role"]["Fn::GetAtt"][0]}
    table_actions = {
        action
        for policy in policies
        if policy["Properties"]["Roles"] == [worker_role]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        for action in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
        if action.startswith("dynamodb:")
    }
    assert table_actions == {"dynamodb:BatchWriteItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:GetItem"}
