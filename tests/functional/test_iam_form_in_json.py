"""Issue 37, finding 1: a JSON-protocol body holding form-like text (`a&Action=DeleteQueue&b`) is one call, the
one the enforcer authorized. Replayed over HTTP against the enforced moto server with boto3 clients of a role
shaped like the async submit role (only `sqs:SendMessage` on its queue, `dynamodb:GetItem`/`PutItem` on its
table, `logs:PutLogEvents` on its group): before the fix moto read the body as a form, took its `Action`
over `X-Amz-Target`, and deleted the queue, the table, another log group.

Each test sends the call as boto3 sends it, and as a gzip body (botocore compresses some requests, and moto
decompresses any), and checks that the call did what was asked and nothing else survived the trick.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import httpx
import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from servestack.local.iam import IamEnforcer, Identity, IdentityStore
from servestack.local.iam.server import EnforcedMotoServer

ACCOUNT = "123456789012"
REGION = "us-east-1"


@dataclass
class Emulator:
    url: str
    store: IdentityStore
    developer: Identity

    def client(self, service: str, identity: Identity | None = None) -> Any:
        who = identity or self.developer
        session = boto3.Session(
            aws_access_key_id=who.access_key_id,
            aws_secret_access_key=who.secret_access_key,
            aws_session_token=who.session_token,
            region_name=REGION,
        )
        return session.client(service, endpoint_url=self.url, config=Config(retries={"max_attempts": 1}))


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    store = IdentityStore()
    developer = store.developer()
    server = EnforcedMotoServer(IamEnforcer(store, log=lambda line: None)).start()
    yield Emulator(server.url, store, developer)
    server.stop()


@dataclass
class Submit:
    """The async submit role's resources, and the role."""

    queue_url: str
    table: str
    group: str
    other_group: str
    role: Identity


@pytest.fixture
def submit(emulator: Emulator) -> Submit:
    name = f"f1-{uuid.uuid4().hex[:10]}"
    sqs, ddb, logs = (emulator.client(service) for service in ("sqs", "dynamodb", "logs"))
    queue_url = sqs.create_queue(QueueName=f"{name}-jobs")["QueueUrl"]
    ddb.create_table(
        TableName=f"{name}-jobs",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for group in (f"/{name}/submit", f"/{name}/other"):
        logs.create_log_group(logGroupName=group)
        logs.create_log_stream(logGroupName=group, logStreamName="s")
    statements = [
        {"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}-jobs"},
        {
            "Effect": "Allow",
            "Action": ["dynamodb:GetItem", "dynamodb:PutItem"],
            "Resource": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}-jobs",
        },
        {
            "Effect": "Allow",
            "Action": "logs:PutLogEvents",
            "Resource": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/{name}/submit:log-stream:*",
        },
    ]
    role = emulator.store.role(
        f"{name}-submit", {"Policy": {"Version": "2012-10-17", "Statement": statements}}, session_name="submit"
    )
    return Submit(queue_url, f"{name}-jobs", f"/{name}/submit", f"/{name}/other", role)


def send_gzip(emulator: Emulator, identity: Identity, service: str, target: str, params: dict[str, Any]) -> int:
    """A JSON-protocol call with a gzip body (`Content-Encoding: gzip`), signed as `identity`."""
    body = gzip.compress(json.dumps(params).encode())
    version = "1.1" if target.startswith("Logs_") else "1.0"
    headers = {
        "Content-Type": f"application/x-amz-json-{version}",
        "X-Amz-Target": target,
        "Content-Encoding": "gzip",
        "X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest(),
    }
    request = AWSRequest(method="POST", url=f"{emulator.url}/", data=body, headers=headers)
    credentials = Credentials(identity.access_key_id, identity.secret_access_key, identity.session_token)
    SigV4Auth(credentials, service, REGION).add_auth(request)
    return httpx.post(f"{emulator.url}/", content=body, headers=dict(request.headers.items())).status_code


def queue_exists(emulator: Emulator, url: str) -> bool:
    return url in emulator.client("sqs").list_queues().get("QueueUrls", [])


def table_exists(emulator: Emulator, table: str) -> bool:
    return table in emulator.client("dynamodb").list_tables()["TableNames"]


def groups(emulator: Emulator, prefix: str) -> list[str]:
    found = emulator.client("logs").describe_log_groups(logGroupNamePrefix=prefix)["logGroups"]
    return sorted(group["logGroupName"] for group in found)


@pytest.mark.parametrize("body", ['{"note": "a&Action=DeleteQueue&b"}', "price=3&Action=DeleteQueue"])
def test_a_message_body_naming_another_action_is_only_sent(emulator: Emulator, submit: Submit, body: str) -> None:
    # WHEN the submit role sends a message whose body holds `&Action=DeleteQueue&`
    sqs = emulator.client("sqs", submit.role)
    sqs.send_message(QueueUrl=submit.queue_url, MessageBody=body)
    # THEN the queue is still there, holding that message as sent
    assert queue_exists(emulator, submit.queue_url)
    received = emulator.client("sqs").receive_message(QueueUrl=submit.queue_url, WaitTimeSeconds=0)["Messages"]
    assert [message["Body"] for message in received] == [body]


def test_a_gzip_message_body_naming_another_action_is_only_sent(emulator: Emulator, submit: Submit) -> None:
    params = {"QueueUrl": submit.queue_url, "MessageBody": '{"note": "a&Action=DeleteQueue&b"}'}
    status = send_gzip(emulator, submit.role, "sqs", "AmazonSQS.SendMessage", params)
    assert status == 200
    assert queue_exists(emulator, submit.queue_url)


def test_a_key_value_naming_another_action_only_reads_the_item(emulator: Emulator, submit: Submit) -> None:
    # WHEN the submit role reads an item whose key value is `x&Action=DeleteTable&y`
    ddb = emulator.client("dynamodb", submit.role)
    ddb.put_item(TableName=submit.table, Item={"id": {"S": "x&Action=DeleteTable&y"}, "n": {"N": "1"}})
    item = ddb.get_item(TableName=submit.table, Key={"id": {"S": "x&Action=DeleteTable&y"}})["Item"]
    # THEN it gets the item, and the table is still there
    assert item["n"] == {"N": "1"}
    assert table_exists(emulator, submit.table)
    # AND the same as a gzip body
    key = {"TableName": submit.table, "Key": {"id": {"S": "x&Action=DeleteTable&y"}}}
    assert send_gzip(emulator, submit.role, "dynamodb", "DynamoDB_20120810.GetItem", key) == 200
    assert table_exists(emulator, submit.table)


def test_a_log_message_naming_another_group_only_writes_to_its_own(emulator: Emulator, submit: Submit) -> None:
    # WHEN the submit role puts a log event whose message names DeleteLogGroup and another group
    logs = emulator.client("logs", submit.role)
    message = f"&Action=DeleteLogGroup&logGroupName={submit.other_group}"
    event = {"timestamp": int(time.time() * 1000), "message": message}
    logs.put_log_events(logGroupName=submit.group, logStreamName="s", logEvents=[event])
    params = {"logGroupName": submit.group, "logStreamName": "s", "logEvents": [event]}
    assert send_gzip(emulator, submit.role, "logs", "Logs_20140328.PutLogEvents", params) == 200
    # THEN both groups are still there, and the message is in the role's own group
    prefix = submit.group.rsplit("/", 1)[0]
    assert groups(emulator, prefix) == sorted([submit.group, submit.other_group])
    read = emulator.client("logs").get_log_events(logGroupName=submit.group, logStreamName="s", startFromHead=True)
    events = read["events"]
    assert [e["message"] for e in events] == [message, message]


@pytest.mark.parametrize("content_type", ["text/plain", "application/json"])
def test_a_query_call_whose_action_is_only_in_a_body_that_is_not_a_form_is_refused(
    emulator: Emulator, content_type: str
) -> None:
    # GIVEN a role allowed every SNS call but DeleteTopic, and a topic
    name = f"f1-{uuid.uuid4().hex[:10]}"
    sns = emulator.client("sns")
    arn = sns.create_topic(Name=name)["TopicArn"]
    statement = {"Effect": "Allow", "NotAction": "sns:DeleteTopic", "Resource": "*"}
    role = emulator.store.role(
        f"{name}-sns", {"Policy": {"Version": "2012-10-17", "Statement": [statement]}}, session_name="s"
    )
    # WHEN it signs a call whose body, not a form by its content type, reads `Action=DeleteTopic&TopicArn=...`
    body = f"Action=DeleteTopic&TopicArn={arn}".encode()
    request = AWSRequest(method="POST", url=f"{emulator.url}/", data=body, headers={"Content-Type": content_type})
    SigV4Auth(Credentials(role.access_key_id, role.secret_access_key, role.session_token), "sns", REGION).add_auth(
        request
    )
    answer = httpx.post(f"{emulator.url}/", content=body, headers=dict(request.headers.items()))
    # THEN the query protocol's MissingAction (the form names no action), and the topic is still there
    assert answer.status_code == 400, answer.text
    assert "<Code>MissingAction</Code>" in answer.text
    assert arn in [topic["TopicArn"] for topic in sns.list_topics()["Topics"]]


def test_an_s3_delete_whose_body_reads_as_a_version_deletes_no_version(emulator: Emulator) -> None:
    # GIVEN a versioned bucket holding two versions of a key, and a role with s3:DeleteObject but not
    # s3:DeleteObjectVersion (deleting marks the key deleted; its versions stay)
    name = f"f1-{uuid.uuid4().hex[:10]}"
    s3 = emulator.client("s3")
    s3.create_bucket(Bucket=name)
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    first = s3.put_object(Bucket=name, Key="k", Body=b"1")["VersionId"]
    s3.put_object(Bucket=name, Key="k", Body=b"2")
    statement = {"Effect": "Allow", "Action": "s3:DeleteObject", "Resource": f"arn:aws:s3:::{name}/*"}
    role = emulator.store.role(
        f"{name}-del", {"Policy": {"Version": "2012-10-17", "Statement": [statement]}}, session_name="s"
    )
    # WHEN it deletes the key with a form body reading `versionId=<the first version>`
    body = f"versionId={first}".encode()
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest(),
    }
    request = AWSRequest(method="DELETE", url=f"{emulator.url}/{name}/k", data=body, headers=headers)
    S3SigV4Auth(Credentials(role.access_key_id, role.secret_access_key, role.session_token), "s3", REGION).add_auth(
        request
    )
    answer = httpx.request("DELETE", f"{emulator.url}/{name}/k", content=body, headers=dict(request.headers.items()))
    # THEN it is the DeleteObject authorized: a delete marker, both versions kept
    assert answer.status_code == 204, answer.text
    versions = s3.list_object_versions(Bucket=name)
    assert sorted(v["VersionId"] for v in versions["Versions"]).count(first) == 1
    assert len(versions["Versions"]) == 2
    assert len(versions.get("DeleteMarkers", [])) == 1
