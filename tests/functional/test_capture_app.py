"""Data capture behind the HTTP app (servestack/adapters/app.py, the realtime container's and the Lambda
function's): a user's ColumnTransformer pipeline (tests/pipeline_model.py) answers requests in several forms,
and each sampled one becomes one record of docs/monitoring.md's format, without the excluded column, once its
answer is sent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import orjson
import pytest

from servestack.adapters.app import ServingApp
from servestack.inference.capture import records_of
from servestack.inference.media_types import request_type_of
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings
from servestack.monitor.records import captured_body
from tests.pipeline_model import COLUMNS, PipelineModel, pipeline_model

pytestmark = pytest.mark.slow


def capture_app(built: PipelineModel, **capture: Any) -> tuple[ServingApp, list[bytes]]:
    setting = {"deployment": "flowers-api", "mode": "serverless"} | capture
    settings = ServingSettings(
        model_dir=built.root, default_model="flowers", warmup=False, capture=json.dumps(setting), variant_name=""
    )
    repository = ModelRepository(settings)
    repository.load_all()
    app = ServingApp(repository)
    lines: list[bytes] = []
    assert app.capturer is not None
    app.capturer.write = lines.append
    return app, lines


async def post(app: ServingApp, bodies: list[tuple[bytes, str]]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        return [
            await client.post("/invocations", content=body, headers={"content-type": kind}) for body, kind in bodies
        ]


def bodies(built: PipelineModel) -> list[tuple[bytes, str]]:
    rows = [{name: built.rows[name][i] for name in COLUMNS} for i in range(len(built.expected))]
    header = ",".join(COLUMNS)
    csv_rows = "\n".join(",".join(str(row[name]) for name in COLUMNS) for row in rows)
    return [
        (orjson.dumps({"inputs": built.rows}), "application/json"),
        (orjson.dumps({"dataframe_records": rows}), "application/json"),
        (f"{header}\n{csv_rows}\n".encode(), "text/csv; header=present"),
    ]


def test_every_answered_request_is_captured_without_the_excluded_column() -> None:
    built = pipeline_model()
    app, lines = capture_app(built, exclude_columns=["site"])

    answers = asyncio.run(post(app, [*bodies(built), (b'{"inputs": {"nope": [1]}}', "application/json")]))

    assert [a.status_code for a in answers] == [200, 200, 200, 400]  # a refused request is not captured
    records = records_of(lines)
    assert len(records) == 3
    for record, answer in zip(records, answers, strict=False):
        assert record["servestack"]["model"] == "flowers"
        assert record["servestack"]["mode"] == "serverless"
        assert record["captureData"]["endpointOutput"]["data"] == answer.text
        captured = orjson.loads(record["captureData"]["endpointInput"]["data"])["inputs"]
        assert list(captured) == [c for c in COLUMNS if c != "site"]
        assert captured["sepal_length"] == pytest.approx(built.rows["sepal_length"])
        # the excluded column's values appear nowhere in the line
        assert not any(site in json.dumps(record) for site in ("north", "south", "east"))


def test_a_captured_input_is_a_request_the_model_answers_alike() -> None:
    built = pipeline_model()
    app, lines = capture_app(built, what="inputs")

    (first,) = asyncio.run(post(app, bodies(built)[1:2]))
    (record,) = records_of(lines)
    (replayed,) = asyncio.run(
        post(app, [(record["captureData"]["endpointInput"]["data"].encode(), "application/json")])
    )

    assert "endpointOutput" not in record["captureData"]
    assert replayed.json() == first.json()


def test_ten_percent_of_2000_answered_requests_are_captured_within_binomial_bounds() -> None:
    """Through the app itself, its own random source: 2,000 requests at 10% (mean 200, sd 13.4); the bound of
    4.5 sd fails a correct sampler about once in 150,000 runs."""
    built = pipeline_model()
    app, lines = capture_app(built, sample_percent=10)
    body = bodies(built)[0][0]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/invocations",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def run() -> None:
        for _ in range(2000):
            await app(scope, receive, send)

    asyncio.run(run())

    assert statuses == [200] * 2000
    assert abs(len(lines) - 200) <= 4.5 * (2000 * 0.1 * 0.9) ** 0.5, len(lines)
    assert len(records_of(lines)) == len(lines)


def test_without_excluded_columns_a_record_holds_the_body_as_it_came_which_monitor_reads_alike() -> None:
    # GIVEN capture without excluded columns, and requests in three forms (JSON columns, JSON records, CSV)
    built = pipeline_model()
    app, lines = capture_app(built)
    sent = bodies(built)

    answers = asyncio.run(post(app, sent))

    # THEN each record's input is the request's own body and media type, as SageMaker's own capture writes it
    records = records_of(lines)
    assert [a.status_code for a in answers] == [200, 200, 200]
    for record, (body, kind), answer in zip(records, sent, answers, strict=True):
        recorded = record["captureData"]["endpointInput"]
        assert recorded["observedContentType"] == kind
        assert recorded["encoding"] == ("CSV" if kind.startswith("text/csv") else "JSON")
        assert recorded["data"].encode() == body
        assert record["captureData"]["endpointOutput"]["data"] == answer.text
    # AND the monitor's reader decodes each, with the model's own decoder, to the arrays the server read
    model = app.repository.get("flowers")
    for record, (body, kind) in zip(records, sent, strict=True):
        recorded_body, recorded_type = captured_body(record["captureData"]["endpointInput"])
        decoded, served = model.decode(recorded_body, recorded_type), model.decode(body, request_type_of(kind))
        assert decoded.keys() == served.keys()
        for name in served:
            assert decoded[name].tolist() == served[name].tolist()
