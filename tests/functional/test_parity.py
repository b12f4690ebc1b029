"""One core, every mode: the same rows give identical predictions through the core, the realtime server
and the Lambda handler."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings
from tests.conftest import LambdaHandler, RealtimeServer, lambda_event, response_body

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("model", "dataset"), [("digits", "load_digits"), ("breast-cancer", "load_breast_cancer")])
def test_core_realtime_and_lambda_agree_exactly(
    realtime_server: RealtimeServer, lambda_handler: LambdaHandler, model: str, dataset: str
) -> None:
    import sklearn.datasets

    rows = getattr(sklearn.datasets, dataset)().data.astype(np.float32)[::7]
    body = orjson.dumps({"instances": rows.tolist()})

    repository = ModelRepository(ServingSettings())
    repository.load_all()
    core: dict[str, Any] = orjson.loads(repository.get(model).infer(body, "application/json", None).body)

    served = httpx.post(
        f"{realtime_server.url}/v1/models/{model}/predict", content=body, headers={"content-type": "application/json"}
    )
    lambda_response = lambda_handler(lambda_event("http-api-v2", body, path=f"/v1/models/{model}/predict"))

    assert served.status_code == 200
    assert lambda_response["statusCode"] == 200
    assert orjson.loads(served.content) == core
    assert orjson.loads(response_body(lambda_response)) == core
    assert len(core["predictions"]) == len(rows)
