"""IAM enforced in front of a real moto server (and servestack-style fronts) over HTTP, with real boto3 clients.

The moto server is moto's own WSGI app (`DomainDispatcherApplication(create_backend_app)`) wrapped by
`IamEnforcer.wsgi`, served by werkzeug as `ThreadedMotoServer` serves it (servestack/local/iam/server.py).
The Lambda, SageMaker Runtime and HTTP API fronts are `LocalHttpServer`s that call
`IamEnforcer.check_request`, as local up's fronts do.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from servestack.local.hosting.http_server import LocalHttpServer, Reply, Request
from servestack.local.iam import (
    DISABLED_WARNING,
    ExecuteApi,
    IamEnforcer,
    Identity,
    IdentityStore,
    ResourcePolicies,
    evaluate_service_principal,
)
from servestack.local.iam.server import EnforcedMotoServer

ACCOUNT = "123456789012"
REGION = "us-east-1"


@dataclass
class Emulator:
    url: str
    enforcer: IamEnforcer
    store: IdentityStore
    policies: ResourcePolicies
    lines: list[str]

    def clients(self, identity: Identity, *, url: str | None = None, **config: Any) -> Any:
        session = boto3.Session(
            aws_access_key_id=identity.access_key_id,
            aws_secret_access_key=identity.secret_access_key,
            aws_session_token=identity.session_token,
            region_name=REGION,
        )
        settings = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **config)
        return Clients(session, url or self.url, settings)


class Clients:
    """boto3 clients of one identity, made once per service (`.s3`, `.sagemaker_runtime`, `.lambda_`)."""

    def __init__(self, session: boto3.Session, url: str, config: Config) -> None:
        self.session, self.url, self.config = session, url, config
        self.made: dict[str, Any] = {}

    def __getattr__(self, service: str) -> Any:
        if service not in self.made:
            name = service.rstrip("_").replace("_", "-")
            self.made[service] = self.session.client(name, endpoint_url=self.url, config=self.config)
        return self.made[service]


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    store = IdentityStore()
    store.developer()
    policies = ResourcePolicies()
    lines: list[str] = []
    enforcer = IamEnforcer(store, policies, log=lines.append)
    server = EnforcedMotoServer(enforcer).start()
    yield Emulator(server.url, enforcer, store, policies, lines)
    server.stop()


@pytest.fixture
def name() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


DEVELOPER_CLIENTS: dict[str, Clients] = {}


def developer(emulator: Emulator) -> Clients:
    if emulator.url not in DEVELOPER_CLIENTS:
        identity = emulator.store.lookup("local")
        assert identity is not None
        DEVELOPER_CLIENTS[emulator.url] = emulator.clients(identity)
    return DEVELOPER_CLIENTS[emulator.url]


def role(emulator: Emulator, role_name: str, *statements: dict[str, Any]) -> Identity:
    document = {"Version": "2012-10-17", "Statement": list(statements)}
    return emulator.store.role(role_name, {"Policy": document}, session_name=f"{role_name}-fn")


def refusal(raised: pytest.ExceptionInfo[ClientError]) -> tuple[int, str, str]:
    error = raised.value.response
    return error["ResponseMetadata"]["HTTPStatusCode"], error["Error"]["Code"], error["Error"].get("Message", "")


# ------------------------------------------------------------------------------------------ the brief's scenarios


def test_a_role_reads_its_prefix_and_nothing_else(emulator: Emulator, name: str) -> None:
    # GIVEN a bucket with in/x and out/x, and a role allowed s3:GetObject on in/*
    developer(emulator).s3.create_bucket(Bucket=name)
    for key in ("in/x", "out/x"):
        developer(emulator).s3.put_object(Bucket=name, Key=key, Body=b"payload")
    reader = role(
        emulator,
        f"{name}-reader",
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{name}/in/*"},
    )
    s3 = emulator.clients(reader).s3
    # WHEN it reads in/x, reads out/x and deletes in/x
    assert s3.get_object(Bucket=name, Key="in/x")["Body"].read() == b"payload"
    with pytest.raises(ClientError) as read_out:
        s3.get_object(Bucket=name, Key="out/x")
    with pytest.raises(ClientError) as delete:
        s3.delete_object(Bucket=name, Key="in/x")
    # THEN both are S3's AccessDenied, naming the caller, the action and the resource as AWS does
    session = f"arn:aws:sts::{ACCOUNT}:assumed-role/{name}-reader/{name}-reader-fn"
    assert refusal(read_out) == (
        403,
        "AccessDenied",
        f'User: {session} is not authorized to perform: s3:GetObject on resource: "arn:aws:s3:::{name}/out/x" '
        "because no identity-based policy allows the s3:GetObject action",
    )
    status, code, message = refusal(delete)
    assert (status, code) == (403, "AccessDenied")
    assert f's3:DeleteObject on resource: "arn:aws:s3:::{name}/in/x"' in message
    # AND the object is still there, and each refusal was logged and kept
    assert developer(emulator).s3.head_object(Bucket=name, Key="in/x")["ContentLength"] == 7
    assert (
        f"iam: DENY {session} s3:DeleteObject arn:aws:s3:::{name}/in/x "
        "(no identity-based policy allows the s3:DeleteObject action)" in emulator.lines
    )
    assert any(
        denial.action == "s3:GetObject" and denial.resource.endswith("/out/x") for denial in emulator.enforcer.denials
    )


def test_a_listing_is_allowed_only_under_the_prefix_its_condition_names(emulator: Emulator, name: str) -> None:
    developer(emulator).s3.create_bucket(Bucket=name)
    developer(emulator).s3.put_object(Bucket=name, Key="in/a", Body=b"1")
    lister = role(
        emulator,
        f"{name}-lister",
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": f"arn:aws:s3:::{name}",
            "Condition": {"StringLike": {"s3:prefix": ["in/*"]}},
        },
    )
    s3 = emulator.clients(lister).s3
    assert [item["Key"] for item in s3.list_objects_v2(Bucket=name, Prefix="in/")["Contents"]] == ["in/a"]
    with pytest.raises(ClientError) as outside:
        s3.list_objects_v2(Bucket=name, Prefix="out/")
    with pytest.raises(ClientError) as no_prefix:
        s3.list_objects_v2(Bucket=name)
    assert refusal(outside)[:2] == (403, "AccessDenied")
    assert f's3:ListBucket on resource: "arn:aws:s3:::{name}"' in refusal(no_prefix)[2]


def test_sqs_send_is_allowed_on_one_queue_and_denied_on_another(emulator: Emulator, name: str) -> None:
    sqs = developer(emulator).sqs
    allowed_url = sqs.create_queue(QueueName=f"{name}-work")["QueueUrl"]
    other_url = sqs.create_queue(QueueName=f"{name}-other")["QueueUrl"]
    sender = role(
        emulator,
        f"{name}-sender",
        {"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}-work"},
    )
    client = emulator.clients(sender).sqs
    assert client.send_message(QueueUrl=allowed_url, MessageBody="m")["MessageId"]
    with pytest.raises(ClientError) as raised:
        client.send_message_batch(QueueUrl=other_url, Entries=[{"Id": "1", "MessageBody": "m"}])
    status, code, message = refusal(raised)
    # THEN SQS's code, and SQS's spelling of the action (lower-cased)
    assert (status, code) == (403, "AccessDenied")
    assert f"sqs:sendmessage on resource: arn:aws:sqs:{REGION}:{ACCOUNT}:{name}-other" in message


def test_dynamodb_put_item_is_allowed_on_one_table_and_denied_on_another(emulator: Emulator, name: str) -> None:
    ddb = developer(emulator).dynamodb
    for table in (f"{name}-jobs", f"{name}-other"):
        ddb.create_table(
            TableName=table,
            KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
    writer = role(
        emulator,
        f"{name}-writer",
        {
            "Effect": "Allow",
            "Action": "dynamodb:PutItem",
            "Resource": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}-jobs",
        },
    )
    client = emulator.clients(writer).dynamodb
    client.put_item(TableName=f"{name}-jobs", Item={"job_id": {"S": "1"}})
    with pytest.raises(ClientError) as raised:
        client.put_item(TableName=f"{name}-other", Item={"job_id": {"S": "1"}})
    status, code, message = refusal(raised)
    assert (status, code) == (400, "AccessDeniedException")
    assert f"dynamodb:PutItem on resource: arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}-other" in message
    assert developer(emulator).dynamodb.get_item(TableName=f"{name}-jobs", Key={"job_id": {"S": "1"}})["Item"]


@pytest.mark.parametrize("signature_version", ["s3v4", None], ids=["sigv4", "boto3-default-sigv2"])
def test_a_presigned_put_is_refused_when_its_signer_may_not_write(
    emulator: Emulator, name: str, signature_version: str | None
) -> None:
    # GIVEN a role that may write uploads/* only, presigning PUTs (SigV4, and boto3's default form)
    developer(emulator).s3.create_bucket(Bucket=name)
    uploader = role(
        emulator,
        f"{name}-up",
        {"Effect": "Allow", "Action": "s3:PutObject", "Resource": f"arn:aws:s3:::{name}/uploads/*"},
    )
    extra = {"signature_version": signature_version} if signature_version else {}
    s3 = emulator.clients(uploader, **extra).s3
    allowed = s3.generate_presigned_url("put_object", Params={"Bucket": name, "Key": "uploads/a"}, ExpiresIn=300)
    refused = s3.generate_presigned_url("put_object", Params={"Bucket": name, "Key": "results/a"}, ExpiresIn=300)
    # WHEN someone else (no credentials) uses the URLs
    assert httpx.put(allowed, content=b"data").status_code == 200
    response = httpx.put(refused, content=b"data")
    # THEN the second is refused as the signer would be
    assert response.status_code == 403
    assert "<Code>AccessDenied</Code>" in response.text
    assert f's3:PutObject on resource: "arn:aws:s3:::{name}/results/a"' in response.text
    assert developer(emulator).s3.get_object(Bucket=name, Key="uploads/a")["Body"].read() == b"data"


def test_the_developer_identity_may_do_anything(emulator: Emulator, name: str) -> None:
    clients = developer(emulator)
    clients.s3.create_bucket(Bucket=name)
    clients.s3.put_object(Bucket=name, Key="k", Body=b"v")
    clients.s3.delete_object(Bucket=name, Key="k")
    assert clients.sts.get_caller_identity()["Arn"] == f"arn:aws:iam::{ACCOUNT}:user/developer"
    topic = clients.sns.create_topic(Name=name)["TopicArn"]
    assert clients.sns.publish(TopicArn=topic, Message="m")["MessageId"]


@pytest.mark.parametrize(
    ("service", "call", "expected"),
    [
        ("s3", lambda c: c.list_buckets(), (403, "InvalidAccessKeyId")),
        ("sqs", lambda c: c.list_queues(), (403, "InvalidClientTokenId")),
        ("dynamodb", lambda c: c.list_tables(), (400, "UnrecognizedClientException")),
        ("sns", lambda c: c.list_topics(), (403, "InvalidClientTokenId")),
        ("sts", lambda c: c.get_caller_identity(), (403, "InvalidClientTokenId")),
        ("logs", lambda c: c.describe_log_groups(), (400, "UnrecognizedClientException")),
    ],
)
def test_an_unknown_key_is_refused_with_the_services_code(
    emulator: Emulator, service: str, call: Any, expected: tuple[int, str]
) -> None:
    stranger = boto3.Session(
        aws_access_key_id="AKIASTRANGERSTRANGER",
        aws_secret_access_key="secret",
        region_name=REGION,
    )
    client = stranger.client(
        service, endpoint_url=emulator.url, config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    )
    with pytest.raises(ClientError) as raised:
        call(client)
    assert refusal(raised)[:2] == expected


def test_a_wrong_secret_is_a_signature_mismatch(emulator: Emulator) -> None:
    forged = boto3.Session(aws_access_key_id="local", aws_secret_access_key="guess", region_name=REGION)
    config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    with pytest.raises(ClientError) as s3:
        forged.client("s3", endpoint_url=emulator.url, config=config).list_buckets()
    with pytest.raises(ClientError) as sqs:
        forged.client("sqs", endpoint_url=emulator.url, config=config).list_queues()
    assert refusal(s3)[:2] == (403, "SignatureDoesNotMatch")
    assert refusal(sqs)[:2] == (403, "SignatureDoesNotMatch")


def test_an_anonymous_request_is_refused_unless_a_bucket_policy_opens_it(emulator: Emulator, name: str) -> None:
    developer(emulator).s3.create_bucket(Bucket=name)
    developer(emulator).s3.put_object(Bucket=name, Key="public/a", Body=b"open")
    developer(emulator).s3.put_object(Bucket=name, Key="private/a", Body=b"closed")
    public = {
        "Effect": "Allow",
        "Principal": "*",
        "Action": "s3:GetObject",
        "Resource": f"arn:aws:s3:::{name}/public/*",
    }
    # (as local up does: the template's bucket policy goes to the emulator and to the enforcer)
    developer(emulator).s3.put_bucket_policy(Bucket=name, Policy=json.dumps({"Statement": [public]}))
    emulator.policies.put(f"arn:aws:s3:::{name}", {"Statement": [public]})
    assert httpx.get(f"{emulator.url}/{name}/public/a").content == b"open"
    refused = httpx.get(f"{emulator.url}/{name}/private/a")
    assert refused.status_code == 403
    assert "<Code>AccessDenied</Code><Message>Access Denied</Message>" in refused.text
    # AND every other service wants a signature
    unsigned = httpx.post(
        emulator.url,
        headers={"X-Amz-Target": "DynamoDB_20120810.ListTables", "Content-Type": "application/x-amz-json-1.0"},
        content=b"{}",
    )
    assert unsigned.status_code == 400
    assert unsigned.json()["__type"].endswith("#MissingAuthenticationTokenException")


# ------------------------------------------------------------------------------ S3 behaviour copied from AWS


def test_delete_objects_deletes_the_allowed_keys_and_reports_the_others(emulator: Emulator, name: str) -> None:
    developer(emulator).s3.create_bucket(Bucket=name)
    for key in ("errors/part-1", "errors/part-2", "output/part-1"):
        developer(emulator).s3.put_object(Bucket=name, Key=key, Body=b"x")
    cleaner = role(
        emulator,
        f"{name}-cleaner",
        {"Effect": "Allow", "Action": "s3:DeleteObject", "Resource": f"arn:aws:s3:::{name}/errors/*"},
    )
    result = emulator.clients(cleaner).s3.delete_objects(
        Bucket=name, Delete={"Objects": [{"Key": "errors/part-1"}, {"Key": "output/part-1"}, {"Key": "errors/part-2"}]}
    )
    assert sorted(item["Key"] for item in result["Deleted"]) == ["errors/part-1", "errors/part-2"]
    assert result["Errors"] == [{"Key": "output/part-1", "Code": "AccessDenied", "Message": "Access Denied"}]
    left = developer(emulator).s3.list_objects_v2(Bucket=name)["Contents"]
    assert [item["Key"] for item in left] == ["output/part-1"]


def test_a_missing_key_is_403_without_list_bucket_and_404_with_it(emulator: Emulator, name: str) -> None:
    developer(emulator).s3.create_bucket(Bucket=name)
    blind = role(
        emulator, f"{name}-blind", {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{name}/*"}
    )
    seeing = role(
        emulator,
        f"{name}-seeing",
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{name}/*"},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{name}"},
    )
    with pytest.raises(ClientError) as blind_get:
        emulator.clients(blind).s3.get_object(Bucket=name, Key="missing")
    with pytest.raises(ClientError) as blind_head:
        emulator.clients(blind).s3.head_object(Bucket=name, Key="missing")
    with pytest.raises(ClientError) as seeing_get:
        emulator.clients(seeing).s3.get_object(Bucket=name, Key="missing")
    assert refusal(blind_get)[:2] == (403, "AccessDenied")
    assert f's3:ListBucket on resource: "arn:aws:s3:::{name}"' in refusal(blind_get)[2]
    assert refusal(blind_head)[:2] == (403, "403")  # a HEAD error has no body: boto3 reports the status
    assert refusal(seeing_get)[:2] == (404, "NoSuchKey")


def test_a_tls_only_bucket_policy_does_not_deny_local_calls(emulator: Emulator, name: str) -> None:
    # GIVEN CDK's enforce_ssl bucket policy: deny everything when aws:SecureTransport is false
    developer(emulator).s3.create_bucket(Bucket=name)
    emulator.policies.put(
        f"arn:aws:s3:::{name}",
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Deny",
                    "Principal": {"AWS": "*"},
                    "Action": "s3:*",
                    "Resource": [f"arn:aws:s3:::{name}", f"arn:aws:s3:::{name}/*"],
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                }
            ],
        },
    )
    writer = role(
        emulator, f"{name}-w", {"Effect": "Allow", "Action": "s3:PutObject", "Resource": f"arn:aws:s3:::{name}/*"}
    )
    # THEN a permitted call still works (local HTTP stands for the cloud's HTTPS)
    emulator.clients(writer).s3.put_object(Bucket=name, Key="k", Body=b"v")


def test_a_bucket_policy_naming_the_role_allows_without_an_identity_policy(emulator: Emulator, name: str) -> None:
    developer(emulator).s3.create_bucket(Bucket=name)
    developer(emulator).s3.put_object(Bucket=name, Key="shared/a", Body=b"shared")
    guest = role(emulator, f"{name}-guest", {"Effect": "Allow", "Action": "sqs:ListQueues", "Resource": "*"})
    emulator.policies.put(
        f"arn:aws:s3:::{name}",
        {
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"AWS": guest.principal_arn},
                    "Action": "s3:GetObject",
                    "Resource": f"arn:aws:s3:::{name}/shared/*",
                }
            ]
        },
    )
    assert emulator.clients(guest).s3.get_object(Bucket=name, Key="shared/a")["Body"].read() == b"shared"


# ------------------------------------------------------------------------------------------ refusals per service


def test_sns_publish_refusal_is_an_authorization_error(emulator: Emulator, name: str) -> None:
    topic = developer(emulator).sns.create_topic(Name=name)["TopicArn"]
    mute = role(emulator, f"{name}-mute", {"Effect": "Allow", "Action": "sns:ListTopics", "Resource": "*"})
    with pytest.raises(ClientError) as raised:
        emulator.clients(mute).sns.publish(TopicArn=topic, Message="m")
    status, code, message = refusal(raised)
    assert (status, code) == (403, "AuthorizationError")
    assert f"SNS:Publish on resource: {topic} because no identity-based policy allows the SNS:Publish action" in message


def test_cloudwatch_refusal_follows_the_namespace_condition(emulator: Emulator, name: str) -> None:
    metrics = role(
        emulator,
        f"{name}-metrics",
        {
            "Effect": "Allow",
            "Action": "cloudwatch:PutMetricData",
            "Resource": "*",
            "Condition": {"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/Endpoints*"}},
        },
    )
    cloudwatch = emulator.clients(metrics).cloudwatch
    cloudwatch.put_metric_data(
        Namespace="/aws/sagemaker/Endpoints/digits", MetricData=[{"MetricName": "m", "Value": 1.0}]
    )
    with pytest.raises(ClientError) as raised:
        cloudwatch.put_metric_data(Namespace="Custom", MetricData=[{"MetricName": "m", "Value": 1.0}])
    status, code, message = refusal(raised)
    assert (status, code) == (403, "AccessDenied")
    assert message.endswith(
        "is not authorized to perform: cloudwatch:PutMetricData "
        "because no identity-based policy allows the cloudwatch:PutMetricData action"
    )


def test_logs_refusal_is_an_access_denied_exception(emulator: Emulator, name: str) -> None:
    writer = role(
        emulator,
        f"{name}-logs",
        {
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/lambda/{name}:*",
        },
    )
    developer(emulator).logs.create_log_group(logGroupName=f"/aws/lambda/{name}")
    logs = emulator.clients(writer).logs
    logs.create_log_stream(logGroupName=f"/aws/lambda/{name}", logStreamName="s")
    with pytest.raises(ClientError) as raised:
        logs.create_log_group(logGroupName=f"/aws/lambda/{name}-other")
    assert refusal(raised)[:2] == (400, "AccessDeniedException")
    assert "logs:CreateLogGroup on resource:" in refusal(raised)[2]


def test_sqs_query_protocol_refusal(emulator: Emulator, name: str) -> None:
    # GIVEN a client of SQS's older query protocol (form body, `Action=`), signed by botocore's signer
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    queue_url = developer(emulator).sqs.create_queue(QueueName=name)["QueueUrl"]
    idle = role(emulator, f"{name}-idle", {"Effect": "Allow", "Action": "sqs:ListQueues", "Resource": "*"})
    body = f"Action=SendMessage&Version=2012-11-05&QueueUrl={queue_url}&MessageBody=m"
    request = AWSRequest(
        method="POST",
        url=emulator.url + "/",
        data=body,
        headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"},
    )
    SigV4Auth(Credentials(idle.access_key_id, idle.secret_access_key, idle.session_token), "sqs", REGION).add_auth(
        request
    )
    response = httpx.post(emulator.url + "/", content=body.encode(), headers=dict(request.headers.items()))
    # THEN the query protocol's ErrorResponse with SQS's code
    assert response.status_code == 403
    assert "<Code>AccessDenied</Code>" in response.text
    assert "sqs:sendmessage on resource:" in response.text


def test_get_caller_identity_names_the_role_session_even_under_a_deny_all(emulator: Emulator, name: str) -> None:
    boxed = role(emulator, f"{name}-boxed", {"Effect": "Deny", "Action": "*", "Resource": "*"})
    identity = emulator.clients(boxed).sts.get_caller_identity()
    assert identity["Arn"] == f"arn:aws:sts::{ACCOUNT}:assumed-role/{name}-boxed/{name}-boxed-fn"
    assert identity["Account"] == ACCOUNT
    assert identity["UserId"] == boxed.user_id


def test_assume_role_follows_the_trust_policy(emulator: Emulator, name: str) -> None:
    # GIVEN a role trusting the account, and one trusting only Lambda
    target = role(emulator, f"{name}-target", {"Effect": "Allow", "Action": "s3:ListAllMyBuckets", "Resource": "*"})
    lambda_only = role(emulator, f"{name}-fn", {"Effect": "Allow", "Action": "s3:ListAllMyBuckets", "Resource": "*"})
    emulator.policies.put(
        target.principal_arn,
        {
            "Statement": [
                {"Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}, "Action": "sts:AssumeRole"}
            ]
        },
    )
    emulator.policies.put(
        lambda_only.principal_arn,
        {
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
            ]
        },
    )
    sts = developer(emulator).sts
    # WHEN the developer assumes each
    credentials = sts.assume_role(RoleArn=target.principal_arn, RoleSessionName="replay")["Credentials"]
    with pytest.raises(ClientError) as raised:
        sts.assume_role(RoleArn=lambda_only.principal_arn, RoleSessionName="replay")
    # THEN the first session works as the role, the second is refused
    session = boto3.Session(
        aws_access_key_id=credentials["AccessKeyId"],
        aws_secret_access_key=credentials["SecretAccessKey"],
        aws_session_token=credentials["SessionToken"],
        region_name=REGION,
    )
    assumed = session.client("sts", endpoint_url=emulator.url).get_caller_identity()["Arn"]
    assert assumed == f"arn:aws:sts::{ACCOUNT}:assumed-role/{name}-target/replay"
    assert refusal(raised)[:2] == (403, "AccessDenied")
    assert f"sts:AssumeRole on resource: {lambda_only.principal_arn}" in refusal(raised)[2]


def test_a_call_the_engine_does_not_recognise_is_refused_and_says_so(emulator: Emulator, name: str) -> None:
    scoped = role(
        emulator,
        f"{name}-scoped",
        {"Effect": "Allow", "Action": "kinesis:*", "Resource": f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{name}"},
    )
    with pytest.raises(ClientError) as raised:
        emulator.clients(scoped).kinesis.put_record(StreamName=name, Data=b"x", PartitionKey="p")
    _status, code, message = refusal(raised)
    assert code == "AccessDeniedException"
    assert "kinesis:PutRecord" in message
    assert "(servestack local: servestack does not describe kinesis calls)" in message


# ------------------------------------------------------------------------------------------ servestack's own fronts


@dataclass
class Front:
    url: str
    calls: list[str]


@pytest.fixture(scope="module")
def front(emulator: Emulator) -> Iterator[Front]:
    """A stand-in for local up's AWS API front: Lambda Invoke and SageMaker Runtime on one port, and an HTTP
    API on another, each asking the enforcer before answering."""
    calls: list[str] = []

    def aws_api(request: Request) -> Reply:
        service = "sagemaker" if request.path.startswith("/endpoints/") else "lambda"
        verdict = emulator.enforcer.check_request(request, service)
        if isinstance(verdict, Reply):
            return verdict
        calls.append(f"{service} {request.path} as {verdict.arn if verdict else '?'}")
        return Reply(200, {"Content-Type": "application/json"}, b'{"ok": true}')

    server = LocalHttpServer("iam-front", aws_api).serve_in_background()
    yield Front(server.url, calls)
    server.close()


@pytest.fixture(scope="module")
def http_api(emulator: Emulator) -> Iterator[str]:
    api = ExecuteApi("a1b2c3d4")

    def route(request: Request) -> Reply:
        verdict = emulator.enforcer.check_request(request, "execute-api", api=api)
        return verdict if isinstance(verdict, Reply) else Reply(200, {"Content-Type": "application/json"}, b"{}")

    server = LocalHttpServer("iam-http-api", route).serve_in_background()
    yield server.url
    server.close()


def test_lambda_invoke_refusal_through_a_servestack_front(emulator: Emulator, front: Front, name: str) -> None:
    function = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"
    scheduler = role(
        emulator,
        f"{name}-sched",
        {"Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": [function, f"{function}:*"]},
    )
    client = emulator.clients(scheduler, url=front.url).lambda_
    assert json.loads(client.invoke(FunctionName=f"{name}:live")["Payload"].read()) == {"ok": True}
    with pytest.raises(ClientError) as raised:
        client.invoke(FunctionName=f"{name}-other")
    status, code, message = refusal(raised)
    assert (status, code) == (403, "AccessDeniedException")
    assert f"lambda:InvokeFunction on resource: {function}-other because no identity-based policy allows" in message


def test_sagemaker_runtime_refusal_through_a_servestack_front(emulator: Emulator, front: Front, name: str) -> None:
    endpoint = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/{name}-realtime"
    caller = role(
        emulator, f"{name}-caller", {"Effect": "Allow", "Action": "sagemaker:InvokeEndpoint", "Resource": endpoint}
    )
    runtime = emulator.clients(caller, url=front.url).sagemaker_runtime
    assert json.loads(runtime.invoke_endpoint(EndpointName=f"{name}-Realtime", Body=b"{}")["Body"].read()) == {
        "ok": True
    }
    with pytest.raises(ClientError) as raised:
        runtime.invoke_endpoint_async(EndpointName=f"{name}-realtime", InputLocation="s3://b/k")
    status, code, message = refusal(raised)
    assert (status, code) == (400, "AccessDeniedException")
    assert f"sagemaker:InvokeEndpointAsync on resource: {endpoint}" in message
    unsigned = httpx.post(f"{front.url}/endpoints/{name}/invocations", content=b"{}")
    assert (unsigned.status_code, unsigned.headers["x-amzn-ErrorType"]) == (403, "MissingAuthenticationTokenException")


def test_http_api_with_iam_authorization(emulator: Emulator, http_api: str, name: str) -> None:
    from servestack.client import SigV4

    allowed_route = f"arn:aws:execute-api:{REGION}:{ACCOUNT}:a1b2c3d4/$default/POST/invocations"
    caller = role(
        emulator, f"{name}-api", {"Effect": "Allow", "Action": "execute-api:Invoke", "Resource": allowed_route}
    )
    session = boto3.Session(
        aws_access_key_id=caller.access_key_id,
        aws_secret_access_key=caller.secret_access_key,
        aws_session_token=caller.session_token,
        region_name=REGION,
    )
    # GIVEN servestack's own SigV4 client auth, as users call an IAM-authorized HTTP API
    with httpx.Client(base_url=http_api, auth=SigV4(REGION, "execute-api", session)) as signed:
        assert signed.post("/invocations", content=b"{}").status_code == 200
        denied = signed.post("/models", content=b"{}")
    unsigned = httpx.post(f"{http_api}/invocations", content=b"{}")
    assert (denied.status_code, denied.json()) == (403, {"message": "Forbidden"})
    assert (unsigned.status_code, unsigned.json()) == (403, {"message": "Forbidden"})


# ------------------------------------------------------------------------------------------ other plug points


def test_authorize_decides_for_calls_made_without_http(emulator: Emulator, name: str) -> None:
    # GIVEN the scheduler role, allowed to invoke one function
    function = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"
    scheduler = role(
        emulator, f"{name}-sched2", {"Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": function}
    )
    allowed = emulator.enforcer.authorize(scheduler, "lambda:InvokeFunction", function)
    refused = emulator.enforcer.authorize(scheduler, "lambda:InvokeFunction", f"{function}-other")
    assert allowed.allowed
    assert not refused.allowed
    assert emulator.enforcer.denials[-1].resource == f"{function}-other"
    assert emulator.lines[-1].startswith(f"iam: DENY {scheduler.arn} lambda:InvokeFunction {function}-other (")


def test_s3_may_notify_only_the_queue_whose_policy_names_the_bucket(name: str) -> None:
    queue = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"
    queue_policy = {
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "s3.amazonaws.com"},
                "Action": "sqs:SendMessage",
                "Resource": queue,
                "Condition": {
                    "ArnLike": {"aws:SourceArn": f"arn:aws:s3:::{name}-uploads"},
                    "StringEquals": {"aws:SourceAccount": ACCOUNT},
                },
            }
        ]
    }
    from_uploads = {"aws:SourceArn": f"arn:aws:s3:::{name}-uploads", "aws:SourceAccount": ACCOUNT}
    from_other = {"aws:SourceArn": f"arn:aws:s3:::{name}-other", "aws:SourceAccount": ACCOUNT}
    assert evaluate_service_principal(
        queue_policy, action="sqs:SendMessage", resource=queue, context=from_uploads
    ).allowed
    assert not evaluate_service_principal(
        queue_policy, action="sqs:SendMessage", resource=queue, context=from_other
    ).allowed
    assert not evaluate_service_principal(
        queue_policy, service="sns.amazonaws.com", action="sqs:SendMessage", resource=queue, context=from_uploads
    ).allowed


def test_with_enforcement_off_everything_passes_and_a_warning_is_printed_once() -> None:
    lines: list[str] = []
    store = IdentityStore()
    enforcer = IamEnforcer(store, enabled=False, log=lines.append)
    nobody = store.role(
        "Nobody", {"p": {"Statement": [{"Effect": "Deny", "Action": "*", "Resource": "*"}]}}, session_name="x"
    )
    assert enforcer.authorize(nobody, "s3:GetObject", "arn:aws:s3:::b/k").allowed
    assert enforcer.check("GET", "/b/k", "", {"host": "localhost"}, b"", "s3") is None
    assert lines == [DISABLED_WARNING]
