"""Overload against the real container: a burst far past what one worker admits is answered 200 or 429 with
`Retry-After`, never 5xx, whether the refusal is made after the model is resolved (the first request of a
target) or before (the precomputed 429 of a worker already full). Statuses only: no timing is asserted."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.conftest import ARTIFACTS, RealtimeServer

SAMPLE = (ARTIFACTS / "digits" / "1" / "sample-request.json").read_bytes()


def npy_batch(rows: int) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ones((rows, 64), dtype=np.float32))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def tiny_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    # A worker that admits one request at a time and pauses refusals briefly.
    env = {"SERVESTACK_MAX_QUEUE_REQUESTS": "1", "SERVESTACK_REJECT_PAUSE_MS": "20", "SERVESTACK_WORKERS": "1"}
    server = RealtimeServer.start(tmp_path_factory.mktemp("overload"), env=env)
    yield server
    server.stop()


async def burst(url: str, bodies: list[tuple[bytes, str]]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        return list(
            await asyncio.gather(
                *(
                    client.post(
                        "/invocations",
                        content=body,
                        headers={"Content-Type": content_type, "X-Amzn-SageMaker-Custom-Attributes": "trace=1"},
                    )
                    for body, content_type in bodies
                )
            )
        )


def check_refusals(responses: list[httpx.Response]) -> None:
    statuses = [response.status_code for response in responses]
    assert set(statuses) <= {200, 429}, statuses  # no 5xx, no timeouts turned into errors
    assert 200 in statuses
    for response in responses:
        if response.status_code == 429:
            assert int(response.headers["retry-after"]) >= 1
            assert response.json()["error"]["type"] == "Overloaded"
            assert response.json()["error"]["field"] == "queue"
            assert response.headers["x-amzn-sagemaker-custom-attributes"] == "trace=1"


def test_a_burst_past_the_queue_is_answered_200_or_429_with_retry_after(tiny_worker: RealtimeServer) -> None:
    # GIVEN a worker that has served its target once (so a full worker refuses before reading the model)
    assert httpx.post(f"{tiny_worker.url}/invocations", content=SAMPLE, headers={"Content-Type": "application/json"})
    # WHEN 96 requests, JSON and 256-row .npy, arrive at once (again, up to 5 bursts: a request that finds nothing
    # queued runs at once, so on a busy machine whose client opens its connections slowly a burst can be served
    # one by one without ever filling the queue)
    bodies = [(SAMPLE, "application/json")] * 48 + [(npy_batch(256), "application/x-npy")] * 48
    statuses: list[int] = []
    for _ in range(5):
        responses = asyncio.run(burst(tiny_worker.url, bodies))
        # THEN each is a 200 or a 429 with Retry-After and the error body
        check_refusals(responses)
        statuses += [response.status_code for response in responses]
        if 429 in statuses:
            break
    # AND some were refused
    assert 429 in statuses


def test_clients_retrying_at_once_all_get_served_without_a_5xx(tiny_worker: RealtimeServer) -> None:
    # GIVEN 32 clients that retry a refused request at once, ignoring Retry-After
    async def client_until_served(client: httpx.AsyncClient) -> list[int]:
        seen = []
        for _ in range(200):
            response = await client.post("/invocations", content=SAMPLE, headers={"Content-Type": "application/json"})
            seen.append(response.status_code)
            if response.status_code == 200:
                break
        return seen

    async def storm() -> list[list[int]]:
        async with httpx.AsyncClient(base_url=tiny_worker.url, timeout=30) as client:
            return list(await asyncio.gather(*(client_until_served(client) for _ in range(32))))

    # WHEN they run together
    histories = asyncio.run(storm())
    # THEN every client was served in the end and nothing but 200 and 429 was ever answered
    assert all(history[-1] == 200 for history in histories)
    assert {status for history in histories for status in history} <= {200, 429}


def test_the_worker_still_answers_ping_and_serves_after_the_storm(tiny_worker: RealtimeServer) -> None:
    assert httpx.get(f"{tiny_worker.url}/ping").status_code == 200
    response = httpx.post(
        f"{tiny_worker.url}/invocations", content=SAMPLE, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 200
