"""Chaos: the async worker is SIGKILLed 20 times while it works through 2,000 jobs, 2% of them poison.

The pieces are the real ones: moto's server over HTTP, the local SQS event source mapping and
`servestack.adapters.asynchronous.worker_handler` in a child process (tests/integration/chaos_worker.py), killed
mid-batch with SIGKILL; the queue's visibility timeout is 2 s, so what a killed worker held comes back soon.
Every good job must succeed exactly once (one version of one result object), and every poison job must end
`failed` with its reason, both in the table and on its DLQ message.

The jobs are what `JobService.submit` makes (its record and its message, built by the same methods), written
with the batch APIs (25 records, 10 messages a call) so that the test's time goes to the worker, the part
under test: one submit costs three emulator calls, and 6,000 of them take most of a minute on a loaded
2-core machine. Every good job reads one shared payload object; each poison kind has its own. Half the
jobs have no record, as when a submit dies between sending the message and writing the record: the worker
creates it (tests/integration/test_async_jobs.py covers submit itself).
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import multiprocessing.forkserver
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import servestack.adapters.asynchronous
from servestack.local.emulator.moto_server import clients
from servestack.local.hosting.processes import free_port, http_status, stop_process
from tests.conftest import ARTIFACTS
from tests.integration import chaos_worker
from tests.integration.asyncjobs import AsyncDeploymentUnderTest, deploy_async
from tests.integration.conftest import Aws

pytestmark = pytest.mark.slow
JOBS = 2000
KILLS = 20
SAMPLE = (ARTIFACTS / "breast-cancer" / "1" / "sample-request.json").read_bytes()
# Not a timing assertion (the test takes ~45-60 s on a loaded 2-core machine): a bound past which the run is
# stuck, so that a lost job fails the test instead of hanging it.
STUCK_SEC = 240
OUTSTANDING = 30  # jobs sent and not yet handled: moto's SQS scans its whole queue for every message it returns


def npy_with(descr: str, shape: tuple[int, ...], data: bytes) -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + data


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


# Poison: payloads no number of receives can make succeed, of every kind the codecs refuse.
POISON = [
    (b"[" * 3000 + b"]" * 3000, "application/json"),  # nested past the JSON depth limit
    (json.dumps({"instances": [[1.0] * 29]}).encode(), "application/json"),  # 29 features, the model takes 30
    (json.dumps({"instances": [[True] + [1.0] * 29]}).encode(), "application/json"),  # a boolean is no number
    (npy_with("<i3", (1, 30), b"\0" * 90), "application/x-npy"),  # no such dtype
    (npy_with("<f4", (10**9, 30), b"\0" * 120), "application/x-npy"),  # a shape the bytes do not hold
    (",".join(["1_0"] * 30).encode(), "text/csv"),  # not an ASCII decimal
    (npy(np.ones((1, 30), dtype=np.float32))[:-4], "application/x-npy"),  # truncated
]


@dataclass
class QueueEmulator:
    """moto's server in a process of its own for SQS (the emulator's busiest service here: it scans a queue for
    every message it returns), next to the session's emulator for S3 and DynamoDB, so that the emulator's work
    spreads over the machine's cores. boto3 reaches it through AWS_ENDPOINT_URL_SQS."""

    url: str
    process: subprocess.Popen[bytes]

    @classmethod
    def start(cls) -> QueueEmulator:
        port = free_port()
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while http_status(f"{url}/moto-api/") is None:
            assert process.poll() is None, "moto exited"
            assert time.monotonic() < deadline, "moto did not start"
            time.sleep(0.1)
        return cls(url, process)

    def stop(self) -> None:
        stop_process(self.process, 5)


FORKSERVER = multiprocessing.get_context("forkserver")


@pytest.fixture
def deployment(aws: Aws, unique: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[AsyncDeploymentUnderTest]:
    # The fork server imports the handlers while the queue's emulator starts.
    FORKSERVER.set_forkserver_preload(["tests.integration.chaos_worker"])
    multiprocessing.forkserver.ensure_running()
    queues = QueueEmulator.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", queues.url)
    # The worker serves the deployment's one model (as its Lambda bundle would), so a restart loads only that.
    monkeypatch.setenv("SERVESTACK_MODEL_DIR", str(ARTIFACTS / "breast-cancer" / "1"))
    split = Aws(aws.url, {**aws.clients, "sqs": clients(queues.url)["sqs"]})
    try:
        yield deploy_async(
            split, unique, monkeypatch, visibility_timeout=2, batch_size=10, batch_window_sec=0, max_receive_count=10
        )
    finally:
        servestack.adapters.asynchronous.service.cache_clear()
        queues.stop()


class Workers:
    """Two worker processes (Lambda runs an SQS source with concurrency), forked from a server that has the
    handlers imported; each counts the messages it has handled, for pacing."""

    def __init__(self, deployment: AsyncDeploymentUnderTest, count: int = 2) -> None:
        self.context = FORKSERVER
        self.environment = dict(os.environ)
        self.queue_url = deployment.queue_url
        self.handled: list[Any] = [None] * count
        self.processes: list[Any] = [None] * count
        self.done_before = 0
        self.kills = 0

    def start(self, slot: int) -> None:
        if self.handled[slot] is not None:
            self.done_before += self.handled[slot].value
        self.handled[slot] = self.context.RawValue("i", 0)  # one writer; no lock to leak when it is killed
        self.processes[slot] = self.context.Process(
            target=chaos_worker.run,
            args=(self.environment, self.queue_url, 10, self.handled[slot]),
            name=f"chaos-worker-{slot}",
            daemon=True,
        )
        self.processes[slot].start()

    def handled_total(self) -> int:
        return self.done_before + sum(value.value for value in self.handled if value is not None)

    def kill_mid_batch(self, slot: int, after_messages: int, stop: threading.Event) -> None:
        """SIGKILL a worker a moment into a batch, once it has handled `after_messages`, then restart it."""
        while self.handled[slot].value < after_messages and not stop.is_set():
            time.sleep(0.02)
        time.sleep(random.uniform(0.0, 0.15))  # noqa: S311 - when to strike, not cryptography
        self.processes[slot].kill()
        self.processes[slot].join(timeout=10)
        self.kills += 1
        self.start(slot)

    def close(self) -> None:
        for process in self.processes:
            if process is not None and process.is_alive():
                process.kill()
                process.join(timeout=10)
        stopper = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
        if stopper is not None:
            stopper()


def dead_letters(deployment: AsyncDeploymentUnderTest) -> list[dict[str, Any]]:
    """Every message in the DLQ (each received once: hidden for the rest of the test once it has been)."""
    found: list[dict[str, Any]] = []
    while True:
        batch = deployment.aws.sqs.receive_message(
            QueueUrl=deployment.dlq_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            VisibilityTimeout=600,
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        if not batch:
            return found
        found += batch


def table_items(deployment: AsyncDeploymentUnderTest) -> dict[str, dict[str, Any]]:
    items: dict[str, dict[str, Any]] = {}
    pages = deployment.aws.dynamodb.get_paginator("scan").paginate(
        TableName=deployment.names.table,
        ProjectionExpression="job_id, #s, #e",
        ExpressionAttributeNames={"#s": "status", "#e": "error"},
    )
    for page in pages:
        for item in page["Items"]:
            items[item["job_id"]["S"]] = item
    return items


def result_versions(deployment: AsyncDeploymentUnderTest) -> Counter[str]:
    versions: Counter[str] = Counter()
    pages = deployment.aws.s3.get_paginator("list_object_versions").paginate(
        Bucket=deployment.names.bucket, Prefix=deployment.names.result_prefix
    )
    for page in pages:
        for version in page.get("Versions", []):
            versions[version["Key"].removeprefix(deployment.names.result_prefix)] += 1
    return versions


def test_sigkilled_workers_lose_no_job_and_duplicate_no_result(deployment: AsyncDeploymentUnderTest) -> None:
    started = time.monotonic()
    rng = random.Random(12)  # noqa: S311 - which jobs are poison, reproducibly
    poison_at = set(rng.sample(range(JOBS), JOBS * 2 // 100))
    workers = Workers(deployment)
    stop = threading.Event()

    def chaos() -> None:
        for kill in range(KILLS):
            if stop.is_set():
                return
            workers.kill_mid_batch(kill % 2, rng.randint(20, 70), stop)

    jobs = servestack.adapters.asynchronous.service()
    names = deployment.names
    good: list[str] = []
    poison: dict[str, bytes] = {}
    payloads = {"good": (SAMPLE, "application/json")} | {f"poison-{i}": kind for i, kind in enumerate(POISON)}
    for name, (body, content_type) in payloads.items():
        deployment.aws.s3.put_object(
            Bucket=names.bucket, Key=f"{names.request_prefix}{name}", Body=body, ContentType=content_type
        )
    records, messages = [], []
    for index in range(JOBS):
        job_id = f"chaos{index:05d}"
        name = f"poison-{index % len(POISON)}" if index in poison_at else "good"
        body, content_type = payloads[name]
        digest = hashlib.sha256(body).hexdigest()
        record = jobs.new_record(job_id, f"{names.request_prefix}{name}", content_type, None, len(body), digest)
        if index in poison_at:
            poison[job_id] = body
        else:
            good.append(job_id)
        messages.append(jobs.job_message(job_id, record["input_key"], record, payload=body))
        if index % 10:  # one job in ten has no record, as if its submit died after sending the message
            records.append(record)
    with jobs.table.batch_writer() as batch:
        for record in records:
            batch.put_item(Item=record)
    try:
        for slot in range(2):
            workers.start(slot)
        killer = threading.Thread(target=chaos, name="chaos", daemon=True)
        killer.start()
        # GIVEN 2,000 jobs arriving while two workers run and are killed 20 times, 2% of the jobs poison; they
        # arrive as fast as the workers take them (a long queue would only make the emulator slower)
        sent = 0
        while sent < JOBS:
            assert time.monotonic() - started < STUCK_SEC, f"only {sent} jobs sent in time"
            if sent - workers.handled_total() >= OUTSTANDING:
                time.sleep(0.01)
                continue
            entries = [{"Id": str(i), "MessageBody": m} for i, m in enumerate(messages[sent : sent + 10])]
            deployment.aws.sqs.send_message_batch(QueueUrl=deployment.queue_url, Entries=entries)
            sent += len(entries)
        # WHEN the killing is over and the queue has drained (nothing visible, nothing in flight)
        killer.join(timeout=max(1.0, STUCK_SEC - (time.monotonic() - started)))
        assert workers.kills == KILLS, f"{workers.kills} kills in time"
        while deployment.depth(deployment.queue_url) > 0:
            assert time.monotonic() - started < STUCK_SEC, "the queue did not drain in time"
            time.sleep(1)
    finally:
        stop.set()
        workers.close()
    drained = time.monotonic() - started

    # THEN every good job succeeded, with exactly one version of one result object
    with ThreadPoolExecutor(3) as pool:  # three reads from three emulator processes at once
        reading = [pool.submit(read, deployment) for read in (table_items, result_versions, dead_letters)]
        items, versions, letters = (future.result() for future in reading)
    assert len(good) == JOBS - len(poison_at)
    assert Counter(items[job_id]["status"]["S"] for job_id in good) == Counter({"succeeded": len(good)})
    assert all(versions[job_id] == 1 for job_id in good)
    # AND every poison job is failed with its reason in the table, and has no result
    for job_id in poison:
        item = items[job_id]
        assert item["status"]["S"] == "failed"
        assert item["error"]["M"]["type"]["S"] in ("InvalidInput", "PayloadTooLarge")
        assert item["error"]["M"]["message"]["S"]
        assert versions[job_id] == 0
    # AND the DLQ holds exactly the poison jobs, each message with the reason the table has
    by_job: dict[str, list[dict[str, Any]]] = {}
    for letter in letters:
        by_job.setdefault(json.loads(letter["Body"])["job_id"], []).append(letter)
    assert set(by_job) == set(poison)
    for job_id, messages in by_job.items():
        for message in messages:
            attributes = {name: value["StringValue"] for name, value in message["MessageAttributes"].items()}
            assert attributes["JobId"] == job_id
            assert attributes["ErrorType"] == items[job_id]["error"]["M"]["type"]["S"]
            assert attributes["ErrorMessage"] == items[job_id]["error"]["M"]["message"]["S"]
    print(
        f"\n{JOBS} jobs, {len(poison)} poison, {workers.kills} SIGKILLs, {len(letters)} dead letters: "
        f"drained in {drained:.1f}s, checked in {time.monotonic() - started:.1f}s"
    )
