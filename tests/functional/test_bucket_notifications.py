"""CDK's bucket-notification handler as local up runs it (servestack/local/stack/bucket_notifications.py): the bucket's
configuration put on the emulator's S3 (moto over HTTP, IAM enforced) with the handler role's keys, refused as
AWS refuses it when the role lacks `s3:PutBucketNotification`."""

from __future__ import annotations

import json
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from servestack.local.cloudformation import ACCOUNT
from servestack.local.emulator import EmbeddedEmulator, client_as
from servestack.local.iam.access import LocalAccess
from servestack.local.stack.bucket_notifications import BucketNotifications, BucketNotificationsDef, HandlerRefused
from servestack.local.stack.topology import StackTopology

REGION = "us-east-1"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/stack-BucketNotificationsHandlerRole-ABC"


@pytest.fixture
def world() -> Iterator[tuple[LocalAccess, str]]:
    access = LocalAccess(log=lambda _: None, region=REGION)
    emulator = EmbeddedEmulator(middleware=access.middleware)
    try:
        yield access, emulator.url
    finally:
        emulator.stop()


def handler_statements(bucket_arn: str) -> tuple[dict[str, Any], ...]:
    """The handler role's statement as CDK writes it: s3:PutBucketNotification on the bucket."""
    statement = {"Effect": "Allow", "Action": "s3:PutBucketNotification", "Resource": bucket_arn}
    return ({"Version": "2012-10-17", "Statement": [statement]},)


def deployed(access: LocalAccess, url: str) -> tuple[BucketNotificationsDef, str]:
    """A bucket and a job queue whose policy lets S3 send from it (as the template creates them), and the
    stack's notification resource: uploads under `uploads/` go to the queue."""
    developer = {s: client_as(s, url, access.developer, REGION) for s in ("s3", "sqs")}
    bucket = f"artifacts-{uuid.uuid4().hex[:8]}"
    developer["s3"].create_bucket(Bucket=bucket)
    queue_url = developer["sqs"].create_queue(QueueName=f"jobs-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    queue_arn = developer["sqs"].get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    access.add_resource_policies({queue_arn: [{"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Service": "s3.amazonaws.com"}, "Action": "sqs:SendMessage",
        "Resource": queue_arn, "Condition": {"ArnLike": {"aws:SourceArn": f"arn:aws:s3:::{bucket}"}},
    }]}]})  # fmt: skip
    configuration = {"QueueConfigurations": [{
        "Events": ["s3:ObjectCreated:*"], "QueueArn": queue_arn,
        "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "uploads/"}]}},
    }]}  # fmt: skip
    definition = BucketNotificationsDef("ArtifactsNotifications", "Artifacts", bucket, configuration,
                                        "stack-BucketNotificationsHandler-XYZ", ROLE, False)  # fmt: skip
    return definition, queue_url


def notifications(access: LocalAccess, url: str, definition: BucketNotificationsDef) -> BucketNotifications:
    topology = StackTopology("stack", "jobs", "async", bucket_notifications=[definition])
    keys = access.credentials_for(ROLE, handler_statements(f"arn:aws:s3:::{definition.bucket}"))
    return BucketNotifications([topology], access, emulator_url=url, region=REGION,
                               identities={ROLE.rsplit("/", 1)[-1]: keys.to_dict()})  # fmt: skip


def test_the_handler_role_puts_the_configuration_and_an_upload_reaches_the_queue(
    world: tuple[LocalAccess, str],
) -> None:
    # GIVEN the stack's notification resource and its handler role with CDK's statement
    access, url = world
    definition, queue_url = deployed(access, url)
    running = notifications(access, url, definition)
    # WHEN the handler runs, as on the stack's creation
    assert running.apply("stack", "Create") == ["ArtifactsNotifications"]
    # THEN the bucket holds the configuration and an upload under the prefix reaches the queue
    s3 = client_as("s3", url, access.developer, REGION)
    held = s3.get_bucket_notification_configuration(Bucket=definition.bucket)
    assert held["QueueConfigurations"][0]["QueueArn"] == definition.configuration["QueueConfigurations"][0]["QueueArn"]
    s3.put_object(Bucket=definition.bucket, Key="uploads/job-1.json", Body=b"{}")
    sqs = client_as("sqs", url, access.developer, REGION)
    keys: list[str] = []
    for _ in range(
        5
    ):  # an s3:TestEvent (no Records) when the configuration is put, then the upload's (key URL-encoded)
        answer = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        bodies = [json.loads(m["Body"]) for m in answer.get("Messages", [])]
        keys += [
            urllib.parse.unquote_plus(r["s3"]["object"]["key"]) for body in bodies for r in body.get("Records", [])
        ]
        if keys:
            break
    assert keys == ["uploads/job-1.json"]


def test_a_handler_role_without_its_statement_fails_the_stack_naming_the_access_denied(
    world: tuple[LocalAccess, str],
) -> None:
    # GIVEN the handler role without s3:PutBucketNotification
    access, url = world
    definition, _ = deployed(access, url)
    running = notifications(access, url, definition)
    access.credentials_for(ROLE, ())
    # WHEN the handler runs THEN the stack's create fails with S3's AccessDenied for the handler's call
    with pytest.raises(HandlerRefused) as refused:
        running.apply("stack", "Create")
    message = str(refused.value)
    assert "ArtifactsNotifications (Create)" in message
    assert "AccessDenied" in message
    assert "s3:PutBucketNotification" in message
    assert f"as role {ROLE.rsplit('/', 1)[-1]}" in message
    # AND the bucket keeps the configuration it had (none)
    s3 = client_as("s3", url, access.developer, REGION)
    assert "QueueConfigurations" not in s3.get_bucket_notification_configuration(Bucket=definition.bucket)
