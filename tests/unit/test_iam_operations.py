"""Which action on which resource each call needs: requests exactly as botocore serializes them (captured
before they are sent), described by servestack/local/iam/operations.py."""

from __future__ import annotations

import io
import json
import urllib.parse
from typing import Any

import boto3
import pytest
from botocore.config import Config

from servestack.local.iam.canonical import Endpoint, Malformed, canonical_request
from servestack.local.iam.operations import Check, ExecuteApi, Operation, Where, describe
from servestack.local.iam.sigv4 import parse_signature
from servestack.local.iam.wire import HttpRequest

ACCOUNT = "123456789012"
WHERE = Where("us-east-1", ACCOUNT)
QUEUE_URL = f"http://127.0.0.1:5000/{ACCOUNT}/work"
QUEUE = f"arn:aws:sqs:us-east-1:{ACCOUNT}:work"
TOPIC = f"arn:aws:sns:us-east-1:{ACCOUNT}:done"
TABLE = f"arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/jobs"
OTHER_TABLE = f"arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/results"
FUNCTION = f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:digits-api"


class Captured(Exception):
    pass


def sent(service: str, operation: str, **params: Any) -> HttpRequest:
    """The HTTP request a boto3 client sends for `operation` (stopped before it leaves the process)."""
    client = boto3.client(
        service,
        endpoint_url="http://127.0.0.1:5000",
        region_name="us-east-1",
        aws_access_key_id="AKIAEXAMPLEEXAMPLE00",
        aws_secret_access_key="secret",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )

    def capture(request: Any, **_: Any) -> None:
        raise Captured(request)

    client.meta.events.register("before-send", capture)
    with pytest.raises(Captured) as captured:
        getattr(client, operation)(**params)
    request = captured.value.args[0]
    split = urllib.parse.urlsplit(request.url)
    headers = {
        name.lower(): value.decode() if isinstance(value, bytes) else value for name, value in request.headers.items()
    }
    headers.setdefault("host", split.netloc)
    body = request.body
    if hasattr(body, "read"):
        body = body.read()
    if isinstance(body, str):  # query-protocol bodies are prepared as text
        body = body.encode()
    return HttpRequest(request.method, split.path, split.query, headers, body or b"")


def described(service: str, operation: str, **params: Any) -> Operation:
    request = sent(service, operation, **params)
    signature = parse_signature(request)
    assert signature is not None
    return describe(request, signature.service, WHERE)


def checks(operation: Operation) -> list[tuple[str, str]]:
    return [(check.action, check.resource) for check in operation.checks]


CASES: list[tuple[str, str, dict[str, Any], list[tuple[str, str]]]] = [
    # ---- S3 objects
    ("s3", "get_object", {"Bucket": "jobs", "Key": "in/a b+c"}, [("s3:GetObject", "arn:aws:s3:::jobs/in/a b+c")]),
    (
        "s3",
        "get_object",
        {"Bucket": "jobs", "Key": "k", "VersionId": "v1"},
        [("s3:GetObjectVersion", "arn:aws:s3:::jobs/k")],
    ),
    ("s3", "head_object", {"Bucket": "jobs", "Key": "uploads/x"}, [("s3:GetObject", "arn:aws:s3:::jobs/uploads/x")]),
    (
        "s3",
        "put_object",
        {"Bucket": "jobs", "Key": "out/1", "Body": b"x"},
        [("s3:PutObject", "arn:aws:s3:::jobs/out/1")],
    ),
    (
        "s3",
        "put_object",
        {"Bucket": "jobs", "Key": "out/1", "Body": b"x", "Tagging": "a=b", "ACL": "private"},
        [
            ("s3:PutObject", "arn:aws:s3:::jobs/out/1"),
            ("s3:PutObjectTagging", "arn:aws:s3:::jobs/out/1"),
            ("s3:PutObjectAcl", "arn:aws:s3:::jobs/out/1"),
        ],
    ),
    (
        "s3",
        "copy_object",
        {"Bucket": "jobs", "Key": "out/copy", "CopySource": {"Bucket": "src", "Key": "in/a b", "VersionId": "v2"}},
        [("s3:PutObject", "arn:aws:s3:::jobs/out/copy"), ("s3:GetObjectVersion", "arn:aws:s3:::src/in/a b")],
    ),
    (
        "s3",
        "delete_object",
        {"Bucket": "jobs", "Key": "errors/part-1"},
        [("s3:DeleteObject", "arn:aws:s3:::jobs/errors/part-1")],
    ),
    (
        "s3",
        "delete_object",
        {"Bucket": "jobs", "Key": "k", "VersionId": "v"},
        [("s3:DeleteObjectVersion", "arn:aws:s3:::jobs/k")],
    ),
    ("s3", "create_multipart_upload", {"Bucket": "jobs", "Key": "big"}, [("s3:PutObject", "arn:aws:s3:::jobs/big")]),
    (
        "s3",
        "upload_part",
        {"Bucket": "jobs", "Key": "big", "UploadId": "u", "PartNumber": 1, "Body": b"x"},
        [("s3:PutObject", "arn:aws:s3:::jobs/big")],
    ),
    (
        "s3",
        "complete_multipart_upload",
        {
            "Bucket": "jobs",
            "Key": "big",
            "UploadId": "u",
            "MultipartUpload": {"Parts": [{"ETag": "e", "PartNumber": 1}]},
        },
        [("s3:PutObject", "arn:aws:s3:::jobs/big")],
    ),
    (
        "s3",
        "abort_multipart_upload",
        {"Bucket": "jobs", "Key": "big", "UploadId": "u"},
        [("s3:AbortMultipartUpload", "arn:aws:s3:::jobs/big")],
    ),
    (
        "s3",
        "list_parts",
        {"Bucket": "jobs", "Key": "big", "UploadId": "u"},
        [("s3:ListMultipartUploadParts", "arn:aws:s3:::jobs/big")],
    ),
    ("s3", "get_object_tagging", {"Bucket": "jobs", "Key": "k"}, [("s3:GetObjectTagging", "arn:aws:s3:::jobs/k")]),
    (
        "s3",
        "put_object_tagging",
        {"Bucket": "jobs", "Key": "k", "Tagging": {"TagSet": []}},
        [("s3:PutObjectTagging", "arn:aws:s3:::jobs/k")],
    ),
    # ---- S3 buckets
    ("s3", "list_objects_v2", {"Bucket": "jobs", "Prefix": "in/"}, [("s3:ListBucket", "arn:aws:s3:::jobs")]),
    ("s3", "list_objects", {"Bucket": "jobs"}, [("s3:ListBucket", "arn:aws:s3:::jobs")]),
    ("s3", "head_bucket", {"Bucket": "jobs"}, [("s3:ListBucket", "arn:aws:s3:::jobs")]),
    ("s3", "list_object_versions", {"Bucket": "jobs"}, [("s3:ListBucketVersions", "arn:aws:s3:::jobs")]),
    ("s3", "list_multipart_uploads", {"Bucket": "jobs"}, [("s3:ListBucketMultipartUploads", "arn:aws:s3:::jobs")]),
    ("s3", "create_bucket", {"Bucket": "jobs"}, [("s3:CreateBucket", "arn:aws:s3:::jobs")]),
    ("s3", "delete_bucket", {"Bucket": "jobs"}, [("s3:DeleteBucket", "arn:aws:s3:::jobs")]),
    ("s3", "list_buckets", {}, [("s3:ListAllMyBuckets", "*")]),
    (
        "s3",
        "get_bucket_notification_configuration",
        {"Bucket": "jobs"},
        [("s3:GetBucketNotification", "arn:aws:s3:::jobs")],
    ),
    (
        "s3",
        "put_bucket_notification_configuration",
        {"Bucket": "jobs", "NotificationConfiguration": {}},
        [("s3:PutBucketNotification", "arn:aws:s3:::jobs")],
    ),
    (
        "s3",
        "put_bucket_versioning",
        {"Bucket": "jobs", "VersioningConfiguration": {"Status": "Enabled"}},
        [("s3:PutBucketVersioning", "arn:aws:s3:::jobs")],
    ),
    ("s3", "get_bucket_versioning", {"Bucket": "jobs"}, [("s3:GetBucketVersioning", "arn:aws:s3:::jobs")]),
    ("s3", "get_bucket_policy", {"Bucket": "jobs"}, [("s3:GetBucketPolicy", "arn:aws:s3:::jobs")]),
    ("s3", "put_bucket_policy", {"Bucket": "jobs", "Policy": "{}"}, [("s3:PutBucketPolicy", "arn:aws:s3:::jobs")]),
    ("s3", "delete_bucket_policy", {"Bucket": "jobs"}, [("s3:DeleteBucketPolicy", "arn:aws:s3:::jobs")]),
    ("s3", "delete_bucket_tagging", {"Bucket": "jobs"}, [("s3:PutBucketTagging", "arn:aws:s3:::jobs")]),
    ("s3", "get_bucket_location", {"Bucket": "jobs"}, [("s3:GetBucketLocation", "arn:aws:s3:::jobs")]),
    (
        "s3",
        "put_bucket_lifecycle_configuration",
        {"Bucket": "jobs", "LifecycleConfiguration": {"Rules": []}},
        [("s3:PutLifecycleConfiguration", "arn:aws:s3:::jobs")],
    ),
    # ---- SQS (JSON protocol, as botocore sends it)
    ("sqs", "send_message", {"QueueUrl": QUEUE_URL, "MessageBody": "m"}, [("sqs:SendMessage", QUEUE)]),
    (
        "sqs",
        "send_message_batch",
        {"QueueUrl": QUEUE_URL, "Entries": [{"Id": "1", "MessageBody": "m"}]},
        [("sqs:SendMessage", QUEUE)],
    ),
    ("sqs", "receive_message", {"QueueUrl": QUEUE_URL}, [("sqs:ReceiveMessage", QUEUE)]),
    (
        "sqs",
        "delete_message_batch",
        {"QueueUrl": QUEUE_URL, "Entries": [{"Id": "1", "ReceiptHandle": "r"}]},
        [("sqs:DeleteMessage", QUEUE)],
    ),
    (
        "sqs",
        "change_message_visibility_batch",
        {"QueueUrl": QUEUE_URL, "Entries": [{"Id": "1", "ReceiptHandle": "r", "VisibilityTimeout": 1}]},
        [("sqs:ChangeMessageVisibility", QUEUE)],
    ),
    (
        "sqs",
        "get_queue_attributes",
        {"QueueUrl": QUEUE_URL, "AttributeNames": ["QueueArn"]},
        [("sqs:GetQueueAttributes", QUEUE)],
    ),
    ("sqs", "get_queue_url", {"QueueName": "work"}, [("sqs:GetQueueUrl", QUEUE)]),
    ("sqs", "create_queue", {"QueueName": "work"}, [("sqs:CreateQueue", QUEUE)]),
    ("sqs", "list_queues", {}, [("sqs:ListQueues", "*")]),
    (
        "sqs",
        "send_message",
        {"QueueUrl": f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}/work", "MessageBody": "m"},
        [("sqs:SendMessage", f"arn:aws:sqs:eu-west-1:{ACCOUNT}:work")],
    ),
    # ---- DynamoDB
    ("dynamodb", "put_item", {"TableName": "jobs", "Item": {"k": {"S": "1"}}}, [("dynamodb:PutItem", TABLE)]),
    ("dynamodb", "get_item", {"TableName": "jobs", "Key": {"k": {"S": "1"}}}, [("dynamodb:GetItem", TABLE)]),
    ("dynamodb", "update_item", {"TableName": "jobs", "Key": {"k": {"S": "1"}}}, [("dynamodb:UpdateItem", TABLE)]),
    ("dynamodb", "delete_item", {"TableName": "jobs", "Key": {"k": {"S": "1"}}}, [("dynamodb:DeleteItem", TABLE)]),
    (
        "dynamodb",
        "query",
        {"TableName": "jobs", "IndexName": "by-state"},
        [("dynamodb:Query", f"{TABLE}/index/by-state")],
    ),
    ("dynamodb", "scan", {"TableName": "jobs"}, [("dynamodb:Scan", TABLE)]),
    (
        "dynamodb",
        "batch_get_item",
        {"RequestItems": {"jobs": {"Keys": [{"k": {"S": "1"}}]}, "results": {"Keys": [{"k": {"S": "1"}}]}}},
        [("dynamodb:BatchGetItem", TABLE), ("dynamodb:BatchGetItem", OTHER_TABLE)],
    ),
    (
        "dynamodb",
        "batch_write_item",
        {"RequestItems": {"jobs": [{"PutRequest": {"Item": {"k": {"S": "1"}}}}]}},
        [("dynamodb:BatchWriteItem", TABLE)],
    ),
    (
        "dynamodb",
        "transact_write_items",
        {
            "TransactItems": [
                {"Put": {"TableName": "jobs", "Item": {"k": {"S": "1"}}}},
                {"Update": {"TableName": "results", "Key": {"k": {"S": "1"}}, "UpdateExpression": "SET a = :a"}},
                {
                    "ConditionCheck": {
                        "TableName": "jobs",
                        "Key": {"k": {"S": "2"}},
                        "ConditionExpression": "attribute_exists(k)",
                    }
                },
            ]
        },
        [("dynamodb:PutItem", TABLE), ("dynamodb:UpdateItem", OTHER_TABLE), ("dynamodb:ConditionCheckItem", TABLE)],
    ),
    (
        "dynamodb",
        "transact_get_items",
        {"TransactItems": [{"Get": {"TableName": "jobs", "Key": {"k": {"S": "1"}}}}]},
        [("dynamodb:GetItem", TABLE)],
    ),
    ("dynamodb", "list_tables", {}, [("dynamodb:ListTables", "*")]),
    ("dynamodb", "describe_table", {"TableName": "jobs"}, [("dynamodb:DescribeTable", TABLE)]),
    (
        "dynamodb",
        "update_time_to_live",
        {"TableName": "jobs", "TimeToLiveSpecification": {"Enabled": True, "AttributeName": "ttl"}},
        [("dynamodb:UpdateTimeToLive", TABLE)],
    ),
    # ---- SNS
    ("sns", "publish", {"TopicArn": TOPIC, "Message": "m"}, [("sns:Publish", TOPIC)]),
    (
        "sns",
        "publish_batch",
        {"TopicArn": TOPIC, "PublishBatchRequestEntries": [{"Id": "1", "Message": "m"}]},
        [("sns:Publish", TOPIC)],
    ),
    ("sns", "create_topic", {"Name": "done"}, [("sns:CreateTopic", TOPIC)]),
    ("sns", "subscribe", {"TopicArn": TOPIC, "Protocol": "sqs", "Endpoint": QUEUE}, [("sns:Subscribe", TOPIC)]),
    ("sns", "list_topics", {}, [("sns:ListTopics", "*")]),
    # ---- STS
    (
        "sts",
        "assume_role",
        {"RoleArn": f"arn:aws:iam::{ACCOUNT}:role/Worker", "RoleSessionName": "replay"},
        [("sts:AssumeRole", f"arn:aws:iam::{ACCOUNT}:role/Worker")],
    ),
    # ---- CloudWatch and Logs
    (
        "cloudwatch",
        "put_metric_data",
        {"Namespace": "/aws/sagemaker/Endpoints/x", "MetricData": [{"MetricName": "m", "Value": 1.0}]},
        [("cloudwatch:PutMetricData", "*")],
    ),
    (
        "cloudwatch",
        "put_metric_alarm",
        {
            "AlarmName": "errors",
            "EvaluationPeriods": 1,
            "ComparisonOperator": "GreaterThanThreshold",
            "Threshold": 1.0,
            "MetricName": "m",
            "Namespace": "n",
            "Period": 60,
            "Statistic": "Sum",
        },
        [("cloudwatch:PutMetricAlarm", f"arn:aws:cloudwatch:us-east-1:{ACCOUNT}:alarm:errors")],
    ),
    ("cloudwatch", "describe_alarms", {}, [("cloudwatch:DescribeAlarms", "*")]),
    (  # named alarms: each one's ARN (CodeDeploy's service role reads its group's alarms so)
        "cloudwatch",
        "describe_alarms",
        {"AlarmNames": ["errors", "p99"]},
        [
            ("cloudwatch:DescribeAlarms", f"arn:aws:cloudwatch:us-east-1:{ACCOUNT}:alarm:errors"),
            ("cloudwatch:DescribeAlarms", f"arn:aws:cloudwatch:us-east-1:{ACCOUNT}:alarm:p99"),
        ],
    ),
    (
        "logs",
        "create_log_group",
        {"logGroupName": "/aws/lambda/fn"},
        [("logs:CreateLogGroup", f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/lambda/fn:*")],
    ),
    (
        "logs",
        "create_log_stream",
        {"logGroupName": "/aws/lambda/fn", "logStreamName": "s"},
        [("logs:CreateLogStream", f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/lambda/fn:log-stream:s")],
    ),
    (
        "logs",
        "put_log_events",
        {"logGroupName": "/aws/lambda/fn", "logStreamName": "s", "logEvents": [{"timestamp": 1, "message": "m"}]},
        [("logs:PutLogEvents", f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/lambda/fn:log-stream:s")],
    ),
    ("logs", "describe_log_groups", {}, [("logs:DescribeLogGroups", "*")]),
    # ---- ECR: the image pull SageMaker makes with the execution role
    ("ecr", "get_authorization_token", {}, [("ecr:GetAuthorizationToken", "*")]),
    (
        "ecr",
        "batch_get_image",
        {"repositoryName": "assets", "imageIds": [{"imageTag": "t"}]},
        [("ecr:BatchGetImage", f"arn:aws:ecr:us-east-1:{ACCOUNT}:repository/assets")],
    ),
    (
        "ecr",
        "get_download_url_for_layer",
        {"registryId": "210987654321", "repositoryName": "assets", "layerDigest": "sha256:0"},
        [("ecr:GetDownloadUrlForLayer", "arn:aws:ecr:us-east-1:210987654321:repository/assets")],
    ),
    # ---- EventBridge
    (
        "events",
        "put_events",
        {"Entries": [{"Source": "s", "DetailType": "d", "Detail": "{}"}]},
        [("events:PutEvents", f"arn:aws:events:us-east-1:{ACCOUNT}:event-bus/default")],
    ),
    (
        "events",
        "put_rule",
        {"Name": "nightly", "ScheduleExpression": "rate(1 day)"},
        [("events:PutRule", f"arn:aws:events:us-east-1:{ACCOUNT}:rule/nightly")],
    ),
    # ---- SageMaker Runtime
    (
        "sagemaker-runtime",
        "invoke_endpoint",
        {"EndpointName": "Digits-Realtime", "Body": b"{}"},
        [("sagemaker:InvokeEndpoint", f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:endpoint/digits-realtime")],
    ),
    (
        "sagemaker-runtime",
        "invoke_endpoint_async",
        {"EndpointName": "digits-async", "InputLocation": "s3://b/k"},
        [("sagemaker:InvokeEndpointAsync", f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:endpoint/digits-async")],
    ),
    (
        "sagemaker-runtime",
        "invoke_endpoint",
        {"EndpointName": "two-models", "InferenceComponentName": "two-models-digits", "Body": b"{}"},
        [("sagemaker:InvokeEndpoint", f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:endpoint/two-models")],
    ),
    # ---- SageMaker: the inference component calls local up answers
    (
        "sagemaker",
        "update_inference_component_runtime_config",
        {"InferenceComponentName": "Two-Models-Digits", "DesiredRuntimeConfig": {"CopyCount": 0}},
        [
            (
                "sagemaker:UpdateInferenceComponentRuntimeConfig",
                f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:inference-component/two-models-digits",
            )
        ],
    ),
    (
        "sagemaker",
        "describe_inference_component",
        {"InferenceComponentName": "two-models-digits"},
        [
            (
                "sagemaker:DescribeInferenceComponent",
                f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:inference-component/two-models-digits",
            )
        ],
    ),
    # ---- SageMaker: the transform job calls local up answers (an engine: transform schedule's target)
    (
        "sagemaker",
        "create_transform_job",
        {
            "TransformJobName": "On-Transform-d32c5kddcf5bb8c3",
            "ModelName": "m",
            "TransformInput": {"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/in/"}}},
            "TransformOutput": {"S3OutputPath": "s3://b/out"},
            "TransformResources": {"InstanceType": "ml.m5.large", "InstanceCount": 1},
        },
        [
            (
                "sagemaker:CreateTransformJob",
                f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:transform-job/on-transform-d32c5kddcf5bb8c3",
            )
        ],
    ),
    (
        "sagemaker",
        "describe_transform_job",
        {"TransformJobName": "on-transform-d32c5kddcf5bb8c3"},
        [
            (
                "sagemaker:DescribeTransformJob",
                f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:transform-job/on-transform-d32c5kddcf5bb8c3",
            )
        ],
    ),
    # ---- Lambda
    ("lambda", "invoke", {"FunctionName": "digits-api"}, [("lambda:InvokeFunction", FUNCTION)]),
    ("lambda", "invoke", {"FunctionName": "digits-api:live"}, [("lambda:InvokeFunction", f"{FUNCTION}:live")]),
    (
        "lambda",
        "invoke",
        {"FunctionName": "digits-api", "Qualifier": "live"},
        [("lambda:InvokeFunction", f"{FUNCTION}:live")],
    ),
    (
        "lambda",
        "invoke",
        {"FunctionName": "arn:aws:lambda:eu-west-1:111122223333:function:other"},
        [("lambda:InvokeFunction", "arn:aws:lambda:eu-west-1:111122223333:function:other")],
    ),
    ("lambda", "get_function", {"FunctionName": "digits-api"}, [("lambda:GetFunction", FUNCTION)]),
    ("lambda", "list_functions", {}, [("lambda:ListFunctions", "*")]),
]


@pytest.mark.parametrize(
    ("service", "operation", "params", "expected"),
    CASES,
    ids=[f"{case[0]}.{case[1]}-{index}" for index, case in enumerate(CASES)],
)
def test_call_is_authorized_as_aws_authorizes_it(
    service: str, operation: str, params: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    # GIVEN the request a boto3 client sends / WHEN described / THEN the checks AWS makes for it
    described_operation = described(service, operation, **params)
    assert described_operation.recognised, described_operation.note
    assert checks(described_operation) == expected


def test_a_listing_carries_its_prefix_delimiter_and_max_keys() -> None:
    operation = described("s3", "list_objects_v2", Bucket="jobs", Prefix="input/", Delimiter="/", MaxKeys=10)
    assert operation.checks[0].context == {"s3:prefix": "input/", "s3:delimiter": "/", "s3:max-keys": "10"}


def test_a_versioned_read_carries_the_version_and_a_delete_objects_lists_its_keys() -> None:
    assert described("s3", "get_object", Bucket="jobs", Key="k", VersionId="v1").checks[0].context == {
        "s3:VersionId": "v1"
    }
    operation = described(
        "s3", "delete_objects", Bucket="jobs", Delete={"Objects": [{"Key": "a"}, {"Key": "b", "VersionId": "v"}]}
    )
    assert checks(operation) == [
        ("s3:DeleteObject", "arn:aws:s3:::jobs/a"),
        ("s3:DeleteObjectVersion", "arn:aws:s3:::jobs/b"),
    ]
    assert operation.delete_keys == (("a", None), ("b", "v"))


def test_put_metric_data_carries_its_namespace_in_every_protocol() -> None:
    # GIVEN the JSON protocol (what botocore sends), the query protocol and RPC v2 CBOR
    json_request = sent(
        "cloudwatch",
        "put_metric_data",
        Namespace="/aws/sagemaker/Endpoints/x",
        MetricData=[{"MetricName": "m", "Value": 1.0}],
    )
    query_request = HttpRequest(
        "POST",
        "/",
        "",
        {"content-type": "application/x-www-form-urlencoded"},
        b"Action=PutMetricData&Namespace=%2Faws%2Fx&Version=2010-08-01",
    )
    cbor_body = bytes([0xA1, 0x69]) + b"Namespace" + bytes([0x66]) + b"/aws/y"  # {"Namespace": "/aws/y"}
    cbor_request = HttpRequest(
        "POST",
        "/service/GraniteServiceVersion20100801/operation/PutMetricData",
        "",
        {"smithy-protocol": "rpc-v2-cbor"},
        cbor_body,
    )
    namespaces = [
        describe(request, "monitoring", WHERE).checks[0].context["cloudwatch:namespace"]
        for request in (json_request, query_request, cbor_request)
    ]
    assert namespaces == ["/aws/sagemaker/Endpoints/x", "/aws/x", "/aws/y"]


def test_sqs_query_protocol_names_the_queue_in_the_form_or_the_path() -> None:
    form = {"content-type": "application/x-www-form-urlencoded"}
    body = urllib.parse.urlencode({"Action": "SendMessage", "QueueUrl": QUEUE_URL, "MessageBody": "m"}).encode()
    assert checks(describe(HttpRequest("POST", "/", "", form, body), "sqs", WHERE)) == [("sqs:SendMessage", QUEUE)]
    on_path = HttpRequest("POST", f"/{ACCOUNT}/work", "", form, b"Action=DeleteMessageBatch&Version=2012-11-05")
    assert checks(describe(on_path, "sqs", WHERE)) == [("sqs:DeleteMessage", QUEUE)]


def test_get_caller_identity_needs_no_permission() -> None:
    operation = described("sts", "get_caller_identity")
    assert operation.always_allowed
    assert operation.checks == ()


def test_an_http_api_route_is_invoked_on_its_execute_api_arn() -> None:
    request = HttpRequest("POST", "/invocations", "", {"host": "localhost"}, b"{}")
    default_stage = describe(request, "execute-api", WHERE, api=ExecuteApi("a1b2c3"))
    assert checks(default_stage) == [
        ("execute-api:Invoke", f"arn:aws:execute-api:us-east-1:{ACCOUNT}:a1b2c3/$default/POST/invocations")
    ]
    named = describe(
        HttpRequest("GET", "/prod/models/digits", "", {}, b""), "execute-api", WHERE, api=ExecuteApi("a1b2c3", "prod")
    )
    assert checks(named) == [
        ("execute-api:Invoke", f"arn:aws:execute-api:us-east-1:{ACCOUNT}:a1b2c3/prod/GET/models/digits")
    ]


def test_virtual_hosted_s3_names_the_bucket_in_the_host_under_the_emulators_names() -> None:
    endpoint = Endpoint("127.0.0.1:4566")
    request = HttpRequest("GET", "/in/a", "", {"host": "jobs.localhost:4566"}, b"")
    canonical = canonical_request(request, "s3", endpoint, "us-east-1", ACCOUNT)
    assert (canonical.raw_path, canonical.header("host")) == ("/jobs/in/a", "127.0.0.1:4566")
    assert checks(describe(canonical, "s3", WHERE)) == [("s3:GetObject", "arn:aws:s3:::jobs/in/a")]
    # a host that is neither the emulator nor a bucket under one of its names: S3's NoSuchBucket for it
    for host in ("jobs.s3.us-east-1.amazonaws.com", "jobs.anything:4566", "localhost.evil:4566"):
        with pytest.raises(Malformed) as refused:
            canonical_request(
                HttpRequest("GET", "/in/a", "", {"host": host}, b""), "s3", endpoint, "us-east-1", ACCOUNT
            )
        assert (refused.value.s3_code, refused.value.members["BucketName"]) == ("NoSuchBucket", host.split(":")[0])


UNRECOGNISED = [
    ("kinesis", "put_record", {"StreamName": "s", "Data": b"x", "PartitionKey": "p"}, "kinesis:PutRecord"),
    ("dynamodb", "execute_statement", {"Statement": "SELECT * FROM jobs"}, "dynamodb:ExecuteStatement"),
    ("sagemaker", "describe_endpoint", {"EndpointName": "e"}, "sagemaker:DescribeEndpoint"),
]


@pytest.mark.parametrize(("service", "operation", "params", "action"), UNRECOGNISED)
def test_a_call_not_recognised_is_checked_on_star_and_says_so(
    service: str, operation: str, params: dict[str, Any], action: str
) -> None:
    described_operation = described(service, operation, **params)
    assert not described_operation.recognised
    assert described_operation.note
    assert checks(described_operation) == [(action, "*")]


def test_a_browser_post_upload_is_not_recognised() -> None:
    request = HttpRequest("POST", "/jobs", "", {"content-type": "multipart/form-data; boundary=x"}, b"--x--")
    operation = describe(request, "s3", WHERE)
    assert not operation.recognised
    assert operation.checks == (Check("s3:UnknownOperation", "*"),)


def test_a_gzipped_body_is_read_after_decompression() -> None:
    import gzip

    body = gzip.compress(json.dumps({"Namespace": "/aws/z", "MetricData": []}).encode())
    request = HttpRequest(
        "POST",
        "/",
        "",
        {"x-amz-target": "GraniteServiceVersion20100801.PutMetricData", "content-encoding": "gzip"},
        body,
    )
    assert describe(request, "monitoring", WHERE).checks[0].context == {"cloudwatch:namespace": "/aws/z"}


def test_an_io_body_is_captured_like_bytes() -> None:
    request = sent("s3", "put_object", Bucket="jobs", Key="k", Body=io.BytesIO(b"streamed"))
    assert request.body == b"streamed"
