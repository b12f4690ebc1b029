"""Idempotency-Key under concurrency, on a real AWS endpoint: the key is claimed in the job table before
anything is stored or enqueued, so of two submits sent at once under one key with different bodies exactly one
is the job, and the refused one leaves no payload, no message and no job behind; a replay asking for another
`Accept` is refused; and the claim of a call that died is taken over by exactly one retry.

Concurrent Lambda invocations are separate sandboxes, so each caller here has its own `JobService` (its own
clients), released together by a barrier.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

import servestack.adapters.asynchronous
from servestack.adapters.aws.jobs import AsyncSettings, JobService, job_id_for
from servestack.inference.errors import IdempotencyConflict, IdempotencyInProgress
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings
from tests.conftest import ARTIFACTS
from tests.integration.asyncjobs import AsyncDeploymentUnderTest, deploy_async
from tests.integration.conftest import Aws

SAMPLE = (ARTIFACTS / "breast-cancer" / "1" / "sample-request.json").read_bytes()
ROWS = json.loads(SAMPLE)["instances"]
OTHER = json.dumps({"instances": ROWS[:1]}).encode()  # a valid request too, with another answer
PAIRS = 12


@pytest.fixture
def deployment(aws: Aws, unique: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[AsyncDeploymentUnderTest]:
    yield deploy_async(aws, unique, monkeypatch, batch_size=10, batch_window_sec=0, max_receive_count=2)
    servestack.adapters.asynchronous.service.cache_clear()


@pytest.fixture(scope="module")
def repository() -> ModelRepository:
    loaded = ModelRepository(ServingSettings(warmup=False))
    loaded.load_all()
    return loaded


def predictions(repository: ModelRepository, body: bytes) -> Any:
    return json.loads(repository.get("breast-cancer").infer(body, "application/json", None).body)


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run `calls` in threads released together by a barrier: each one's result, or the exception it raised."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = calls[index]()
        except Exception as error:  # a refusal is an outcome under test
            outcomes[index] = error

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


def sandbox(repository: ModelRepository, settings: AsyncSettings | None = None) -> JobService:
    """A submit function's own execution environment: its own clients."""
    return JobService(settings or AsyncSettings.from_environment(), repository, repository.get())


def race(repository: ModelRepository, key: str) -> dict[bytes, Any]:
    """Submit SAMPLE and OTHER under `key` at the same moment, each from its own sandbox; each body's outcome:
    the job record, or the exception."""
    bodies = (SAMPLE, OTHER)
    services = [sandbox(repository) for _ in bodies]
    calls = [
        functools.partial(jobs.submit, body, "application/json", None, idempotency_key=key)
        for jobs, body in zip(services, bodies, strict=True)
    ]
    return dict(zip(bodies, at_once(*calls), strict=True))


def queued_jobs(deployment: AsyncDeploymentUnderTest) -> list[tuple[str, str]]:
    """(job id, request digest) of each job message on the queue (read, then made visible again)."""
    sqs, found, handles = deployment.aws.sqs, [], []
    while True:
        messages = sqs.receive_message(QueueUrl=deployment.queue_url, MaxNumberOfMessages=10, VisibilityTimeout=30)
        if not messages.get("Messages"):
            break
        for message in messages["Messages"]:
            handles.append(message["ReceiptHandle"])
            job = json.loads(message["Body"])
            if "record" in job:  # not S3's s3:TestEvent
                found.append((job["job_id"], job["record"]["request_sha256"]))
    for handle in handles:
        sqs.change_message_visibility(QueueUrl=deployment.queue_url, ReceiptHandle=handle, VisibilityTimeout=0)
    return found


def test_same_key_pairs_sent_at_once_make_one_job_and_the_refused_body_leaves_nothing(
    deployment: AsyncDeploymentUnderTest, repository: ModelRepository
) -> None:
    # GIVEN pairs of submits under one key each, with different bodies, released at the same moment
    accepted: dict[str, bytes] = {}
    for index in range(PAIRS):
        key = f"race-{index}"
        outcomes = race(repository, key)
        # THEN exactly one of each pair is the job and the other is refused with 422 IdempotencyConflict
        refused = [body for body, outcome in outcomes.items() if isinstance(outcome, IdempotencyConflict)]
        made = [body for body, outcome in outcomes.items() if isinstance(outcome, dict)]
        assert (len(made), len(refused)) == (1, 1), f"pair {index}: {outcomes}"
        accepted[key] = made[0]
    # AND no refused body was stored or enqueued: every message and every payload object is an accepted body's
    jobs = {(job_id_for(key), hashlib.sha256(body).hexdigest()) for key, body in accepted.items()}
    leaked = set(queued_jobs(deployment)) - jobs
    assert not leaked, f"{len(leaked)} of {PAIRS} pairs enqueued the refused body: {sorted(leaked)}"
    prefix = deployment.names.request_prefix
    listed = deployment.aws.s3.list_objects_v2(Bucket=deployment.names.bucket, Prefix=prefix)
    stored = {tuple(o["Key"].removeprefix(prefix).split("-")) for o in listed.get("Contents", [])}
    assert stored == {(job_id, digest[:16]) for job_id, digest in jobs}
    # WHEN the worker runs the queue
    deployment.drain()
    for key, body in accepted.items():
        job_id = job_id_for(key)
        # THEN each job ran once, on the accepted body
        status = deployment.status(job_id)[1]
        assert status["status"] == "succeeded", status
        assert deployment.result_versions(job_id) == 1
        where = {"Bucket": deployment.names.bucket, "Key": f"{deployment.names.result_prefix}{job_id}"}
        assert json.loads(deployment.aws.s3.get_object(**where)["Body"].read()) == predictions(repository, body)
        # AND the accepted caller's retry replays its own job, and enqueues nothing more
        code, replay = deployment.submit_with(body, {"Idempotency-Key": key})
        assert (code, replay["job_id"], replay.get("replayed")) == (202, job_id, True)
    assert deployment.depth(deployment.queue_url) == 0


def test_a_replay_that_asks_for_another_answer_type_is_refused_naming_accept(
    deployment: AsyncDeploymentUnderTest,
) -> None:
    # GIVEN a job submitted under a key, answered in JSON (no Accept: JSON, as for a direct request)
    code, first = deployment.submit_with(SAMPLE, {"Idempotency-Key": "report-7"})
    assert code == 202
    # WHEN the same key and body come again asking for CSV
    code, refused = deployment.submit_with(SAMPLE, {"Idempotency-Key": "report-7", "Accept": "text/csv"})
    # THEN it is refused (the result is written once, in JSON), naming the header, the value and what the key allows
    assert (code, refused["error"]["type"], refused["error"]["field"]) == (422, "IdempotencyConflict", "Accept")
    assert (refused["error"]["value"], refused["error"]["allowed"].split()[0]) == ("text/csv", "application/json")
    # AND so is another Content-Type for the same bytes (they would be read differently)
    code, refused = deployment.submit_with(SAMPLE, {"Idempotency-Key": "report-7", "Content-Type": "text/csv"})
    assert (code, refused["error"]["field"]) == (422, "Content-Type")
    # AND an Accept that negotiates the same type replays the job
    code, replay = deployment.submit_with(SAMPLE, {"Idempotency-Key": "report-7", "Accept": "application/json, */*"})
    assert (code, replay["job_id"], replay["replayed"]) == (202, first["job_id"], True)


class DyingQueue:
    """The queue client of a submit that dies after claiming its key, before the job's message is sent."""

    def __init__(self, sqs: Any) -> None:
        self.sqs = sqs

    def send_message(self, **_: Any) -> None:
        raise SystemExit("the submit function died here")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sqs, name)


def claimed_until(deployment: AsyncDeploymentUnderTest, job_id: str) -> int:
    """The claim's mark on the job's record: until when its call may still be submitting it."""
    key = {"job_id": {"S": job_id}}
    item = deployment.aws.dynamodb.get_item(TableName=deployment.names.table, Key=key, ConsistentRead=True)["Item"]
    return int(item["submitting_until"]["N"])


def test_a_dead_calls_claim_is_taken_over_by_one_of_two_retries_sent_at_once(
    deployment: AsyncDeploymentUnderTest, repository: ModelRepository
) -> None:
    # GIVEN keyed submits that claimed their keys and died before enqueuing, whose claims' time has passed
    settings = msgspec.structs.replace(AsyncSettings.from_environment(), submit_timeout_sec=1)
    dying = sandbox(repository, settings)
    dying.sqs = DyingQueue(dying.sqs)
    keys = [f"takeover-{index}" for index in range(4)]
    for key in keys:
        with pytest.raises(SystemExit):
            dying.submit(SAMPLE, "application/json", None, idempotency_key=key)
    while max(claimed_until(deployment, job_id_for(key)) for key in keys) >= int(time.time()):
        time.sleep(0.1)
    for key in keys:
        # WHEN two retries of the same request arrive at once, each in its own sandbox
        retry = [functools.partial(sandbox(repository, settings).submit, SAMPLE, "application/json", None,
                                   idempotency_key=key) for _ in range(2)]  # fmt: skip
        outcomes = at_once(*retry)
        # THEN one of them took the claim over, and the other lost it (409) or replays the job
        assert any(isinstance(outcome, dict) and outcome["job_id"] == job_id_for(key) for outcome in outcomes)
        assert all(isinstance(outcome, dict | IdempotencyInProgress) for outcome in outcomes), outcomes
    # AND each job is enqueued once, and runs once
    assert sorted(job for job, _ in queued_jobs(deployment)) == sorted(job_id_for(key) for key in keys)
    deployment.drain()
    for key in keys:
        assert deployment.status(job_id_for(key))[1]["status"] == "succeeded"
        assert deployment.result_versions(job_id_for(key)) == 1
