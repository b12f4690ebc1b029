"""Emulator state that survives `local up` restarts: moto's S3, SQS and DynamoDB data, snapshotted to disk.

`local up` runs moto's `ThreadedMotoServer` inside its own process, so every bucket, queue and table lives
in moto's in-memory backends and dies with the process. `EmulatorState` reads those backends directly (the
embedded server shares them), which is faster than the HTTP API and sees what the API cannot, such as a
message's receive count. It was written against moto 5.2.x; the private attributes it uses are checked at
first use (`_check_moto`), so a moto upgrade that renames them fails loudly with the version in the message.

What a snapshot holds:
- every bucket (name, versioned or not) and the latest version of each key: its bytes, ETag, content type
  and other metadata, storage class, checksum, last-modified time. Older versions, delete markers, tags and
  ACLs are not kept;
- every queue's messages: body, message attributes, system attributes, sender, SentTimestamp,
  ApproximateReceiveCount, first-receive time, FIFO group / deduplication ids, delay. A message in flight
  is saved as visible, as if its visibility timeout had run out: that is what SQS does when a consumer
  dies, and receive counts are kept, so a redrive policy still moves a poison message to its DLQ after
  maxReceiveCount receives in total;
- every table's items.

On disk (`directory/`):
- `manifest.json`: the current snapshot, naming one part per resource;
- `parts/<sha256>`: JSON of one bucket's object list, one queue's messages or one table's items;
- `blobs/<sha256>`: object bodies, named by the SHA-256 of their bytes, never by their key (keys are
  untrusted paths such as `../../etc/x`; they only ever appear inside JSON).
Parts and blobs are content-addressed and written only when absent, through a temporary file and a rename,
so an autosave never rewrites an unchanged 1 GB object. The manifest is written last, also by rename: a
snapshot interrupted at any point leaves the previous manifest, and everything it names, readable. Files no
manifest references (and temporary files left by a killed snapshot) are removed after each new manifest.
Nothing is pickled. Writes are not fsynced: a snapshot survives the death of the process, not a power cut.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.errors import ConfigurationError

__all__ = ["EmulatorState", "RestoreSummary", "SnapshotSummary"]

logger = logging.getLogger(__name__)

FORMAT = "servestack-emulator-state"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PARTS = "parts"
BLOBS = "blobs"
TEMPORARY_MARK = ".tmp-"
CHUNK_BYTES = 8 * 1024 * 1024
# A snapshot whose resources changed while it was being read is read again, this many times at most, so
# that the saved queues, tables and buckets belong to one moment (a job row never outruns its message).
CAPTURE_ATTEMPTS = 4


@dataclass
class SnapshotSummary:
    """What one snapshot saved, and what it had to write (unchanged blobs and parts are not written again)."""

    buckets: int = 0
    objects: int = 0
    queues: int = 0
    messages: int = 0
    tables: int = 0
    items: int = 0
    blobs_written: int = 0
    blob_bytes_written: int = 0
    parts_written: int = 0
    seconds: float = 0.0


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


# ------------------------------------------------------------------------------------------- captures
# A capture is what the backends held at one moment, read in memory without I/O. Two equal captures in a
# row mean nothing changed in between; autosave compares a fresh capture with the last saved one.


@dataclass(frozen=True)
class _ObjectCapture:
    key: str
    size: int
    last_modified: datetime.datetime
    identity: int  # id() of moto's FakeKey: every PUT creates a new one
    etag: str | None
    metadata: tuple[tuple[str, str], ...]
    storage_class: str | None
    checksum_algorithm: str | None
    checksum_value: str | None
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
        }


@dataclass(frozen=True)
class _BucketCapture:
    name: str
    versioned: bool
    objects: tuple[_ObjectCapture, ...]


@dataclass
class _QueueCapture:
    name: str
    messages: list[dict[str, Any]]  # JSON-ready already


@dataclass
class _TableCapture:
    name: str
    items: list[dict[str, Any]]  # DynamoDB JSON, binary values in base64


@dataclass
class _Capture:
    buckets: list[_BucketCapture]
    queues: list[_QueueCapture]
    tables: list[_TableCapture]


class _KeyGone(Exception):
    """An S3 object was replaced or deleted while its bytes were being copied."""


# ------------------------------------------------------------------------------------------ the state


class EmulatorState:
    """The S3, SQS and DynamoDB data of this process's moto backends, saved to and restored from `directory`.

    `local up` calls `restore()` after it has created the buckets, queues and tables of the templates,
    then `start_autosave()`; `stop()` on the way out saves once more; `clear()` is `--fresh`.

    How much a crash loses: autosave snapshots at most `interval_sec` after a change. A SIGKILL of `local up`
    itself loses at most the changes of the last interval (plus those made while a snapshot was being
    written, which the next one would have caught); the previous snapshot stays whole. A graceful stop
    loses nothing, provided `local up` calls `stop()` on SIGTERM and SIGINT.
    """

    def __init__(self, directory: Path, *, account: str = "123456789012", region: str = "us-east-1") -> None:
        self.directory = Path(directory)
        self.account = account
        self.region = region
        self._lock = threading.Lock()  # one snapshot, restore or clear at a time
        self._last_saved: _Capture | None = None
        self._blob_cache: dict[tuple[str, str, int, datetime.datetime, int], str] = {}  # object identity -> blob digest
        self._part_cache: dict[str, tuple[Any, str]] = {}  # "queue NAME" -> (capture, part digest)
        self._saved_objects: dict[tuple[str, str], dict[str, Any]] = {}  # (bucket, key) -> last manifest entry
        self._referenced: tuple[frozenset[str], frozenset[str]] | None = None  # parts, blobs
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.checks = 0  # how many times save_if_changed looked for changes
        self.writes = 0  # how many snapshots were written

    # -------------------------------------------------------------------------------------- public

    @property
    def manifest_path(self) -> Path:
        return self.directory / MANIFEST

    def has_snapshot(self) -> bool:
        return self.manifest_path.is_file()

    def snapshot(self) -> SnapshotSummary:
        """Write the current data of every bucket, queue and table (unchanged blobs and parts are reused)."""
        with self._lock:
            return self._snapshot(self._stable_capture())

    def save_if_changed(self) -> SnapshotSummary | None:
        """Snapshot when something changed since the last snapshot; None when nothing did (what autosave runs)."""
        with self._lock:
            self.checks += 1
            capture = self._capture()
            if capture == self._last_saved:
                return None
            return self._snapshot(self._stable_capture(capture))

    def restore(self) -> RestoreSummary:
        """Load the saved data into the queues and tables that exist by name; create missing buckets.

        Call after the resources of the templates exist. Queues and tables that were saved but no longer
        exist are listed in `missing` and skipped. Restoring into a non-empty queue skips the messages it
        already holds (same message id); objects and items are overwritten with the saved ones.
        """
        started = time.perf_counter()
        with self._lock:
            summary = RestoreSummary()
            manifest = self._read_manifest()
            if manifest is None:
                return summary
            _check_moto()
            summary.saved_at = str(manifest.get("saved_at"))
            for entry in manifest.get("buckets", []):
                self._restore_bucket(entry, summary)
            for entry in manifest.get("queues", []):
                self._restore_queue(entry, summary)
            for entry in manifest.get("tables", []):
                self._restore_table(entry, summary)
            # What was just restored is what the snapshot holds: autosave has nothing to write yet.
            self._last_saved = self._capture()
            summary.seconds = time.perf_counter() - started
            return summary

    def start_autosave(self, interval_sec: float = 1.0) -> None:
        """Snapshot in a daemon thread every `interval_sec` when something changed.

        A SIGKILL of `local up` itself loses at most what changed in the last `interval_sec` (plus the writes
        made while an unfinished snapshot was running); the snapshot before stays whole and restorable.
        """
        if interval_sec <= 0:
            raise ConfigurationError(
                f"autosave interval {interval_sec!r} s is not positive",
                field="interval_sec",
                value=interval_sec,
                allowed="a number of seconds > 0",
            )
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._autosave, args=(interval_sec,), name="emulator-autosave", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop autosaving, then snapshot once more if anything changed."""
        if self._thread is not None:
            self._stopping.set()
            self._thread.join()
            self._thread = None
        self.save_if_changed()

    def clear(self) -> None:
        """Forget every snapshot (`local up --fresh`). Only this module's files are removed from `directory`."""
        with self._lock:
            self.manifest_path.unlink(missing_ok=True)
            for folder in (self.directory / PARTS, self.directory / BLOBS):
                if folder.is_dir():
                    for path in folder.iterdir():
                        path.unlink()
                    folder.rmdir()
            for path in self._temporary_files(self.directory):
                path.unlink(missing_ok=True)
            self._last_saved = None
            self._blob_cache.clear()
            self._part_cache.clear()
            self._saved_objects.clear()
            self._referenced = None

    # ------------------------------------------------------------------------------------ autosave

    def _autosave(self, interval_sec: float) -> None:
        while not self._stopping.wait(interval_sec):
            try:
                self.save_if_changed()
            except Exception:  # keep saving: the next interval may well succeed (disk full, a moto race)
                logger.exception(
                    "emulator state: autosave to %s failed; retrying in %s s", self.directory, interval_sec
                )

    # ------------------------------------------------------------------------------------- capture

    def _backends(self) -> tuple[Any, Any, Any]:
        from moto.dynamodb.models import dynamodb_backends
        from moto.s3.models import s3_backends
        from moto.sqs.models import sqs_backends
        from moto.utilities.utils import get_partition

        _check_moto()
        return (
            s3_backends[self.account][get_partition(self.region)],
            sqs_backends[self.account][self.region],
            dynamodb_backends[self.account][self.region],
        )

    def _capture(self) -> _Capture:
        s3, sqs, dynamodb = self._backends()
        # No reading order is safe for every flow on its own (a submit writes its job row, then its message;
        # a worker writes its result, then the row, then deletes the message): _stable_capture makes it moot.
        queues = [_capture_queue(name, queue) for name, queue in sorted(dict(sqs.queues).items())]
        tables = [_capture_table(name, table) for name, table in sorted(dict(dynamodb.tables).items())]
        buckets = [_capture_bucket(name, bucket) for name, bucket in sorted(dict(s3.buckets).items())]
        return _Capture(buckets, queues, tables)

    def _stable_capture(self, first: _Capture | None = None) -> _Capture:
        """Read until two reads in a row agree, so that every resource is saved as of one moment.

        Each resource is read at some time t1 and again at t2 > t1; when both reads agree for all of them,
        all the [t1, t2] intervals share the moment between the two passes, and the capture is the state at
        that moment. Under a constant stream of writes this gives up after a few reads: the next autosave
        catches what this one missed.
        """
        previous = first or self._capture()
        for _ in range(CAPTURE_ATTEMPTS - 1):
            current = self._capture()
            if current == previous:
                return current
            previous = current
        return previous

    # ------------------------------------------------------------------------------------- writing

    def _snapshot(self, capture: _Capture) -> SnapshotSummary:
        started = time.perf_counter()
        summary = SnapshotSummary()
        for folder in (self.directory, self.directory / PARTS, self.directory / BLOBS):
            folder.mkdir(parents=True, exist_ok=True)
        blobs_in_use: set[str] = set()
        blob_folder = f"{self.directory / BLOBS}{os.sep}"
        blob_cache: dict[tuple[str, str, int, datetime.datetime, int], str] = {}
        part_cache: dict[str, tuple[Any, str]] = {}
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "saved_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
            "account": self.account,
            "region": self.region,
            "buckets": [],
            "queues": [],
            "tables": [],
        }
        saved_objects: dict[tuple[str, str], dict[str, Any]] = {}
        complete = True
        for bucket in capture.buckets:
            entries = []
            for obj in bucket.objects:
                cache_key = obj.blob_cache_key(bucket.name)
                digest = self._blob_cache.get(cache_key)
                # os.path on a str: building a Path per object made this loop 3x slower (profiled)
                if digest is not None and not os.path.isfile(blob_folder + digest):  # noqa: PTH113
                    digest = None  # removed behind our back: copy the object again
                if digest is None:
                    try:
                        digest, written = self._store_blob(obj.fake_key)
                    except _KeyGone:
                        # Replaced or deleted while this snapshot ran: keep the version the last snapshot
                        # saved, if any, rather than nothing; the next snapshot saves what is there now.
                        complete = False
                        previous = self._saved_objects.get((bucket.name, obj.key))
                        if previous is not None:
                            saved_objects[bucket.name, obj.key] = previous
                            blobs_in_use.add(previous["blob"])
                            entries.append(previous)
                        continue
                    if written:
                        summary.blobs_written += 1
                        summary.blob_bytes_written += obj.size
                blob_cache[cache_key] = digest
                blobs_in_use.add(digest)
                entry = obj.manifest_entry(digest)
                saved_objects[bucket.name, obj.key] = entry
                entries.append(entry)
            part = {"kind": "bucket", "name": bucket.name, "versioned": bucket.versioned, "objects": entries}
            digest = self._store_part(f"bucket {bucket.name}", part, part, part_cache, summary)
            manifest["buckets"].append({"name": bucket.name, "part": digest, "objects": len(entries)})
            summary.objects += len(entries)
        for queue in capture.queues:
            part = {"kind": "queue", "name": queue.name, "messages": queue.messages}
            digest = self._store_part(f"queue {queue.name}", queue, part, part_cache, summary)
            manifest["queues"].append({"name": queue.name, "part": digest, "messages": len(queue.messages)})
            summary.messages += len(queue.messages)
        for table in capture.tables:
            part = {"kind": "table", "name": table.name, "items": table.items}
            digest = self._store_part(f"table {table.name}", table, part, part_cache, summary)
            manifest["tables"].append({"name": table.name, "part": digest, "items": len(table.items)})
            summary.items += len(table.items)
        _write_atomically(self.manifest_path, _canonical_json(manifest, indent=1))

        self._blob_cache, self._part_cache, self._saved_objects = blob_cache, part_cache, saved_objects
        self._last_saved = capture if complete else None
        parts_in_use = frozenset(digest for _, digest in part_cache.values())
        referenced = (parts_in_use, frozenset(blobs_in_use))
        if referenced != self._referenced:
            self._collect_garbage(*referenced)
            self._referenced = referenced
        summary.buckets, summary.queues, summary.tables = len(capture.buckets), len(capture.queues), len(capture.tables)
        summary.seconds = time.perf_counter() - started
        self.writes += 1
        return summary

    def _store_part(
        self, name: str, capture: Any, part: dict[str, Any], cache: dict[str, tuple[Any, str]], summary: SnapshotSummary
    ) -> str:
        """Write one resource's part unless the same capture was written last time (then reuse its digest)."""
        previous = self._part_cache.get(name)
        if previous is not None and previous[0] == capture and (self.directory / PARTS / previous[1]).is_file():
            cache[name] = previous
            return previous[1]
        data = _canonical_json(part)
        digest = hashlib.sha256(data).hexdigest()
        path = self.directory / PARTS / digest
        if not path.is_file():
            _write_atomically(path, data)
            summary.parts_written += 1
        cache[name] = (capture, digest)
        return digest

    def _store_blob(self, fake_key: Any) -> tuple[str, bool]:
        """Copy an object's bytes into `blobs/<sha256>` in chunks; (digest, whether a new file was written).

        Each chunk is read under the key's lock at our own offset, as moto's `value` property does, so the
        server can keep answering GETs of a large object while it is copied.
        """
        hasher = hashlib.sha256()
        temporary = self.directory / BLOBS / f"{TEMPORARY_MARK}{uuid.uuid4().hex}"
        offset = 0
        try:
            with temporary.open("wb") as out:
                while True:
                    chunk = _read_chunk(fake_key, offset)
                    if not chunk:
                        break
                    hasher.update(chunk)
                    out.write(chunk)
                    offset += len(chunk)
            digest = hasher.hexdigest()
            final = self.directory / BLOBS / digest
            if final.is_file():
                temporary.unlink()
                return digest, False
            temporary.replace(final)
            return digest, True
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise

    def _collect_garbage(self, parts: frozenset[str], blobs: frozenset[str]) -> None:
        """Remove parts and blobs the new manifest does not name, and temporary files of killed snapshots."""
        for folder, keep in ((self.directory / PARTS, parts), (self.directory / BLOBS, blobs)):
            for path in folder.iterdir():
                if path.name not in keep:
                    path.unlink(missing_ok=True)
        for path in self._temporary_files(self.directory):
            path.unlink(missing_ok=True)

    @staticmethod
    def _temporary_files(folder: Path) -> Iterator[Path]:
        if folder.is_dir():
            yield from (path for path in folder.iterdir() if TEMPORARY_MARK in path.name and path.is_file())

    # ------------------------------------------------------------------------------------- reading

    def _read_manifest(self) -> dict[str, Any] | None:
        try:
            manifest: dict[str, Any] = json.loads(self.manifest_path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            raise ConfigurationError(
                f"emulator state {self.manifest_path} cannot be read ({error}); start with --fresh to discard it",
                field="manifest",
                value=str(self.manifest_path),
                allowed=f"a {FORMAT} manifest written by servestack",
            ) from None
        if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
            raise ConfigurationError(
                f"emulator state {self.manifest_path} is format {manifest.get('format')!r} version "
                f"{manifest.get('version')!r}; this servestack reads {FORMAT!r} version {FORMAT_VERSION}. "
                "Start with --fresh to discard it",
                field="manifest.version",
                value=manifest.get("version"),
                allowed=str(FORMAT_VERSION),
            )
        return manifest

    def _read_part(self, kind: str, entry: dict[str, Any], summary: RestoreSummary) -> dict[str, Any] | None:
        name = str(entry.get("name"))
        digest = str(entry.get("part"))
        try:
            data = (self.directory / PARTS / _safe_digest(digest)).read_bytes()
            if hashlib.sha256(data).hexdigest() != digest:
                raise ValueError("content does not match its digest")
            part: dict[str, Any] = json.loads(data)
        except (OSError, ValueError) as error:
            summary.unreadable.append(f"{kind} {name}: part {digest[:12]} ({error})")
            return None
        return part

    def _restore_bucket(self, entry: dict[str, Any], summary: RestoreSummary) -> None:
        part = self._read_part("bucket", entry, summary)
        if part is None:
            return
        s3, _, _ = self._backends()
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
                self._restore_object(s3, name, obj)
            except (OSError, ValueError) as error:
                summary.unreadable.append(f"s3://{name}/{obj.get('key')}: {error}")
                continue
            restored += 1
        summary.buckets[name] = restored

    def _restore_object(self, s3: Any, bucket: str, obj: dict[str, Any]) -> None:
        blob = self.directory / BLOBS / _safe_digest(obj["blob"])
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
        key.last_modified = datetime.datetime.fromisoformat(obj["last_modified"])
        # Seed the digest cache: the next snapshot does not read the object's bytes again.
        self._blob_cache[_capture_object(obj["key"], key).blob_cache_key(bucket)] = obj["blob"]

    def _restore_queue(self, entry: dict[str, Any], summary: RestoreSummary) -> None:
        _, sqs, _ = self._backends()
        name = str(entry.get("name"))
        queue = sqs.queues.get(name)
        if queue is None:
            summary.missing.append(f"queue {name}")
            return
        part = self._read_part("queue", entry, summary)
        if part is None:
            return
        with queue._messages_lock:
            present = {message.id for message in queue._messages}
            restored = [_message_from_json(saved) for saved in part["messages"] if saved["id"] not in present]
            queue._messages.extend(restored)
            queue._messages_lock.notify_all()  # long polls waiting on this queue see the messages now
        summary.queues[name] = len(restored)

    def _restore_table(self, entry: dict[str, Any], summary: RestoreSummary) -> None:
        from moto.dynamodb.models.dynamo_type import DynamoType, Item

        _, _, dynamodb = self._backends()
        name = str(entry.get("name"))
        table = dynamodb.tables.get(name)
        if table is None:
            summary.missing.append(f"table {name}")
            return
        part = self._read_part("table", entry, summary)
        if part is None:
            return
        restored = 0
        for saved in part["items"]:
            attributes = {attr: _dynamo_from_json(value) for attr, value in saved.items()}
            problem = _key_problem(table, attributes)
            if problem:
                summary.unreadable.append(f"table {name}: item {_printable_key(table, saved)}: {problem}")
                continue
            hash_value = DynamoType(attributes[table.hash_key_attr])
            if table.range_key_attr is None:
                table.items[hash_value] = Item(hash_value, None, attributes)
            else:
                range_value = DynamoType(attributes[table.range_key_attr])
                table.items[hash_value][range_value] = Item(hash_value, range_value, attributes)
            restored += 1
        summary.tables[name] = restored


# ------------------------------------------------------------------------------------ moto structures

_moto_checked = False


def _check_moto() -> None:
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


def _read_chunk(fake_key: Any, offset: int) -> bytes:
    with fake_key.lock:
        if fake_key.disposed:
            raise _KeyGone
        try:
            buffer = fake_key._value_buffer
            buffer.seek(offset)
            chunk: bytes = buffer.read(CHUNK_BYTES)
        except ValueError:  # closed by dispose() between the check and the read
            raise _KeyGone from None
    return chunk


def _capture_object(name: str, fake_key: Any) -> _ObjectCapture:
    metadata = fake_key._metadata
    return _ObjectCapture(
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
        fake_key=fake_key,
    )


def _capture_bucket(name: str, bucket: Any) -> _BucketCapture:
    from moto.s3.models import FakeKey

    objects = []
    for key_name, versions in sorted(dict.items(bucket.keys)):  # the raw lists, without moto's per-key copies
        latest = versions[-1] if versions else None
        if isinstance(latest, FakeKey):  # a delete marker means the key is deleted
            objects.append(_capture_object(key_name, latest))
    return _BucketCapture(name, bucket.versioning_status == "Enabled", tuple(objects))


def _capture_queue(name: str, queue: Any) -> _QueueCapture:
    with queue._messages_lock:
        messages = list(queue._messages)
    return _QueueCapture(name, [_message_to_json(message) for message in messages])


def _capture_table(name: str, table: Any) -> _TableCapture:
    items: list[dict[str, Any]] = []
    for stored in list(table.items.values()):
        # Tables with a range key hold {range: Item} per hash key (possibly empty: moto's defaultdict).
        for item in list(stored.values()) if isinstance(stored, dict) else [stored]:
            items.append({attr: _dynamo_to_json(value) for attr, value in list(item.attrs.items())})
    return _TableCapture(name, items)


def _message_to_json(message: Any) -> dict[str, Any]:
    return {
        "id": message.id,
        "body": message.body,
        "message_attributes": _bytes_to_json(message.message_attributes),
        "system_attributes": _bytes_to_json(message.system_attributes),
        "sender_id": message.sender_id,
        "sent_timestamp": message.sent_timestamp,
        "first_receive_timestamp": message.approximate_first_receive_timestamp,
        "receive_count": message.approximate_receive_count,
        "deduplication_id": message.deduplication_id,
        "group_id": message.group_id,
        "sequence_number": message.sequence_number,
        "delayed_until": message.delayed_until,
    }


def _message_from_json(saved: dict[str, Any]) -> Any:
    from moto.sqs.models import Message

    message = Message(saved["id"], saved["body"], _bytes_from_json(saved["system_attributes"]) or None)
    message.message_attributes = _bytes_from_json(saved["message_attributes"])
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


def _bytes_to_json(value: Any) -> Any:
    """Message attributes hold bytes (BinaryValue); JSON holds them as {"$base64": "..."}."""
    if isinstance(value, bytes):
        return {_BYTES_TAG: base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {str(k): _bytes_to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_bytes_to_json(v) for v in value]
    return value


def _bytes_from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_BYTES_TAG}:
            return base64.b64decode(value[_BYTES_TAG])
        return {k: _bytes_from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bytes_from_json(v) for v in value]
    return value


def _dynamo_to_json(value: Any) -> dict[str, Any]:
    """moto's DynamoType as DynamoDB JSON; binary values (bytes in moto) as base64, as on the wire."""
    kind, inner = value.type, value.value
    if kind in _PLAIN_TYPES:  # the common case first: this runs for every attribute at every autosave check
        return {kind: inner}
    if kind == "M":
        return {kind: {k: _dynamo_to_json(v) for k, v in inner.items()}}
    if kind == "L":
        return {kind: [_dynamo_to_json(v) for v in inner]}
    if kind == "B":
        return {kind: _base64(inner)}
    if kind == "BS":
        return {kind: [_base64(v) for v in inner]}
    return {kind: list(inner)}  # SS, NS: a copy, so that a later change in moto is not shared


_PLAIN_TYPES = frozenset({"S", "N", "BOOL", "NULL"})


def _dynamo_from_json(value: dict[str, Any]) -> dict[str, Any]:
    ((kind, inner),) = value.items()
    if kind == "M":
        return {kind: {k: _dynamo_from_json(v) for k, v in inner.items()}}
    if kind == "L":
        return {kind: [_dynamo_from_json(v) for v in inner]}
    if kind == "B":
        return {kind: base64.b64decode(inner)}
    if kind == "BS":
        return {kind: [base64.b64decode(v) for v in inner]}
    return {kind: inner}


def _base64(value: bytes | str) -> str:
    return base64.b64encode(value).decode() if isinstance(value, bytes) else value  # str: base64 already


def _key_problem(table: Any, attributes: dict[str, Any]) -> str | None:
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


def _printable_key(table: Any, saved: dict[str, Any]) -> str:
    return json.dumps({a: saved.get(a) for a in (table.hash_key_attr, table.range_key_attr) if a})[:120]


# ------------------------------------------------------------------------------------------ files


def _canonical_json(value: Any, indent: int | None = None) -> bytes:
    separators = (",", ":") if indent is None else (",", ": ")
    return json.dumps(value, sort_keys=True, separators=separators, indent=indent, ensure_ascii=False).encode()


def _write_atomically(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never a part: write aside, then rename over."""
    temporary = path.with_name(f"{path.name}{TEMPORARY_MARK}{uuid.uuid4().hex}")
    try:
        temporary.write_bytes(data)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _safe_digest(digest: str) -> str:
    """A manifest names parts and blobs by hex digest; anything else (a path) is refused."""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"{digest[:80]!r} is not a SHA-256 digest")
    return digest
