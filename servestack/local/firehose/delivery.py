"""A Firehose delivery stream to S3 and the subscription filters that feed it, read from a template
(`read_deliveries`), and played (`FirehosePlayer`): each batch of lines a log group accepted, filtered by the
subscription's pattern, decompressed and reduced to its messages as Firehose's `Decompression` and
`CloudWatchLogProcessing` processors do (here the lines are the messages already), a newline after each
(`AppendDelimiterToRecord`), and written as one object under the stream's prefix with the stream's role.

Approximated: Firehose buffers up to its interval or size; here each shipped batch (half a second of a child's
lines at most) is one object, so records reach S3 sooner. The subscription's own role (CloudWatch Logs putting
records on the stream) is not exercised: there is no stream to put to on the emulator. Only the JSON patterns
servestack writes (`{ $.a.b = "value" }`, equality on one path) are played; another pattern is reported.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from servestack.local.cloudformation import Resolver, Resource, logical_id_of

_PATTERN = re.compile(r'^\{\s*\$\.([A-Za-z0-9_.]+)\s*=\s*"([^"]*)"\s*\}$')
_TIMESTAMP = re.compile(r"!\{timestamp:([^}]*)\}")
# Java's date pattern letters Firehose's prefixes use, in strftime's terms.
_JAVA_DATE = (("yyyy", "%Y"), ("MM", "%m"), ("dd", "%d"), ("HH", "%H"), ("mm", "%M"), ("ss", "%S"))


@dataclass(frozen=True)
class DeliveryDef:
    """A DirectPut stream to S3 and the log groups subscribed to it with a pattern local mode plays."""

    logical_id: str
    name: str
    bucket: str
    prefix: str  # Firehose's prefix, `!{timestamp:...}` expressions unevaluated
    extension: str  # FileExtension (`.jsonl`), '' for none
    role: str  # the stream's role (logical id): it writes the objects
    groups: tuple[str, ...]  # the log groups whose subscription filters name it
    path: tuple[str, ...]  # the pattern `{ $.a.b = "value" }`: ("a", "b")
    value: str


def read_deliveries(resolver: Resolver, resources: Sequence[Resource]) -> tuple[list[DeliveryDef], list[str]]:
    """The deliveries local mode plays, and why any subscription is not played."""
    streams = {r.logical_id: r for r in resources if r.type == "AWS::KinesisFirehose::DeliveryStream"}
    subscribed: dict[str, list[tuple[str, str]]] = {}
    refused: list[str] = []
    for res in resources:
        if res.type != "AWS::Logs::SubscriptionFilter":
            continue
        target = logical_id_of(res.properties.get("DestinationArn"))
        pattern = str(resolver.resolve(res.properties.get("FilterPattern", "")))
        if target is None or target not in streams:
            refused.append(f"{res.logical_id}: its destination is not a Firehose stream of the stack")
        elif not _PATTERN.match(pattern):
            refused.append(f"{res.logical_id}: the pattern {pattern!r} is not one local mode plays")
        else:
            subscribed.setdefault(target, []).append((str(resolver.resolve(res.properties["LogGroupName"])), pattern))
    found: list[DeliveryDef] = []
    for logical_id, subscriptions in subscribed.items():
        props = resolver.resolve(streams[logical_id].properties)
        destination = props.get("ExtendedS3DestinationConfiguration") or {}
        role = logical_id_of(streams[logical_id].properties["ExtendedS3DestinationConfiguration"]["RoleARN"])
        if role is None:
            refused.append(f"{logical_id}: its role is not one of the stack's")
            continue
        patterns = {pattern for _, pattern in subscriptions}
        if len(patterns) != 1:
            refused.append(f"{logical_id}: its subscriptions use several patterns")
            continue
        matched = _PATTERN.match(patterns.pop())
        assert matched is not None
        found.append(
            DeliveryDef(
                logical_id=logical_id,
                name=str(props.get("DeliveryStreamName") or resolver.physical_name(logical_id)),
                bucket=str(destination["BucketARN"]).split(":::", 1)[1],
                prefix=str(destination.get("Prefix", "")),
                extension=str(destination.get("FileExtension", "")),
                role=role,
                groups=tuple(group for group, _ in subscriptions),
                path=tuple(matched.group(1).split(".")),
                value=matched.group(2),
            )
        )
    return found, refused


def evaluate_prefix(prefix: str, now: datetime) -> str:
    """Firehose's `!{timestamp:yyyy/MM/dd/HH}` expressions, evaluated at `now` (UTC)."""

    def date(match: re.Match[str]) -> str:
        pattern = match.group(1)
        for java, strftime in _JAVA_DATE:
            pattern = pattern.replace(java, strftime)
        return now.strftime(pattern)

    return _TIMESTAMP.sub(date, prefix)


class FirehosePlayer:
    """One stream: call it with the lines a subscribed log group accepted."""

    def __init__(self, delivery: DeliveryDef, s3: Any, report: Callable[[str], None]) -> None:
        self.delivery = delivery
        self.s3 = s3  # an S3 client signing as the stream's role
        self.report = report
        self.refused: str | None = None
        self.delivered = 0  # records written

    def selects(self, line: str) -> bool:
        try:
            value: Any = json.loads(line)
        except ValueError:
            return False
        for key in self.delivery.path:
            if not isinstance(value, dict) or key not in value:
                return False
            value = value[key]
        return isinstance(value, str | int | float) and str(value) == self.delivery.value

    def __call__(self, lines: Sequence[str]) -> None:
        records = [line for line in lines if self.selects(line)]
        if not records:
            return
        now = datetime.now(UTC)
        key = (
            f"{evaluate_prefix(self.delivery.prefix, now)}{self.delivery.name}-1-"
            f"{now.strftime('%Y-%m-%d-%H-%M-%S')}-{uuid.uuid4()}{self.delivery.extension}"
        )
        body = "".join(f"{line}\n" for line in records).encode()
        try:
            self.s3.put_object(Bucket=self.delivery.bucket, Key=key, Body=body)
        except Exception as error:  # AWS would retry, then write to the error prefix; reported once here
            if self.refused is None:
                self.refused = str(getattr(error, "response", {}).get("Error", {}).get("Message", error))
                self.report(
                    f"Firehose {self.delivery.name} cannot write s3://{self.delivery.bucket}/{key}: {self.refused}"
                )
            return
        self.delivered += len(records)


# How local mode plays each of the types (`local up --explain`).
FIREHOSE_TYPES: dict[str, str] = {
    "AWS::KinesisFirehose::DeliveryStream": "played: the lines its subscriptions select, written to its S3 prefix "
    "with its role, an object per shipped batch (no 60 s buffering)",
    "AWS::Logs::SubscriptionFilter": "played: the lines of the group that its pattern selects go to its Firehose "
    "stream",
}
