"""The `Custom::S3BucketNotifications` resources of a template, read (CDK's bucket notifications; what their
handler does with them is servestack/local/stack/bucket_notifications.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servestack.local.cloudformation import Resolver, StackTemplate, TemplateError, logical_id_of

RESOURCE_TYPE = "Custom::S3BucketNotifications"


@dataclass(frozen=True)
class BucketNotificationsDef:
    """One `Custom::S3BucketNotifications` resource: the bucket, its configuration, the handler and its role."""

    logical_id: str
    bucket_logical_id: str
    bucket: str
    configuration: dict[str, Any]  # PutBucketNotificationConfiguration's shape already
    handler: str
    role_arn: str
    skip_destination_validation: bool


def read_bucket_notifications(template: StackTemplate, resolver: Resolver) -> list[BucketNotificationsDef]:
    """The stack's bucket-notification resources; `TemplateError` for one local mode cannot run as AWS would."""
    found = []
    for logical_id, resource in template.resources.items():
        if resource.type != RESOURCE_TYPE or not resolver.exists(resource):
            continue
        p = resource.properties
        handler_id = logical_id_of(p.get("ServiceToken"))
        handler = template.resources.get(handler_id or "")
        if handler is None or handler.type != "AWS::Lambda::Function":
            raise TemplateError(
                f"{template.name}: {logical_id}'s ServiceToken names no function of the stack ({p.get('ServiceToken')})"
            )
        if str(resolver.resolve(p.get("Managed", "true"))).lower() != "true":
            raise TemplateError(
                f"{template.name}: {logical_id}: Managed is false (a bucket the stack does not own, whose "
                "configuration the handler merges with what the bucket has): local mode applies only a stack's "
                "own buckets' configurations"
            )
        bucket_id = logical_id_of(p.get("BucketName")) or ""
        found.append(
            BucketNotificationsDef(
                logical_id=logical_id,
                bucket_logical_id=bucket_id,
                bucket=str(resolver.resolve(p["BucketName"])),
                configuration=dict(resolver.resolve(p.get("NotificationConfiguration")) or {}),
                handler=resolver.physical_name(handler.logical_id),
                role_arn=str(resolver.resolve(handler.properties["Role"])),
                skip_destination_validation=str(resolver.resolve(p.get("SkipDestinationValidation", "false"))).lower()
                == "true",
            )
        )
    return found
