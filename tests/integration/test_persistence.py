"""Emulator state across restarts: what one embedded emulator saved, a new one in a new interpreter restores.

Each emulator is `tests/integration/emulator_child.py`, a real `EmbeddedEmulator` in its own process (moto's
backends are process-global, as they are in `local up`); the tests talk to it with boto3 over HTTP.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from boto3.s3.transfer import TransferConfig

from servestack.inference.errors import ConfigurationError
from servestack.local.emulator.moto_server import clients
from servestack.local.emulator.persistence import EmulatorState
from servestack.local.hosting.processes import REPO_ROOT

pytestmark = pytest.mark.slow

MAX_RECEIVE_COUNT = 3


class EmulatorChild:
    """`python -m tests.integration.emulator_child DIRECTORY`: an emulator with persistence, over a pipe."""

    def __init__(self, directory: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.emulator_child", str(directory)],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.url: str = self.read()["url"]
        self.aws = clients(self.url)

    def read(self) -> Any:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("@@ "):
                return json.loads(line[3:])
        raise RuntimeError(f"emulator child exited with {self.process.wait()}")

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def __call__(self, command: str) -> Any:
        self.send(command)
        return self.read()

    def close(self) -> None:
        if self.process.poll() is None:
            self("exit")
        self.process.wait(timeout=30)
        self._close_pipes()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def emulators() -> Iterator[list[EmulatorChild]]:
    """Children started by a test; whatever is still running at the end is killed."""
    started: list[EmulatorChild] = []
    yield started
    for child in started:
        child.kill()


def start(emulators: list[EmulatorChild], directory: Path) -> EmulatorChild:
    child = EmulatorChild(directory)
    emulators.append(child)
    return child


# ------------------------------------------------------------------------------------------ resources


@dataclass
class Names:
    """What `local up` would create from the templates, with the same physical names on every start."""

    prefix: str

    @property
    def bucket(self) -> str:
        return f"{self.prefix}-data"

    @property
    def versioned(self) -> str:
        return f"{self.prefix}-versioned"

    @property
    def registry(self) -> str:  # in no template: only the saved state knows it
        return f"{self.prefix}-registry"

    @property
    def queue(self) -> str:
        return f"{self.prefix}-jobs"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}-jobs-dlq"

    @property
    def table(self) -> str:
        return f"{self.prefix}-jobs-table"


def create_template_resources(aws: dict[str, Any], names: Names) -> dict[str, str]:
    """Buckets (one versioned), a queue with a DLQ redrive, a table with TTL: as `local up` creates them."""
    s3, sqs, ddb = aws["s3"], aws["sqs"], aws["dynamodb"]
    s3.create_bucket(Bucket=names.bucket)
    s3.create_bucket(Bucket=names.versioned)
    s3.put_bucket_versioning(Bucket=names.versioned, VersioningConfiguration={"Status": "Enabled"})
    dlq = sqs.create_queue(QueueName=names.dlq)["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(MAX_RECEIVE_COUNT)})
    queue = sqs.create_queue(QueueName=names.queue, Attributes={"RedrivePolicy": redrive})["QueueUrl"]
    ddb.create_table(
        TableName=names.table,
        KeySchema=[{"AttributeName": "job", "KeyType": "HASH"}, {"AttributeName": "step", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "job", "AttributeType": "S"},
            {"AttributeName": "step", "AttributeType": "N"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    ddb.update_time_to_live(
        TableName=names.table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"}
    )
    return {"queue": queue, "dlq": dlq}


BINARY = bytes(range(256)) * 4
LARGE = random.Random(7).randbytes(5 * 1024 * 1024)  # noqa: S311 - reproducible test bytes, not a secret
MULTIPART = random.Random(8).randbytes(11 * 1024 * 1024)  # noqa: S311 - three 5 MB parts
UNTRUSTED_KEY = "../../etc/x"
ITEMS: list[dict[str, Any]] = [
    {"job": {"S": "j1"}, "step": {"N": "1"}, "status": {"S": "done"}, "expires_at": {"N": "1900000000"}},
    {
        "job": {"S": "j1"},
        "step": {"N": "2"},
        "payload": {"B": b"\x00\xff\x10"},
        "tags": {"SS": ["a", "b"]},
        "scores": {"NS": ["1.5", "2"]},
        "blobs": {"BS": [b"\x01", b"\x02"]},
        "detail": {"M": {"nested": {"L": [{"N": "3"}, {"B": b"\x07"}, {"NULL": True}, {"BOOL": False}]}}},
    },
    {"job": {"S": "j2"}, "step": {"N": "1"}, "status": {"S": "queued"}, "expires_at": {"N": "1900000001"}},
]


def fill(aws: dict[str, Any], names: Names, urls: dict[str, str]) -> None:
    """Objects (binary, with metadata, 5 MB, an untrusted key, versions), messages in every state, items."""
    s3, sqs, ddb = aws["s3"], aws["sqs"], aws["dynamodb"]
    s3.put_object(Bucket=names.bucket, Key="binary.bin", Body=BINARY)
    s3.put_object(
        Bucket=names.bucket,
        Key="results/job-1.json",
        Body=b'{"label": 3}',
        ContentType="application/json",
        Metadata={"job-id": "job-1", "model": "digits"},
    )
    s3.put_object(Bucket=names.bucket, Key="uploads/large.npy", Body=LARGE)
    # A multipart upload, as boto3 sends any file over 8 MB (a model's weights): its CRC32 is a checksum of its
    # parts' checksums (COMPOSITE, `...-N`)
    s3.upload_fileobj(io.BytesIO(MULTIPART), names.bucket, "models/weights.bin",
                      Config=TransferConfig(multipart_threshold=5 * 2**20, multipart_chunksize=5 * 2**20),
                      ExtraArgs={"ChecksumAlgorithm": "CRC32"})  # fmt: skip
    s3.put_object(Bucket=names.bucket, Key=UNTRUSTED_KEY, Body=b"stays inside")
    for body in (b"first", b"second", b"latest"):
        s3.put_object(Bucket=names.versioned, Key="model.onnx", Body=body)
    s3.put_object(Bucket=names.versioned, Key="deleted.txt", Body=b"gone")
    s3.delete_object(Bucket=names.versioned, Key="deleted.txt")  # latest version: a delete marker
    s3.create_bucket(Bucket=names.registry)
    s3.put_object(Bucket=names.registry, Key="models/digits/aliases.json", Body=b'{"live": "1"}')

    queue = urls["queue"]
    # "twice" is received twice (a consumer failed it twice), then stays in flight: its visibility timeout
    # has 10 minutes to run when the emulator stops.
    sqs.send_message(QueueUrl=queue, MessageBody="twice")
    for visibility in (0, 600):
        got = sqs.receive_message(QueueUrl=queue, VisibilityTimeout=visibility)["Messages"]
        assert [m["Body"] for m in got] == ["twice"]
    sqs.send_message(
        QueueUrl=queue,
        MessageBody="with attributes",
        MessageAttributes={
            "job-id": {"DataType": "String", "StringValue": "job-1"},
            "digest": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xfe"},
        },
        MessageSystemAttributes={"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-abc"}},
    )
    sqs.send_message(QueueUrl=queue, MessageBody="delayed", DelaySeconds=900)
    for item in ITEMS:
        ddb.put_item(TableName=names.table, Item=item)
    ddb.update_item(  # in place in moto: a change autosave must see too
        TableName=names.table,
        Key={"job": {"S": "j2"}, "step": {"N": "1"}},
        UpdateExpression="SET #s = :s",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":s": {"S": "running"}},
    )
    sqs.create_queue(QueueName=f"{names.prefix}-retired")
    sqs.send_message(QueueUrl=sqs.get_queue_url(QueueName=f"{names.prefix}-retired")["QueueUrl"], MessageBody="old")


# ----------------------------------------------------------------------------------- the round trip


@dataclass
class RoundTrip:
    directory: Path
    names: Names
    urls: dict[str, str]
    snapshot: dict[str, Any]
    restore: dict[str, Any]
    restored: EmulatorChild


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RoundTrip]:
    # GIVEN an emulator holding objects, messages (one received twice and in flight) and items
    directory = tmp_path_factory.mktemp("persistence") / "state"
    names = Names(f"p{uuid.uuid4().hex[:8]}")
    children: list[EmulatorChild] = []
    try:
        before = start(children, directory)
        fill(before.aws, names, create_template_resources(before.aws, names))
        # WHEN it is snapshotted and stopped, and a new emulator in a new interpreter creates the template's
        # resources (not the registry bucket, not the retired queue) and restores
        snapshot = before("snapshot")
        before.close()
        after = start(children, directory)
        urls = create_template_resources(after.aws, names)
        restore = after("restore")
        yield RoundTrip(directory, names, urls, snapshot, restore, after)
    finally:
        for child in children:
            child.kill()


def test_every_object_is_back_byte_for_byte(round_trip: RoundTrip) -> None:
    # THEN each object has its bytes, content type and user metadata back
    s3, names = round_trip.restored.aws["s3"], round_trip.names
    assert s3.get_object(Bucket=names.bucket, Key="binary.bin")["Body"].read() == BINARY
    result = s3.get_object(Bucket=names.bucket, Key="results/job-1.json")
    assert result["Body"].read() == b'{"label": 3}'
    assert result["ContentType"] == "application/json"
    assert result["Metadata"] == {"job-id": "job-1", "model": "digits"}
    assert s3.get_object(Bucket=names.bucket, Key="uploads/large.npy")["Body"].read() == LARGE
    # ...the multipart object with its composite checksum, which a reader validating checksums (boto3's default
    # for an object that has one) accepts
    weights = s3.get_object(Bucket=names.bucket, Key="models/weights.bin", ChecksumMode="ENABLED")
    assert weights["Body"].read() == MULTIPART
    assert weights.get("ChecksumType") == "COMPOSITE"
    assert s3.get_object(Bucket=names.bucket, Key=UNTRUSTED_KEY)["Body"].read() == b"stays inside"
    # ...the versioned bucket its latest version, and not the key whose latest version is a delete marker
    assert s3.get_object(Bucket=names.versioned, Key="model.onnx")["Body"].read() == b"latest"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=names.versioned)["Contents"]] == ["model.onnx"]
    # ...and the bucket no template creates (the model registry's) exists again, still unversioned
    assert s3.get_object(Bucket=names.registry, Key="models/digits/aliases.json")["Body"].read() == b'{"live": "1"}'
    assert "Status" not in s3.get_bucket_versioning(Bucket=names.registry)
    assert round_trip.restore["created_buckets"] == [names.registry]
    assert round_trip.restore["buckets"] == {names.bucket: 5, names.versioned: 1, names.registry: 1}


def test_every_item_is_back(round_trip: RoundTrip) -> None:
    # THEN the table holds the items as written (the update included), binary and nested values intact
    ddb, names = round_trip.restored.aws["dynamodb"], round_trip.names
    items = ddb.scan(TableName=names.table)["Items"]
    expected = [dict(item) for item in ITEMS]
    expected[2] = {**ITEMS[2], "status": {"S": "running"}}

    def order(item: dict[str, Any]) -> tuple[str, str]:
        return item["job"]["S"], item["step"]["N"]

    assert sorted(items, key=order) == sorted(expected, key=order)
    assert ddb.get_item(TableName=names.table, Key={"job": {"S": "j1"}, "step": {"N": "2"}})["Item"] == ITEMS[1]
    assert round_trip.restore["tables"] == {names.table: 3}


def test_saved_queue_that_no_longer_exists_is_reported_and_skipped(round_trip: RoundTrip) -> None:
    # THEN the queue no template creates any more is named in the summary, and not created
    assert round_trip.restore["missing"] == [f"queue {round_trip.names.prefix}-retired"]
    assert round_trip.restore["unreadable"] == []
    queues = round_trip.restored.aws["sqs"].list_queues(QueueNamePrefix=round_trip.names.prefix)["QueueUrls"]
    assert not any(url.endswith("-retired") for url in queues)


def test_untrusted_key_is_stored_inside_the_directory(round_trip: RoundTrip) -> None:
    # THEN every file of the snapshot lies inside its directory and is named by a digest, never by a key
    directory = round_trip.directory
    files = [path for path in directory.parent.rglob("*") if path.is_file()]
    assert files, "the snapshot wrote nothing"
    for path in files:
        assert path.resolve().is_relative_to(directory.resolve())
        assert path.name == "manifest.json" or (len(path.name) == 64 and int(path.name, 16) >= 0)
    assert not (directory / UNTRUSTED_KEY).resolve().exists()


def test_messages_are_back_with_their_receive_counts_and_the_redrive_still_applies(round_trip: RoundTrip) -> None:
    sqs, urls = round_trip.restored.aws["sqs"], round_trip.urls
    # THEN the in-flight message is visible again and every message kept its body, attributes and counts
    got = sqs.receive_message(
        QueueUrl=urls["queue"],
        MaxNumberOfMessages=10,
        VisibilityTimeout=0,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    )["Messages"]
    by_body = {m["Body"]: m for m in got}
    assert set(by_body) == {"twice", "with attributes"}  # "delayed" stays delayed
    assert by_body["twice"]["Attributes"]["ApproximateReceiveCount"] == "3"  # 2 before the restart + this one
    assert by_body["with attributes"]["Attributes"]["ApproximateReceiveCount"] == "1"
    assert by_body["with attributes"]["Attributes"]["AWSTraceHeader"] == "Root=1-abc"
    assert by_body["with attributes"]["MessageAttributes"] == {
        "job-id": {"DataType": "String", "StringValue": "job-1"},
        "digest": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xfe"},
    }
    attributes = sqs.get_queue_attributes(QueueUrl=urls["queue"], AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessagesDelayed"] == "1"
    # WHEN the consumer fails them all once more (they were received with visibility 0) and polls again
    again = sqs.receive_message(QueueUrl=urls["queue"], MaxNumberOfMessages=10, VisibilityTimeout=0)
    # THEN the message received 3 times in all went to the DLQ, the other one is still there
    assert [m["Body"] for m in again["Messages"]] == ["with attributes"]
    dead = sqs.receive_message(QueueUrl=urls["dlq"], MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in dead] == ["twice"]


# ------------------------------------------------------------------------------------ autosave, crashes


def manifest_bytes(directory: Path) -> bytes:
    return (directory / "manifest.json").read_bytes()


def wait_for(condition: Any, timeout_sec: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_sec
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_for_new_manifest(directory: Path, saved: bytes, what: str) -> bytes:
    wait_for(lambda: manifest_bytes(directory) != saved, what=what)
    return manifest_bytes(directory)


def test_autosave_writes_after_a_change_and_not_without_one(emulators: list[EmulatorChild], tmp_path: Path) -> None:
    # GIVEN an emulator autosaving every 0.05 s, with a bucket, a queue holding a message and a table holding
    # an item, all saved once
    directory = tmp_path / "state"
    child = start(emulators, directory)
    s3, sqs, ddb = child.aws["s3"], child.aws["sqs"], child.aws["dynamodb"]
    s3.create_bucket(Bucket="autosaved")
    queue = sqs.create_queue(QueueName="autosaved")["QueueUrl"]
    sqs.send_message(QueueUrl=queue, MessageBody="job")
    ddb.create_table(
        TableName="autosaved",
        KeySchema=[{"AttributeName": "job", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "job", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    ddb.put_item(TableName="autosaved", Item={"job": {"S": "j"}, "status": {"S": "queued"}})
    assert child("autosave 0.05") == "autosaving"
    wait_for(lambda: child("counters")["writes"] >= 1, what="the first autosave")  # counted once written
    counters = child("counters")
    saved = manifest_bytes(directory)
    # WHEN nothing changes for 20 checks
    wait_for(lambda: child("counters")["checks"] >= counters["checks"] + 20, what="20 autosave checks")
    # THEN nothing was written
    assert child("counters")["writes"] == counters["writes"]
    assert manifest_bytes(directory) == saved
    # WHEN an object is put, a message is received (its receive count changes) and an item is updated in
    # place, THEN a snapshot follows each change
    changes = {
        "object put": lambda: s3.put_object(Bucket="autosaved", Key="new.txt", Body=b"fresh"),
        "message received": lambda: sqs.receive_message(QueueUrl=queue, VisibilityTimeout=0),
        "item updated": lambda: ddb.update_item(
            TableName="autosaved",
            Key={"job": {"S": "j"}},
            UpdateExpression="SET #s = :s",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":s": {"S": "done"}},
        ),
    }
    for what, change in changes.items():
        change()
        saved = wait_for_new_manifest(directory, saved, what=f"a snapshot after the {what}")
    assert child("stop") == "stopped"
    child.close()
    # ...and a new emulator gets all three changes back
    restored = start(emulators, directory)
    restored.aws["sqs"].create_queue(QueueName="autosaved")
    restored.aws["dynamodb"].create_table(
        TableName="autosaved",
        KeySchema=[{"AttributeName": "job", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "job", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    assert restored("restore")["buckets"] == {"autosaved": 1}
    assert restored.aws["s3"].get_object(Bucket="autosaved", Key="new.txt")["Body"].read() == b"fresh"
    got = restored.aws["sqs"].receive_message(
        QueueUrl=restored.aws["sqs"].get_queue_url(QueueName="autosaved")["QueueUrl"],
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
    )["Messages"]
    assert [m["Attributes"]["ApproximateReceiveCount"] for m in got] == ["2"]
    item = restored.aws["dynamodb"].get_item(TableName="autosaved", Key={"job": {"S": "j"}})["Item"]
    assert item["status"] == {"S": "done"}


def test_stop_saves_what_changed_since_the_last_autosave(emulators: list[EmulatorChild], tmp_path: Path) -> None:
    # GIVEN an emulator autosaving once an hour (so only stop() can save)
    directory = tmp_path / "state"
    child = start(emulators, directory)
    assert child("autosave 3600") == "autosaving"
    # WHEN a queue gets a message and local up stops
    queue = child.aws["sqs"].create_queue(QueueName="stopped")["QueueUrl"]
    child.aws["sqs"].send_message(QueueUrl=queue, MessageBody="saved on stop")
    assert child("stop") == "stopped"
    child.close()
    # THEN the next emulator gets the message back
    restored = start(emulators, directory)
    queue = restored.aws["sqs"].create_queue(QueueName="stopped")["QueueUrl"]
    assert restored("restore")["queues"] == {"stopped": 1}
    got = restored.aws["sqs"].receive_message(QueueUrl=queue)["Messages"]
    assert [m["Body"] for m in got] == ["saved on stop"]


def test_snapshot_killed_mid_write_leaves_the_previous_one_restorable(
    emulators: list[EmulatorChild], tmp_path: Path
) -> None:
    # GIVEN a snapshot holding one object
    directory = tmp_path / "state"
    child = start(emulators, directory)
    child.aws["s3"].create_bucket(Bucket="crash")
    child.aws["s3"].put_object(Bucket="crash", Key="v1.txt", Body=b"first snapshot")
    child("snapshot")
    previous = manifest_bytes(directory)
    # WHEN the process is SIGKILLed while the next snapshot copies a 20 MB object (stalled after one chunk)
    child.aws["s3"].put_object(Bucket="crash", Key="big.bin", Body=os.urandom(20 * 1024 * 1024))
    assert child("stall crash big.bin") == "stalled"
    child.send("snapshot")

    def half_written_blob() -> bool:
        return any(".tmp-" in p.name and p.stat().st_size > 0 for p in (directory / "blobs").iterdir())

    wait_for(half_written_blob, what="the snapshot to start writing the large object")
    child.kill()
    # ...and a manifest write was cut short too (a kill between write and rename leaves this)
    (directory / "manifest.json.tmp-cut").write_bytes(b'{"format": "servestack-emul')
    # THEN the previous snapshot is still the one on disk, and a new emulator restores it
    assert manifest_bytes(directory) == previous
    restored = start(emulators, directory)
    restored.aws["s3"].create_bucket(Bucket="crash")
    assert restored("restore")["buckets"] == {"crash": 1}
    keys = [o["Key"] for o in restored.aws["s3"].list_objects_v2(Bucket="crash")["Contents"]]
    assert keys == ["v1.txt"]
    assert restored.aws["s3"].get_object(Bucket="crash", Key="v1.txt")["Body"].read() == b"first snapshot"
    # ...and its next snapshot removes what the killed one left behind
    restored.aws["s3"].put_object(Bucket="crash", Key="v2.txt", Body=b"second")
    restored("snapshot")
    leftovers = [p.name for p in directory.rglob("*") if ".tmp-" in p.name]
    assert leftovers == []


def test_clear_empties_the_directory(emulators: list[EmulatorChild], tmp_path: Path) -> None:
    # GIVEN a snapshot with an object, a message and a table
    directory = tmp_path / "state"
    child = start(emulators, directory)
    child.aws["s3"].create_bucket(Bucket="fresh")
    child.aws["s3"].put_object(Bucket="fresh", Key="k", Body=b"v")
    child.aws["sqs"].send_message(
        QueueUrl=child.aws["sqs"].create_queue(QueueName="fresh")["QueueUrl"], MessageBody="m"
    )
    assert child("snapshot")["objects"] == 1
    assert any(directory.rglob("*"))
    # WHEN it is cleared (local up --fresh)
    assert child("clear") == "cleared"
    # THEN the directory is empty and a restore finds nothing
    assert list(directory.rglob("*")) == []
    assert child("restore")["saved_at"] is None


def test_unknown_state_format_is_refused_with_what_to_do(tmp_path: Path) -> None:
    # GIVEN a manifest from a future servestack
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "servestack-emulator-state", "version": 99}))
    # WHEN it is restored
    with pytest.raises(ConfigurationError) as raised:
        EmulatorState(tmp_path).restore()
    # THEN the error names the version found, the one understood, and the way out
    assert raised.value.field == "manifest.version"
    assert raised.value.value == 99
    assert raised.value.allowed == "1"
    assert "--fresh" in raised.value.message
