"""The Lambda handler with real event shapes: HTTP API v2, REST v1, Function URL and ALB."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import orjson
import pytest

from tests.conftest import ARTIFACTS, LambdaHandler, lambda_event, response_body

SAMPLE = (ARTIFACTS / "digits" / "1" / "sample-request.json").read_bytes()
EXPECTED = json.loads((ARTIFACTS / "digits" / "1" / "sample-response.json").read_text())
KINDS = ["http-api-v2", "rest-v1", "function-url", "alb"]


@pytest.fixture(scope="module")
def handler(lambda_handler: LambdaHandler) -> LambdaHandler:
    return lambda_handler


def invoke(handler: Any, event: dict[str, Any]) -> tuple[int, bytes, dict[str, str]]:
    response = handler(event)
    headers = {name.lower(): value for name, value in (response.get("headers") or {}).items()}
    for name, values in (response.get("multiValueHeaders") or {}).items():
        headers[name.lower()] = values[0]
    return response["statusCode"], response_body(response), headers


def test_models_are_loaded_during_init_not_per_request() -> None:
    from servestack.adapters import serverless

    assert serverless.repository.ready
    assert all(model.runtime.warmed_up for model in serverless.repository.models())


@pytest.mark.parametrize("kind", KINDS)
def test_every_event_source_gets_200_and_the_same_predictions(handler: Any, kind: str) -> None:
    status, body, headers = invoke(handler, lambda_event(kind, SAMPLE, headers={"content-type": "application/json"}))
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert orjson.loads(body)["predictions"] == EXPECTED["predictions"]


def test_identical_bodies_across_event_sources(handler: Any) -> None:
    bodies = {kind: invoke(handler, lambda_event(kind, SAMPLE))[1] for kind in KINDS}
    assert len(set(bodies.values())) == 1


@pytest.mark.parametrize("kind", ["http-api-v2", "rest-v1"])
def test_user_mistakes_are_json_4xx_not_invocation_errors(handler: Any, kind: str) -> None:
    status, body, _ = invoke(handler, lambda_event(kind, b'{"instances": [[1, 2]]}'))
    assert status == 400
    assert orjson.loads(body)["error"]["field"] == "instances[0]"
    status, body, _ = invoke(handler, lambda_event(kind, b"x", headers={"content-type": "text/plain"}))
    assert status == 415


def test_binary_npy_through_base64_events(handler: Any, digits: tuple[np.ndarray, np.ndarray]) -> None:
    features, targets = digits
    buffer = io.BytesIO()
    np.save(buffer, features[:16])
    event = lambda_event(
        "http-api-v2", buffer.getvalue(), headers={"content-type": "application/x-npy", "accept": "application/x-npy"}
    )
    assert event["isBase64Encoded"] is True
    status, body, headers = invoke(handler, event)
    assert status == 200
    assert headers["content-type"] == "application/x-npy"
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), targets[:16])


def test_rest_surface_and_ping_through_lambda(handler: Any) -> None:
    status, body, _ = invoke(handler, lambda_event("http-api-v2", b"", path="/ping", method="GET"))
    assert (status, orjson.loads(body)) == (200, {"status": "ready"})
    status, body, _ = invoke(handler, lambda_event("function-url", SAMPLE, path="/v1/models/digits/predict"))
    assert status == 200
    assert orjson.loads(body)["predictions"] == EXPECTED["predictions"]
    status, _, _ = invoke(handler, lambda_event("alb", SAMPLE, path="/v1/models/fraud/predict"))
    assert status == 404
