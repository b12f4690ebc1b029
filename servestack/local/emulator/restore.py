"""A snapshot restored into moto's stores: each saved bucket (its objects from their blobs), queue (its messages)
and table (its items), into the resources that exist by name, with a summary of what was restored."""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servestack.local.emulator.moto_stores import (
    BLOBS,
    CHUNK_BYTES,
    PARTS,
    capture_object,
    dynamo_from_json,
    key_problem,
    message_from_json,
    printable_key,
    safe_digest,
)


@dataclass
class RestoreSummary:
    """What `restore()` put back, per resource, and what it could not."""

    buckets: dict[str, int] = field(default_factory=dict)  # name -> objects restored
    created_buckets: list[str] = field(default_factory=list)  # saved buckets no template created
    queues: dict[str, int] = field(default_factory=dict)  # name -> messages restored
    tables: dict[str, int] = field(default_factory=dict)  # name -> items restored
    missing: list[str] = field(default_factory=list)  # "queue NAME" / "table NAME": saved, gone now; skipped
    unreadable: list[str] = field(default_factory=list)  # damaged parts or blobs, items that no longer fit
    saved_at: str | None = None
    seconds: float = 0.0

    def lines(self) -> list[str]:
        """What was restored and what was skipped, as lines for `local up` to print."""
        if self.saved_at is None:
            return ["emulator state: nothing saved yet, starting empty"]
        lines = [
            f"emulator state from {self.saved_at}: {sum(self.buckets.values())} objects in {len(self.buckets)} "
            f"buckets, {sum(self.queues.values())} messages in {len(self.queues)} queues, "
            f"{sum(self.tables.values())} items in {len(self.tables)} tables ({self.seconds:.2f} s)"
        ]
        if self.created_buckets:
            lines.append(f"  created buckets no template declares: {', '.join(self.created_buckets)}")
        if self.missing:
            lines.append(f"  saved but no longer in the templates (skipped): {', '.join(self.missing)}")
        lines += [f"  not restored: {problem}" for problem in self.unreadable]
        return lines


@dataclass
class StoreRestore:
    """One restore: the snapshot's directory, the region, moto's (S3, SQS, DynamoDB) backends, and the object
    identity -> blob digest cache that the restored objects fill (autosave then skips their blobs)."""

    directory: Path
    region: str
    backends: tuple[Any, Any, Any]
    blob_cache: dict[tuple[str, str, int, datetime.datetime, int], str]

    def read_part(self, kind: str, entry: dict[str, Any], summary: RestoreSummary) -> dict[str, Any] | None:
        name = str(entry.get("name"))
        digest = str(entry.get("part"))
        try:
            data = (self.directory / PARTS / safe_digest(digest)).read_bytes()
            if hashlib.sha256(data).hexdigest() != digest:
                raise ValueError("content does not match its digest")
            part: dict[str, Any] = json.loads(data)
        except (OSError, ValueError) as error:
            summary.unreadable.append(f"{kind} {name}: part {digest[:12]} ({error})")
            return None
        return part

    def bucket(self, entry: dict[str, Any], summary: RestoreSummary) -> None:
        part = self.read_part("bucket", entry, summary)
        if part is None:
            return
        s3, _, _ = self.backends
        name = part["name"]
        bucket = s3.buckets.get(name)
        if bucket is None:
            from moto.s3.exceptions import BucketAlreadyExists

            try:
                bucket = s3.create_bucket(name, self.region)
            except BucketAlreadyExists:
                summary.missing.append(f"bucket {name} (owned by another account)")
                return
            if part["versioned"]:
                bucket.versioning_status = "Enabled"
            summary.created_buckets.append(name)
        restored = 0
        for obj in part["objects"]:
            try:
                self._object(s3, name, obj)
            except (OSError, ValueError) as error:
                summary.unreadable.append(f"s3://{name}/{obj.get('key')}: {error}")
                continue
            restored += 1
        summary.buckets[name] = restored

    def _object(self, s3: Any, bucket: str, obj: dict[str, Any]) -> None:
        blob = self.directory / BLOBS / safe_digest(obj["blob"])
        if blob.stat().st_size != obj["size"]:
            raise ValueError(f"blob {obj['blob'][:12]} holds {blob.stat().st_size} bytes, expected {obj['size']}")
        with blob.open("rb") as source:
            key = s3.put_object(
                bucket,
                obj["key"],
                b"",
                storage=obj.get("storage_class"),
                etag=obj.get("etag"),
                checksum_value=obj.get("checksum_value"),
                disable_notification=True,  # a restore is not an upload: no S3 event reaches the queues twice
            )
            with key.lock:
                buffer = key._value_buffer
                buffer.seek(0)
                buffer.truncate()
                while chunk := source.read(CHUNK_BYTES):
                    buffer.write(chunk)
                key.contentsize = obj["size"]
        key.set_metadata(dict(obj.get("metadata") or {}))  # over moto's default content type
        key.checksum_algorithm = obj.get("checksum_algorithm")
        # A multipart upload's checksum is a checksum of its parts' (`...-N`): restored as a full-object one,
        # every read with checksum validation would fail. Manifests saved before the type was kept tell by the
        # value's `-N` suffix.
        value = str(obj.get("checksum_value") or "")
        key.checksum_type = obj.get("checksum_type") or ("COMPOSITE" if re.search(r"-\d+$", value) else None)
        key.last_modified = datetime.datetime.fromisoformat(obj["last_modified"])
        # Seed the digest cache: the next snapshot does not read the object's bytes again.
        self.blob_cache[capture_object(obj["key"], key).blob_cache_key(bucket)] = obj["blob"]

    def queue(self, entry: dict[str, Any], summary: RestoreSummary) -> None:
        _, sqs, _ = self.backends
        name = str(entry.get("name"))
        queue = sqs.queues.get(name)
        if queue is None:
            summary.missing.append(f"queue {name}")
            return
        part = self.read_part("queue", entry, summary)
        if part is None:
            return
        with queue._messages_lock:
            present = {message.id for message in queue._messages}
            restored = [message_from_json(saved) for saved in part["messages"] if saved["id"] not in present]
            queue._messages.extend(restored)
            queue._messages_lock.notify_all()  # long polls waiting on this queue see the messages now
        summary.queues[name] = len(restored)

    def table(self, entry: dict[str, Any], summary: RestoreSummary) -> None:
        from moto.dynamodb.models.dynamo_type import DynamoType, Item

        _, _, dynamodb = self.backends
        name = str(entry.get("name"))
        table = dynamodb.tables.get(name)
        if table is None:
            summary.missing.append(f"table {name}")
            return
        part = self.read_part("table", entry, summary)
        if part is None:
            return
        restored = 0
        for saved in part["items"]:
            attributes = {attr: dynamo_from_json(value) for attr, value in saved.items()}
            problem = key_problem(table, attributes)
            if problem:
                summary.unreadable.append(f"table {name}: item {printable_key(table, saved)}: {problem}")
                continue
            hash_value = DynamoType(attributes[table.hash_key_attr])
            if table.range_key_attr is None:
                table.items[hash_value] = Item(hash_value, None, attributes)
            else:
                range_value = DynamoType(attributes[table.range_key_attr])
                table.items[hash_value][range_value] = Item(hash_value, range_value, attributes)
            restored += 1
        summary.tables[name] = restored
