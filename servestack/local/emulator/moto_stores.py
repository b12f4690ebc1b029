"""moto's S3, SQS and DynamoDB stores as a snapshot sees them: what is captured of each bucket, object, queue
and table, read from moto's own structures (checked against the moto version they were written for), and the JSON
forms of messages and items; the files a snapshot writes."""

from __future__ import annotations

import base64
import datetime
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servestack.inference.errors import ConfigurationError

PARTS = "parts"
BLOBS = "blobs"
TEMPORARY_MARK = ".tmp-"
CHUNK_BYTES = 8 * 1024 * 1024


# ------------------------------------------------------------------------------------------- captures
# A capture is what the backends held at one moment, read in memory without I/O. Two equal captures in a
# row mean nothing changed in between; autosave compares a fresh capture with the last saved one.


@dataclass(frozen=True)
class ObjectCapture:
    key: str
    size: int
    last_modified: datetime.datetime
    identity: int  # id() of moto's FakeKey: every PUT creates a new one
    etag: str | None
    metadata: tuple[tuple[str, str], ...]
    storage_class: str | None
    checksum_algorithm: str | None
    checksum_value: str | None
    checksum_type: str | None  # COMPOSITE for a multipart upload's (a checksum of its parts' checksums)
    fake_key: Any = field(compare=False, repr=False)

    def blob_cache_key(self, bucket: str) -> tuple[str, str, int, datetime.datetime, int]:
        return (bucket, self.key, self.size, self.last_modified, self.identity)

    def manifest_entry(self, blob: str) -> dict[str, Any]:
        return {
            "key": self.key,
            "blob": blob,
            "size": self.size,
            "etag": self.etag,
            "last_modified": self.last_modified.isoformat(),
            "metadata": dict(self.metadata),
            "storage_class": self.storage_class,
            "checksum_algorithm": self.checksum_algorithm,
            "checksum_value": self.checksum_value,
            "checksum_type": self.checksum_type,
        }


@dataclass(frozen=True)
class BucketCapture:
    name: str
    versioned: bool
    objects: tuple[ObjectCapture, ...]


@dataclass
class QueueCapture:
    name: str
    messages: list[dict[str, Any]]  # JSON-ready already


@dataclass
class TableCapture:
    name: str
    items: list[dict[str, Any]]  # DynamoDB JSON, binary values in base64


@dataclass
class Capture:
    buckets: list[BucketCapture]
    queues: list[QueueCapture]
    tables: list[TableCapture]


class KeyGone(Exception):
    """An S3 object was replaced or deleted while its bytes were being copied."""


# ------------------------------------------------------------------------------------ moto structures

_moto_checked = False


def check_moto() -> None:
    """Fail with a clear message when the installed moto lacks the attributes this module reads and writes.

    They are private parts of moto (checked against 5.2.x); an upgrade that renames one would otherwise fail
    half-way through a snapshot with an AttributeError, or not at all.
    """
    global _moto_checked
    if _moto_checked:
        return
    import moto
    from moto.dynamodb.models.table import Table
    from moto.s3.models import FakeBucket, FakeKey
    from moto.sqs.models import Message, Queue

    key = FakeKey("probe", b"", account_id="123456789012", region_name="us-east-1")
    queue_class: Any = Queue  # concrete at run time; typed abstract (CloudFormationModel)
    table_class: Any = Table
    samples = {
        "S3 object": (key, ("_value_buffer", "lock", "disposed", "contentsize", "_etag", "_metadata", "last_modified")),
        "S3 bucket": (FakeBucket, ("is_versioned",)),  # a real one would claim its name in every account
        "SQS queue": (
            queue_class("probe", region="us-east-1", account_id="123456789012"),
            ("_messages", "_messages_lock"),
        ),
        "SQS message": (Message("probe", ""), ("approximate_receive_count", "visible_at", "delayed_until")),
        "DynamoDB table": (
            table_class(
                "probe",
                "123456789012",
                "us-east-1",
                [{"AttributeName": "k", "KeyType": "HASH"}],
                [{"AttributeName": "k", "AttributeType": "S"}],
            ),
            ("items", "hash_key_attr", "hash_key_type", "range_key_attr", "range_key_type"),
        ),
    }
    missing = [
        f"{what}.{name}" for what, (sample, names) in samples.items() for name in names if not hasattr(sample, name)
    ]
    key.dispose()
    if missing:
        raise ConfigurationError(
            f"emulator state: moto {moto.__version__} lacks {', '.join(missing)}; servestack's persistence was "
            "written for moto 5.2.x",
            field="moto",
            value=moto.__version__,
            allowed="moto 5.2.x",
        )
    _moto_checked = True


def read_chunk(fake_key: Any, offset: int) -> bytes:
    with fake_key.lock:
        if fake_key.disposed:
            raise KeyGone
        try:
            buffer = fake_key._value_buffer
            buffer.seek(offset)
            chunk: bytes = buffer.read(CHUNK_BYTES)
        except ValueError:  # closed by dispose() between the check and the read
            raise KeyGone from None
    return chunk


def capture_object(name: str, fake_key: Any) -> ObjectCapture:
    metadata = fake_key._metadata
    return ObjectCapture(
        key=name,
        size=int(fake_key.contentsize),
        last_modified=fake_key.last_modified,
        identity=id(fake_key),
        etag=fake_key._etag,
        # moto's LowercaseDict keeps a plain dict in `store`; reading it directly is ~5x cheaper per check.
        metadata=tuple(getattr(metadata, "store", metadata).items()),
        storage_class=fake_key.storage_class,
        checksum_algorithm=fake_key.checksum_algorithm,
        checksum_value=fake_key.checksum_value,
        checksum_type=getattr(fake_key, "checksum_type", None),
        fake_key=fake_key,
    )


def capture_bucket(name: str, bucket: Any) -> BucketCapture:
    from moto.s3.models import FakeKey

    objects = []
    for key_name, versions in sorted(dict.items(bucket.keys)):  # the raw lists, without moto's per-key copies
        latest = versions[-1] if versions else None
        if isinstance(latest, FakeKey):  # a delete marker means the key is deleted
            objects.append(capture_object(key_name, latest))
    return BucketCapture(name, bucket.versioning_status == "Enabled", tuple(objects))


def capture_queue(name: str, queue: Any) -> QueueCapture:
    with queue._messages_lock:
        messages = list(queue._messages)
    return QueueCapture(name, [message_to_json(message) for message in messages])


def capture_table(name: str, table: Any) -> TableCapture:
    items: list[dict[str, Any]] = []
    for stored in list(table.items.values()):
        # Tables with a range key hold {range: Item} per hash key (possibly empty: moto's defaultdict).
        for item in list(stored.values()) if isinstance(stored, dict) else [stored]:
            items.append({attr: dynamo_to_json(value) for attr, value in list(item.attrs.items())})
    return TableCapture(name, items)


def message_to_json(message: Any) -> dict[str, Any]:
    return {
        "id": message.id,
        "body": message.body,
        "message_attributes": bytes_to_json(message.message_attributes),
        "system_attributes": bytes_to_json(message.system_attributes),
        "sender_id": message.sender_id,
        "sent_timestamp": message.sent_timestamp,
        "first_receive_timestamp": message.approximate_first_receive_timestamp,
        "receive_count": message.approximate_receive_count,
        "deduplication_id": message.deduplication_id,
        "group_id": message.group_id,
        "sequence_number": message.sequence_number,
        "delayed_until": message.delayed_until,
    }


def message_from_json(saved: dict[str, Any]) -> Any:
    from moto.sqs.models import Message

    message = Message(saved["id"], saved["body"], bytes_from_json(saved["system_attributes"]) or None)
    message.message_attributes = bytes_from_json(saved["message_attributes"])
    message.sender_id = saved["sender_id"]
    message.sent_timestamp = saved["sent_timestamp"]
    message.approximate_first_receive_timestamp = saved["first_receive_timestamp"]
    message.approximate_receive_count = saved["receive_count"]
    message.deduplication_id = saved["deduplication_id"]
    message.group_id = saved["group_id"]
    message.sequence_number = saved["sequence_number"]
    message.delayed_until = saved["delayed_until"]
    message.visible_at = 0.0  # in flight when saved: visible again, as after its visibility timeout
    return message


_BYTES_TAG = "$base64"


def bytes_to_json(value: Any) -> Any:
    """Message attributes hold bytes (BinaryValue); JSON holds them as {"$base64": "..."}."""
    if isinstance(value, bytes):
        return {_BYTES_TAG: base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {str(k): bytes_to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [bytes_to_json(v) for v in value]
    return value


def bytes_from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_BYTES_TAG}:
            return base64.b64decode(value[_BYTES_TAG])
        return {k: bytes_from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [bytes_from_json(v) for v in value]
    return value


def dynamo_to_json(value: Any) -> dict[str, Any]:
    """moto's DynamoType as DynamoDB JSON; binary values (bytes in moto) as base64, as on the wire."""
    kind, inner = value.type, value.value
    if kind in _PLAIN_TYPES:  # the common case first: this runs for every attribute at every autosave check
        return {kind: inner}
    if kind == "M":
        return {kind: {k: dynamo_to_json(v) for k, v in inner.items()}}
    if kind == "L":
        return {kind: [dynamo_to_json(v) for v in inner]}
    if kind == "B":
        return {kind: base64_text(inner)}
    if kind == "BS":
        return {kind: [base64_text(v) for v in inner]}
    return {kind: list(inner)}  # SS, NS: a copy, so that a later change in moto is not shared


_PLAIN_TYPES = frozenset({"S", "N", "BOOL", "NULL"})


def dynamo_from_json(value: dict[str, Any]) -> dict[str, Any]:
    ((kind, inner),) = value.items()
    if kind == "M":
        return {kind: {k: dynamo_from_json(v) for k, v in inner.items()}}
    if kind == "L":
        return {kind: [dynamo_from_json(v) for v in inner]}
    if kind == "B":
        return {kind: base64.b64decode(inner)}
    if kind == "BS":
        return {kind: [base64.b64decode(v) for v in inner]}
    return {kind: inner}


def base64_text(value: bytes | str) -> str:
    return base64.b64encode(value).decode() if isinstance(value, bytes) else value  # str: base64 already


def key_problem(table: Any, attributes: dict[str, Any]) -> str | None:
    """Why an item cannot go into `table` (whose key schema may have changed since the snapshot)."""
    for attr, expected in ((table.hash_key_attr, table.hash_key_type), (table.range_key_attr, table.range_key_type)):
        if attr is None:
            continue
        if attr not in attributes:
            return f"has no key attribute {attr!r}"
        actual = next(iter(attributes[attr]))
        if actual != expected:
            return f"key attribute {attr!r} is of type {actual}, the table's key is {expected}"
    return None


def printable_key(table: Any, saved: dict[str, Any]) -> str:
    return json.dumps({a: saved.get(a) for a in (table.hash_key_attr, table.range_key_attr) if a})[:120]


# ------------------------------------------------------------------------------------------ files


def canonical_json(value: Any, indent: int | None = None) -> bytes:
    separators = (",", ":") if indent is None else (",", ": ")
    return json.dumps(value, sort_keys=True, separators=separators, indent=indent, ensure_ascii=False).encode()


def write_atomically(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never a part: write aside, then rename over."""
    temporary = path.with_name(f"{path.name}{TEMPORARY_MARK}{uuid.uuid4().hex}")
    try:
        temporary.write_bytes(data)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def safe_digest(digest: str) -> str:
    """A manifest names parts and blobs by hex digest; anything else (a path) is refused."""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"{digest[:80]!r} is not a SHA-256 digest")
    return digest
