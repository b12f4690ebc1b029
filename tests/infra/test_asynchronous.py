"""Async deployments: encrypted queue + DLQ, worker event source, job table with TTL, scoped IAM, alarms."""

from __future__ import annotations

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


def test_submit_and_worker_touch_only_their_own_prefixes_queue_and_table(synth: Synth) -> None:
    policies = synth.resources("cancer-async", "AWS::IAM::Policy")
    statements = [s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]]

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


def test_queues_and_table_carry_the_names_local_up_creates(synth: Synth) -> None:
    from servestack.local.resources import names

    expected = names("cancer-async")
    t = synth.template("cancer-async")
    t.has_resource_properties("AWS::SQS::Queue", {"QueueName": expected.queue})
    t.has_resource_properties("AWS::SQS::Queue", {"QueueName": expected.dlq})
    t.has_resource_properties("AWS::DynamoDB::Table", {"TableName": expected.table})


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
