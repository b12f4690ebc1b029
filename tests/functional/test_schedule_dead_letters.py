"""A schedule's dead letters under enforced IAM: local up's sender, as the schedule's role, against moto behind
the IAM engine over HTTP.

EventBridge Scheduler needs only `sqs:SendMessage` on a target's dead-letter queue, and that is all the
templates grant the schedule's role; a refusal of the send is the schedule's log line, not the end of its
thread.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from servestack.local.iam import IamEnforcer, Identity, IdentityStore, ResourcePolicies
from servestack.local.iam.server import EnforcedMotoServer
from servestack.local.scheduler.schedules import ScheduleRunner, queue_url_of
from servestack.local.up.services import dead_letter_sender
from tests.unit.test_local_services import FakeLambdas, schedule

ACCOUNT = "123456789012"
REGION = "us-east-1"


@pytest.fixture(scope="module")
def emulator() -> Iterator[tuple[str, IdentityStore]]:
    store = IdentityStore()
    store.developer()
    server = EnforcedMotoServer(IamEnforcer(store, ResourcePolicies(), log=lambda _: None)).start()
    yield server.url, store
    server.stop()


@pytest.fixture
def dead_letters(emulator: tuple[str, IdentityStore]) -> tuple[str, str]:
    """A dead-letter queue made by the developer: (its ARN, its URL)."""
    url = emulator[0]
    sqs = boto3.client("sqs", endpoint_url=url, region_name=REGION, aws_access_key_id="local",
                       aws_secret_access_key="local")  # fmt: skip
    name = f"dlq-{uuid.uuid4().hex[:10]}"
    queue_url = sqs.create_queue(QueueName=name)["QueueUrl"]
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}", queue_url


def schedule_role(store: IdentityStore, *statements: dict[str, Any]) -> Identity:
    document = {"Version": "2012-10-17", "Statement": list(statements)}
    return store.role(f"sched-{uuid.uuid4().hex[:8]}", {"Policy": document}, session_name="scheduler")


def runner_as(role: Identity, url: str, dead_letter_arn: str) -> ScheduleRunner:
    """A schedule whose one invocation fails, with local up's dead-letter sender acting as `role`."""
    keys = {"arn": role.arn, **role.environment()}
    send = dead_letter_sender(SimpleNamespace(emulator_url=url, region=REGION), keys)  # type: ignore[arg-type]
    target = replace(schedule(0), dead_letter_arn=dead_letter_arn)
    return ScheduleRunner(target, FakeLambdas([500] * 100), lambda *_: None, send, backoff_sec=0)  # type: ignore[arg-type]


def developer_receives(url: str, queue_url: str) -> list[dict[str, Any]]:
    sqs = boto3.client("sqs", endpoint_url=url, region_name=REGION, aws_access_key_id="local",
                       aws_secret_access_key="local")  # fmt: skip
    got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])
    return list(got.get("Messages", []))


def test_a_role_granted_only_send_message_dead_letters_the_event(
    emulator: tuple[str, IdentityStore], dead_letters: tuple[str, str]
) -> None:
    # GIVEN a schedule role that may only sqs:SendMessage to its dead-letter queue (what the templates grant)
    url, store = emulator
    arn, queue_url = dead_letters
    role = schedule_role(store, {"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": arn})
    # WHEN the schedule's invocation fails
    assert runner_as(role, url, arn).fire() is False
    # THEN the event reached the queue with Scheduler's attributes (no sqs:GetQueueUrl was needed)
    (message,) = developer_receives(url, queue_url)
    assert json.loads(message["Body"]) == {"run": 1}
    assert message["MessageAttributes"]["X-Amz-Scheduler-Attempt"]["StringValue"] == "1"


def test_a_refused_dead_letter_is_logged_and_the_schedule_keeps_firing(
    emulator: tuple[str, IdentityStore], dead_letters: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a schedule role with no grant on its dead-letter queue
    url, store = emulator
    arn, queue_url = dead_letters
    role = schedule_role(store, {"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": f"{arn}-other"})
    runner = runner_as(role, url, arn)
    # WHEN the schedule fires twice, each time failing and its dead letter refused
    with caplog.at_level(logging.ERROR, logger="servestack.local"):
        assert runner.fire() is False
        assert runner.fire() is False
    # THEN each refusal is logged with AWS's error, and nothing reached the queue
    refusals = [r.getMessage() for r in caplog.records if "dead-letter queue" in r.getMessage()]
    assert len(refusals) == 2
    assert "AccessDenied" in refusals[0]
    assert f"{arn}" in refusals[0]
    assert developer_receives(url, queue_url) == []


class FiringNow(ScheduleRunner):
    """A runner whose expression is due at once, every time (the real clock would wait a minute)."""

    def next_fire(self) -> datetime:
        return datetime.now(UTC)


def test_the_schedule_thread_survives_refused_dead_letters(
    emulator: tuple[str, IdentityStore], dead_letters: tuple[str, str]
) -> None:
    # GIVEN a running schedule whose role may not send to its dead-letter queue
    url, store = emulator
    arn, _ = dead_letters
    role = schedule_role(store, {"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": f"{arn}-other"})
    runner = runner_as(role, url, arn)
    firing = FiringNow(runner.schedule, runner.lambdas, runner.authorize, runner.send_dead_letter, backoff_sec=0)
    firing.start()
    try:
        # WHEN it fires again and again THEN its thread stays alive and keeps firing
        deadline = time.monotonic() + 30
        while firing.runs < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert firing.runs >= 3
        assert firing._thread is not None
        assert firing._thread.is_alive()
    finally:
        firing.stop()


def test_a_queue_url_comes_from_the_arn_and_a_non_queue_arn_is_refused() -> None:
    assert queue_url_of(f"arn:aws:sqs:{REGION}:{ACCOUNT}:dlq", "http://127.0.0.1:5000/") == (
        f"http://127.0.0.1:5000/{ACCOUNT}/dlq"
    )
    for wrong in ("dlq", f"arn:aws:sns:{REGION}:{ACCOUNT}:topic", f"arn:aws:sqs:{REGION}:{ACCOUNT}:"):
        with pytest.raises(ValueError, match="is not an SQS queue ARN"):
            queue_url_of(wrong, "http://127.0.0.1:5000")
