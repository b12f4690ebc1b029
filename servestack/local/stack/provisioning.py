"""Create what the templates declare on the emulator, the way CloudFormation would, and refuse what
CloudFormation (or the service behind it) would refuse.

Order follows the templates' references: buckets, then queues (dead-letter queues first, since a redrive
policy names its DLQ's ARN), tables, topics and their subscriptions, then bucket notifications (whose
destination queue must exist and let S3 send to it: S3 checks that when the notification is put, and so do
we), then the IAM roles and their policies. Every call is idempotent, so a restart on the same emulator (or
on a restored snapshot) converges instead of failing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from servestack.local.stack.topology import BucketDef, QueueDef, StackTopology, TableDef, TopicDef


class ProvisionError(RuntimeError):
    """A resource AWS would refuse to create as the template declares it; the message says which and why."""


# A check that the queue's resource policy lets a service principal send to it (the IAM engine provides it):
# (queue ARN, service principal, source ARN, source account) -> allowed.
PrincipalCheck = Callable[[str, str, str, str], bool]


@dataclass
class Provisioned:
    queue_urls: dict[str, str] = field(default_factory=dict)  # queue ARN -> URL on the emulator
    created: list[str] = field(default_factory=list)


def _code(error: Exception) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", type(error).__name__))


def ensure_bucket(s3: Any, bucket: BucketDef | str, *, versioned: bool = False) -> None:
    name = bucket if isinstance(bucket, str) else bucket.name
    versioned = versioned if isinstance(bucket, str) else bucket.versioned
    try:
        s3.head_bucket(Bucket=name)
    except Exception as error:
        if _code(error) not in ("404", "NoSuchBucket", "NotFound"):
            raise
        s3.create_bucket(Bucket=name)
    if versioned:
        s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})


def ensure_queue(sqs: Any, queue: QueueDef) -> str:
    attributes = {k: v for k, v in queue.attributes.items() if k != "FifoQueue"}
    create: dict[str, Any] = {"QueueName": queue.name}
    if queue.attributes.get("FifoQueue") == "true":
        create["Attributes"] = {"FifoQueue": "true"}
    url = str(sqs.create_queue(**create)["QueueUrl"])
    if attributes:
        sqs.set_queue_attributes(QueueUrl=url, Attributes=attributes)
    return url


def ensure_table(dynamodb: Any, table: TableDef) -> None:
    try:
        dynamodb.create_table(**table.create)
    except Exception as error:
        if _code(error) != "ResourceInUseException":
            raise
    dynamodb.get_waiter("table_exists").wait(TableName=table.name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    if table.ttl_attribute:
        current = dynamodb.describe_time_to_live(TableName=table.name)["TimeToLiveDescription"]
        if current.get("TimeToLiveStatus") != "ENABLED":
            dynamodb.update_time_to_live(
                TableName=table.name, TimeToLiveSpecification={"Enabled": True, "AttributeName": table.ttl_attribute}
            )


def ensure_topic(sns: Any, topic: TopicDef) -> None:
    arn = sns.create_topic(Name=topic.name)["TopicArn"]
    existing = {
        (s["Protocol"], s["Endpoint"]) for s in sns.list_subscriptions_by_topic(TopicArn=arn).get("Subscriptions", [])
    }
    for protocol, endpoint, raw in topic.subscriptions:
        if (protocol, endpoint) in existing:
            continue
        attributes = {"RawMessageDelivery": "true"} if raw else {}
        sns.subscribe(TopicArn=arn, Protocol=protocol, Endpoint=endpoint, Attributes=attributes)


def _dead_letters_first(queues: list[QueueDef]) -> list[QueueDef]:
    targets = {q.dead_letter_arn for q in queues if q.dead_letter_arn}
    return sorted(queues, key=lambda q: q.arn not in targets)


def apply_notifications(s3: Any, bucket: BucketDef, account: str, may_send: PrincipalCheck | None) -> None:
    """S3's PutBucketNotificationConfiguration, with its destination check: a queue must exist and its
    policy must let `s3.amazonaws.com` send messages from this bucket."""
    if not bucket.notifications:
        return
    if may_send is not None:
        refused = [
            item["QueueArn"]
            for item in bucket.notifications.get("QueueConfigurations", [])
            if not may_send(item["QueueArn"], "s3.amazonaws.com", bucket.arn, account)
        ]
        if refused:
            # S3's wording (InvalidArgument), e.g. in aws-cdk issue threads about bucket notifications.
            raise ProvisionError(
                f"bucket {bucket.name}: Unable to validate the following destination configurations "
                f"({', '.join(refused)}): the queue policy does not let s3.amazonaws.com send messages from "
                f"{bucket.arn}. Grant it in the construct (e.g. `bucket.add_event_notification(..., "
                "SqsDestination(queue))` adds that policy)."
            )
    s3.put_bucket_notification_configuration(Bucket=bucket.name, NotificationConfiguration=bucket.notifications)


def ensure_roles(iam: Any, topology: StackTopology) -> None:
    """The roles and their inline policies on the emulator's IAM, so `aws iam get-role` shows what the
    functions run as (the enforcement itself uses the same documents: servestack/local/iam)."""
    for role in topology.roles.values():
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": list(role.trusted_services)}, "Action": "sts:AssumeRole"}
            ],
        }
        try:
            iam.create_role(RoleName=role.name, AssumeRolePolicyDocument=json.dumps(trust))
        except Exception as error:
            if _code(error) != "EntityAlreadyExists":
                raise
        for index, document in enumerate(role.policies):
            iam.put_role_policy(RoleName=role.name, PolicyName=f"policy-{index}", PolicyDocument=json.dumps(document))


def provision(
    clients: dict[str, Any],
    topologies: list[StackTopology],
    *,
    account: str,
    may_send: PrincipalCheck | None = None,
    visibility_timeout_sec: int | None = None,
) -> Provisioned:
    done = Provisioned()
    for topology in topologies:
        for bucket in topology.buckets.values():
            ensure_bucket(clients["s3"], bucket)
            done.created.append(f"s3://{bucket.name}")
        for queue in _dead_letters_first(list(topology.queues.values())):
            if visibility_timeout_sec is not None and "RedrivePolicy" in queue.attributes:
                queue = QueueDef(
                    queue.logical_id, queue.name, queue.url, queue.arn,
                    {**queue.attributes, "VisibilityTimeout": str(visibility_timeout_sec)}, queue.dead_letter_arn,
                )  # fmt: skip
            done.queue_urls[queue.arn] = ensure_queue(clients["sqs"], queue)
            done.created.append(f"sqs:{queue.name}")
        for table in topology.tables.values():
            ensure_table(clients["dynamodb"], table)
            done.created.append(f"dynamodb:{table.name}")
        for topic in topology.topics.values():
            ensure_topic(clients["sns"], topic)
            done.created.append(f"sns:{topic.name}")
        for bucket in topology.buckets.values():
            apply_notifications(clients["s3"], bucket, account, may_send)
        ensure_roles(clients["iam"], topology)
    return done
