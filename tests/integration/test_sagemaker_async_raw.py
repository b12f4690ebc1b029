"""`backend: sagemaker` with a body no codec reads (issue 36): the submit API stores a PNG as `image/png`, passes
that type to InvokeEndpointAsync, and the container's `/invocations` hands the bytes to the model's hook, as the
Lambda backend's worker does (tests/integration/test_async_raw_bodies.py)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import servestack.adapters.asynchronous
from tests.conftest import RealtimeServer
from tests.functional.test_raw_bodies import png
from tests.integration.asyncjobs import AsyncDeploymentUnderTest, deploy_async
from tests.integration.conftest import Aws
from tests.integration.test_async_raw_bodies import expected, model_dir
from tests.integration.test_sagemaker_async import SageMakerBackend

pytestmark = pytest.mark.slow
__all__ = ["model_dir"]  # the fixture, shared


@pytest.fixture(scope="module")
def container(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    env = {"SERVESTACK_MODEL_DIR": str(model_dir), "SERVESTACK_DEFAULT_MODEL": "raw-digits"}
    server = RealtimeServer.start(tmp_path_factory.mktemp("async-raw-container"), env=env)
    yield server
    server.stop()


@pytest.fixture
def backend(
    aws: Aws, unique: str, monkeypatch: pytest.MonkeyPatch, container: RealtimeServer, model_dir: Path
) -> Iterator[tuple[AsyncDeploymentUnderTest, SageMakerBackend]]:
    deployment = deploy_async(aws, unique, monkeypatch, backend="sagemaker")
    sagemaker = SageMakerBackend(aws, deployment, container)
    monkeypatch.setenv("SERVESTACK_MODEL_DIR", str(model_dir))
    monkeypatch.setenv("SERVESTACK_DEFAULT_MODEL", "raw-digits")
    monkeypatch.setenv("SERVESTACK_ASYNC_BACKEND", "sagemaker")
    monkeypatch.setenv("SERVESTACK_ENDPOINT_NAME", sagemaker.endpoint_name)
    monkeypatch.setenv("SERVESTACK_FAILURE_PREFIX", sagemaker.failure_prefix)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", sagemaker.api.url)
    servestack.adapters.asynchronous.service.cache_clear()
    servestack.adapters.asynchronous.recorder.cache_clear()
    yield deployment, sagemaker
    sagemaker.close()
    servestack.adapters.asynchronous.service.cache_clear()
    servestack.adapters.asynchronous.recorder.cache_clear()


def fetch(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def test_an_image_job_runs_on_the_sagemaker_endpoint(
    backend: tuple[AsyncDeploymentUnderTest, SageMakerBackend], model_dir: Path, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    deployment, sagemaker = backend
    features, _ = digits
    # GIVEN a PNG submitted to an async deployment of the SageMaker backend
    status, job = deployment.submit(png(features[0]), "image/png")
    assert status == 202, job
    # WHEN SageMaker runs it and its notification is recorded
    sagemaker.sagemaker.wait_idle()
    sagemaker.deliver_notifications(expected=1)
    # THEN the container's hook read the image: the digits model's answer for its pixels
    status, done = deployment.status(job["job_id"])
    assert done["status"] == "succeeded", done
    assert fetch(done["result"]["url"])["predictions"] == expected(model_dir, features[:1])
