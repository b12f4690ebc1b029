"""servestack's clients against real servers: predictions, batching, errors, and retries on 429."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from servestack.client import (
    AsyncServingClient,
    RetryPolicy,
    ServingClient,
    ServingClientError,
    SigV4,
    parse_retry_after,
)
from tests.conftest import RealtimeServer

pytestmark = pytest.mark.slow


def test_predict_and_predict_many_match_scikit_learn(
    realtime_server: RealtimeServer, digits: tuple[np.ndarray, np.ndarray], sklearn_digits: object
) -> None:
    features, _ = digits
    sent: list[httpx.Request] = []
    with ServingClient(realtime_server.url) as client:
        client.http.event_hooks["request"].append(sent.append)
        one = client.predict(features[:2].tolist())
        many = client.predict_many(features[:100], batch_size=32)
    expected = sklearn_digits.predict(features[:100]).tolist()  # type: ignore[attr-defined]
    assert one["predictions"] == expected[:2]
    assert many["predictions"] == expected
    assert len(many["probabilities"]) == 100
    assert len(sent) == 1 + 4  # 100 rows in batches of 32


def test_npy_and_named_models(realtime_server: RealtimeServer, digits: tuple[np.ndarray, np.ndarray]) -> None:
    features, targets = digits
    with ServingClient(realtime_server.url, content_type="application/x-npy") as client:
        answer = client.predict(features[:8], model="digits", accept="application/x-npy")
    assert answer["predictions"] == targets[:8].tolist()


def test_a_user_error_is_raised_at_once_not_retried(realtime_server: RealtimeServer) -> None:
    with ServingClient(realtime_server.url) as client, pytest.raises(ServingClientError) as caught:
        client.predict([[0.0] * 63])
    assert caught.value.status_code == 400
    assert caught.value.attempts == 1
    assert caught.value.body["error"]["field"] == "instances[0]"


def test_client_retries_429_from_a_tiny_queue_and_succeeds(
    tmp_path: Path, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    # GIVEN a real server whose worker admits one request at a time, and holds it up to 20 ms to gather a batch
    server = RealtimeServer.start(tmp_path, env={"SERVESTACK_MAX_QUEUE_REQUESTS": "1", "SERVESTACK_MAX_DELAY_MS": "20"})
    features, targets = digits
    statuses: list[int] = []

    async def record(response: httpx.Response) -> None:
        statuses.append(response.status_code)

    async def burst() -> list[dict[str, object]]:
        retry = RetryPolicy(max_attempts=60, base_delay_sec=0.01, max_delay_sec=0.2)
        async with AsyncServingClient(server.url, retry=retry) as client:
            client.http.event_hooks["response"].append(record)
            return await asyncio.gather(*(client.predict(features[i : i + 1].tolist()) for i in range(40)))

    try:
        # WHEN 40 requests arrive at once (again, up to 5 bursts: a request that finds nothing queued runs at once,
        # so on a busy machine a burst can be served one by one without ever filling the queue)
        for bursts in range(1, 6):
            answers = asyncio.run(burst())
            # THEN every request of each burst succeeded once capacity freed
            assert statuses.count(200) == 40 * bursts
            assert [a["predictions"][0] for a in answers] == targets[:40].tolist()  # type: ignore[index]
            if 429 in statuses:
                break
    finally:
        server.stop()
    # AND the excess got 429 (and was retried)
    assert 429 in statuses


def test_retry_after_is_honoured_over_a_shorter_backoff() -> None:
    policy = RetryPolicy(base_delay_sec=0.001, max_delay_sec=0.002)
    assert policy.delay_sec(0, "2") == 2.0
    assert policy.delay_sec(3, None) <= 0.002
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert parse_retry_after("soon") is None


def test_sigv4_signs_function_url_requests() -> None:
    import boto3

    session = boto3.Session(
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        region_name="us-east-1",
    )
    captured: list[httpx.Request] = []

    def lambda_url(request: httpx.Request) -> httpx.Response:
        captured.append(request)
        return httpx.Response(200, json={"predictions": [0]})

    client = ServingClient(
        "https://abc.lambda-url.us-east-1.on.aws",
        auth=SigV4("us-east-1", "lambda", session),
        transport=httpx.MockTransport(lambda_url),
    )
    assert client.predict([[0.0] * 64]) == {"predictions": [0]}
    authorization = captured[0].headers["authorization"]
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/us-east-1/lambda/aws4_request" in authorization
    assert "x-amz-date" in captured[0].headers
