"""Large bodies (SageMaker async, up to 1 GiB) go to disk as they arrive and an .npy one is decoded where it lies
(issue 38, finding 5); a small body never does."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from servestack.adapters.app import ServingApp
from servestack.adapters.body import SPOOL_BYTES, ASGIBody, ReadDeadlines, SpooledBody
from servestack.inference.errors import PayloadTooLarge
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings

ARTIFACTS = Path(__file__).resolve().parents[2] / "models" / "artifacts"
CHUNK = 1024 * 1024


def receive_of(body: bytes) -> Any:
    """ASGI's `receive` handing over `body` in 1 MiB chunks, as a server does."""
    chunks = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
    messages = iter(
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1} for i, chunk in enumerate(chunks)
    )

    async def receive() -> dict[str, Any]:
        return next(messages)

    return receive


def read(body: bytes, limit: int, declared: int) -> bytes | SpooledBody:
    async def reading() -> bytes | SpooledBody:
        return await ASGIBody(receive_of(body)).read(limit, str(declared), ReadDeadlines(10.0))

    return asyncio.run(reading())


def npy_of(array: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


def test_a_body_declared_past_the_spool_size_is_written_to_a_file_not_held() -> None:
    # GIVEN a body a little past the spool size, with its length declared
    body = np.random.default_rng(1).bytes(SPOOL_BYTES + 5)
    # WHEN it is read
    spooled = read(body, 2 * SPOOL_BYTES, len(body))
    # THEN it is in a file, whose mapping holds the same bytes
    assert isinstance(spooled, SpooledBody)
    assert len(spooled) == len(body)
    assert spooled.mapped()[:] == body


def test_a_small_body_is_bytes_as_before() -> None:
    # GIVEN a realtime-sized body
    body = b"x" * 1000
    # WHEN it is read
    # THEN it is the bytes themselves
    assert read(body, 6 * CHUNK, len(body)) == body


def test_a_spooled_body_past_the_limit_is_a_413() -> None:
    # GIVEN a body that declares less than it sends, past the limit
    body = b"y" * (SPOOL_BYTES + 3 * CHUNK)
    # WHEN it is read under a limit between the two
    # THEN the limit stops it while it is spooled
    with pytest.raises(PayloadTooLarge):
        read(body, SPOOL_BYTES + CHUNK, SPOOL_BYTES + 1)


@pytest.fixture(scope="module")
def async_container() -> ServingApp:
    settings = ServingSettings(
        model_dir=ARTIFACTS,
        default_model="breast-cancer",
        warmup=False,
        max_payload_bytes=64 * CHUNK,
        max_batch_rows=64 * CHUNK,
        max_queue_rows=64 * CHUNK,
    )
    repository = ModelRepository(settings)
    repository.load_all()
    return ServingApp(repository)


async def invoke(app: ServingApp, body: bytes, content_type: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://container") as client:
        return await client.post(
            "/invocations", content=body, headers={"content-type": content_type, "accept": "application/x-npy"}
        )


def test_a_spooled_npy_job_is_answered_as_its_rows_are_one_by_one(async_container: ServingApp) -> None:
    # GIVEN an async job of 20 MiB of breast-cancer rows (float32 x 30), past the spool size
    rows = np.random.default_rng(7).normal(10.0, 5.0, size=(SPOOL_BYTES // 120 + 10_000, 30)).astype(np.float32)
    # WHEN the container answers it, and the first rows alone, sent small
    whole = asyncio.run(invoke(async_container, npy_of(rows), "application/x-npy"))
    head = asyncio.run(invoke(async_container, npy_of(rows[:50]), "application/x-npy"))
    # THEN every row has its label, and the first ones are those of the small request
    assert whole.status_code == 200, whole.text
    labels = np.load(io.BytesIO(whole.content))
    assert labels.shape == (len(rows),)
    np.testing.assert_array_equal(labels[:50], np.load(io.BytesIO(head.content)))


def test_a_spooled_json_job_is_parsed_from_the_file(async_container: ServingApp) -> None:
    # GIVEN a JSON job past the spool size
    # (every digit of each number: fewer rows to parse and score for the same size than short numbers would take)
    rows = np.random.default_rng(3).normal(10.0, 5.0, size=(32_000, 30))
    body = json.dumps({"instances": rows.tolist()}).encode()
    assert len(body) > SPOOL_BYTES
    # WHEN the container answers it
    answer = asyncio.run(invoke(async_container, body, "application/json"))
    # THEN every row has its label
    assert answer.status_code == 200, answer.text
    assert np.load(io.BytesIO(answer.content)).shape == (len(rows),)
