"""`SageMakerClient` retries overload that crosses SageMaker (ModelError carrying 429/503, throttling) with
full-jitter backoff inside one deadline, against botocore's own client and response parsing (a Stubber)."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Iterator

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.response import StreamingBody
from botocore.stub import Stubber

from servestack.client import SageMakerClient

ANSWER = json.dumps({"predictions": [3]}).encode()


class FakeClock:
    """Time that passes only when the client sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def runtime() -> Iterator[tuple[object, Stubber]]:
    session = boto3.session.Session(region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test")
    client = session.client("sagemaker-runtime")
    with Stubber(client) as stubber:
        yield client, stubber


def model_error(stubber: Stubber, original_status: int) -> None:
    """What SageMaker answers when the container answered `original_status`: HTTP 424 ModelError."""
    stubber.add_client_error(
        "invoke_endpoint",
        service_error_code="ModelError",
        service_message=f'Received client error ({original_status}) from primary with message "..."',
        http_status_code=424,
        modeled_fields={
            "OriginalStatusCode": original_status,
            "OriginalMessage": '{"error": {"type": "Overloaded"}}',
            "LogStreamArn": "arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/Endpoints/e",
        },
    )


def success(stubber: Stubber) -> None:
    stubber.add_response(
        "invoke_endpoint",
        {"Body": StreamingBody(io.BytesIO(ANSWER), len(ANSWER)), "ContentType": "application/json"},
    )


def client_for(runtime: object, clock: FakeClock, **options: object) -> SageMakerClient:
    return SageMakerClient(
        "e",
        runtime=runtime,
        sleep=clock.sleep,
        clock=clock,
        rng=random.Random(7),  # noqa: S311 - a seeded jitter, not cryptography
        **options,  # type: ignore[arg-type]
    )


def test_a_424_carrying_429_is_retried_until_the_container_answers(runtime: tuple[object, Stubber]) -> None:
    client, stubber = runtime
    clock = FakeClock()
    # GIVEN a container that answers 429, then 503, then a throttled SageMaker, then success
    model_error(stubber, 429)
    model_error(stubber, 503)
    stubber.add_client_error("invoke_endpoint", service_error_code="ThrottlingException", http_status_code=400)
    success(stubber)

    # WHEN the client predicts
    answer = client_for(client, clock, deadline_sec=30.0).predict([[0.0] * 64])

    # THEN it got the answer after three full-jitter waits, each within its exponential cap
    assert answer == {"predictions": [3]}
    assert len(clock.sleeps) == 3
    stubber.assert_no_pending_responses()
    for attempt, waited in enumerate(clock.sleeps):
        assert 0 <= waited <= 0.05 * 2**attempt


def test_retries_stop_at_the_deadline_and_raise_the_last_model_error(runtime: tuple[object, Stubber]) -> None:
    client, stubber = runtime
    clock = FakeClock()
    # GIVEN a container that answers 429 to every attempt, and a client with a 1 s deadline, whose backoff
    # grows to several seconds
    for _ in range(20):
        model_error(stubber, 429)

    # WHEN the client predicts
    sagemaker = client_for(client, clock, deadline_sec=1.0, max_attempts=20, base_delay_sec=0.2, max_delay_sec=5.0)
    with pytest.raises(ClientError) as raised:
        sagemaker.predict([[0.0] * 64])

    # THEN it gave up without sleeping past the deadline, raising SageMaker's ModelError as botocore parsed it
    assert raised.value.response["Error"]["Code"] == "ModelError"
    assert raised.value.response["OriginalStatusCode"] == 429
    assert sum(clock.sleeps) <= 1.0
    assert 1 <= len(clock.sleeps) < 19  # it stopped for the deadline, not for lack of attempts


@pytest.mark.parametrize("status", [400, 413, 500])
def test_a_container_error_that_is_not_overload_is_raised_at_once(runtime: tuple[object, Stubber], status: int) -> None:
    client, stubber = runtime
    clock = FakeClock()
    # GIVEN a container that refuses the request for another reason
    model_error(stubber, status)

    # WHEN the client predicts THEN the ModelError is raised without any retry
    with pytest.raises(ClientError) as raised:
        client_for(client, clock).predict([[0.0]])
    assert raised.value.response["OriginalStatusCode"] == status
    assert clock.sleeps == []
    stubber.assert_no_pending_responses()
