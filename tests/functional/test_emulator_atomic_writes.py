"""Conditional writes in the emulator are atomic, as AWS documents them: of concurrent writers racing for one
key with a condition, exactly one wins. moto's backends check a condition, then write, in Python, while the
server answers each request on its own thread; without the emulator's serialization two writers could both see
the key free (an async job enqueued twice: tests/integration/test_async_idempotency.py found it under load).

- DynamoDB: "conditional writes are idempotent ... and atomic" (a `ConditionExpression` holds at the moment
  of the write): https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/WorkingWithItems.html
- S3: "conditional writes ... If multiple conditional writes occur for the same object name, the first write
  operation to finish succeeds": https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from botocore.exceptions import ClientError

from servestack.local.emulator.moto_server import EmbeddedEmulator, clients

WRITERS = 8
ROUNDS = 40


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmbeddedEmulator]:
    started = EmbeddedEmulator()
    yield started
    started.stop()


def winners(attempts: Sequence[Callable[[], Any]]) -> int:
    """How many of `attempts`, released at once on threads of their own, succeeded (a ClientError is a loss)."""
    start = threading.Barrier(len(attempts))
    won: list[bool] = []

    def attempt(write: Callable[[], Any]) -> None:
        start.wait()
        try:
            write()
        except ClientError:
            won.append(False)
        else:
            won.append(True)

    threads = [threading.Thread(target=attempt, args=(write,)) for write in attempts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(won) == len(attempts)
    return sum(won)


def test_of_concurrent_conditional_puts_of_one_item_exactly_one_wins(emulator: EmbeddedEmulator) -> None:
    # GIVEN a table, and a client per writer (as separate processes would have)
    dynamodb = clients(emulator.url)["dynamodb"]
    dynamodb.create_table(
        TableName="claims", BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
    )  # fmt: skip
    writers = [clients(emulator.url)["dynamodb"] for _ in range(WRITERS)]
    for round_ in range(ROUNDS):
        # WHEN every writer claims the same new key at once, on condition that nobody holds it
        attempts = [
            functools.partial(
                client.put_item, TableName="claims", Item={"key": {"S": f"k{round_}"}, "by": {"N": str(index)}},
                ConditionExpression="attribute_not_exists(#k)", ExpressionAttributeNames={"#k": "key"},
            )
            for index, client in enumerate(writers)
        ]  # fmt: skip
        # THEN exactly one of them holds it
        assert winners(attempts) == 1, f"round {round_}"


def test_of_concurrent_if_none_match_puts_of_one_object_exactly_one_wins(emulator: EmbeddedEmulator) -> None:
    s3 = clients(emulator.url)["s3"]
    s3.create_bucket(Bucket="results")
    writers = [clients(emulator.url)["s3"] for _ in range(WRITERS)]
    for round_ in range(ROUNDS):
        # WHEN every writer writes the same new key at once, if none is there
        attempts = [
            functools.partial(client.put_object, Bucket="results", Key=f"r{round_}", Body=str(index).encode(),
                              IfNoneMatch="*")
            for index, client in enumerate(writers)
        ]  # fmt: skip
        # THEN exactly one wrote it
        assert winners(attempts) == 1, f"round {round_}"
