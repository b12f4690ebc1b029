"""Emulator state that survives `local up` restarts: moto's S3, SQS and DynamoDB data, snapshotted to disk.

`local up` runs moto's `ThreadedMotoServer` inside its own process, so every bucket, queue and table lives
in moto's in-memory backends and dies with the process. `EmulatorState` reads those backends directly (the
embedded server shares them), which is faster than the HTTP API and sees what the API cannot, such as a
message's receive count. It was written against moto 5.2.x; the private attributes it uses are checked at
first use (`check_moto`), so a moto upgrade that renames them fails loudly with the version in the message.

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

import datetime
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.inference.errors import ConfigurationError
from servestack.local.emulator.moto_stores import (
    BLOBS,
    PARTS,
    TEMPORARY_MARK,
    Capture,
    KeyGone,
    canonical_json,
    capture_bucket,
    capture_queue,
    capture_table,
    check_moto,
    read_chunk,
    write_atomically,
)
from servestack.local.emulator.restore import RestoreSummary, StoreRestore

__all__ = ["EmulatorState", "RestoreSummary", "SnapshotSummary"]

logger = logging.getLogger(__name__)

FORMAT = "servestack-emulator-state"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
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
        self._last_saved: Capture | None = None
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
            check_moto()
            summary.saved_at = str(manifest.get("saved_at"))
            stores = StoreRestore(self.directory, self.region, self._backends(), self._blob_cache)
            for entry in manifest.get("buckets", []):
                stores.bucket(entry, summary)
            for entry in manifest.get("queues", []):
                stores.queue(entry, summary)
            for entry in manifest.get("tables", []):
                stores.table(entry, summary)
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

        check_moto()
        return (
            s3_backends[self.account][get_partition(self.region)],
            sqs_backends[self.account][self.region],
            dynamodb_backends[self.account][self.region],
        )

    def _capture(self) -> Capture:
        s3, sqs, dynamodb = self._backends()
        # No reading order is safe for every flow on its own (a submit writes its job row, then its message;
        # a worker writes its result, then the row, then deletes the message): _stable_capture makes it moot.
        queues = [capture_queue(name, queue) for name, queue in sorted(dict(sqs.queues).items())]
        tables = [capture_table(name, table) for name, table in sorted(dict(dynamodb.tables).items())]
        buckets = [capture_bucket(name, bucket) for name, bucket in sorted(dict(s3.buckets).items())]
        return Capture(buckets, queues, tables)

    def _stable_capture(self, first: Capture | None = None) -> Capture:
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

    def _snapshot(self, capture: Capture) -> SnapshotSummary:
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
                    except KeyGone:
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
        write_atomically(self.manifest_path, canonical_json(manifest, indent=1))

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
        data = canonical_json(part)
        digest = hashlib.sha256(data).hexdigest()
        path = self.directory / PARTS / digest
        if not path.is_file():
            write_atomically(path, data)
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
                    chunk = read_chunk(fake_key, offset)
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
