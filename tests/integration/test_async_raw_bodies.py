"""Async jobs of bodies no codec reads (issue 36): an image, raw bytes or text submitted inline, or PUT through a
presigned upload, is stored with its media type, and the worker hands it to the model's `preprocess` hook as
bytes with that type, as the realtime and serverless paths do; a model without the hook refuses it at submit with
the online 415, storing nothing."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import servestack.adapters.asynchronous
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings
from tests.conftest import raw_digits_models
from tests.functional.test_raw_bodies import PIXEL_SCALE, png
from tests.integration.asyncjobs import AsyncDeploymentUnderTest, deploy_async
from tests.integration.conftest import Aws


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`raw-digits` (the digits model behind the raw-body hook) beside the plain `digits` model."""
    return raw_digits_models(tmp_path_factory.mktemp("async-raw"))


def deployed(
    aws: Aws, unique: str, monkeypatch: pytest.MonkeyPatch, model_dir: Path, model: str
) -> AsyncDeploymentUnderTest:
    deployment = deploy_async(aws, unique, monkeypatch, batch_size=10, batch_window_sec=0, max_receive_count=2)
    monkeypatch.setenv("SERVESTACK_MODEL_DIR", str(model_dir))
    monkeypatch.setenv("SERVESTACK_DEFAULT_MODEL", model)
    servestack.adapters.asynchronous.service.cache_clear()
    return deployment


@pytest.fixture
def hooked(
    aws: Aws, unique: str, monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> Iterator[AsyncDeploymentUnderTest]:
    yield deployed(aws, unique, monkeypatch, model_dir, "raw-digits")
    servestack.adapters.asynchronous.service.cache_clear()


@pytest.fixture
def plain(
    aws: Aws, unique: str, monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> Iterator[AsyncDeploymentUnderTest]:
    yield deployed(aws, unique, monkeypatch, model_dir, "digits")
    servestack.adapters.asynchronous.service.cache_clear()


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return bytes(response.read())


def expected(model_dir: Path, rows: np.ndarray) -> Any:
    """What the plain digits model answers for these rows sent as JSON."""
    repository = ModelRepository(ServingSettings(model_dir=model_dir, warmup=False))
    repository.load_all()
    body = json.dumps({"instances": rows.tolist()}).encode()
    return json.loads(repository.get("digits").infer(body, "application/json", None).body)["predictions"]


def result(deployment: AsyncDeploymentUnderTest, job_id: str) -> Any:
    deployment.drain()
    code, status = deployment.status(job_id)
    assert code == 200
    assert status["status"] == "succeeded", status
    return json.loads(fetch(status["result"]["url"]))


def stored_type(deployment: AsyncDeploymentUnderTest, job_id: str) -> str:
    item = deployment.aws.dynamodb.get_item(TableName=deployment.names.table, Key={"job_id": {"S": job_id}})
    key = item["Item"]["input_key"]["S"]
    return str(deployment.aws.s3.head_object(Bucket=deployment.names.bucket, Key=key)["ContentType"])


def test_an_image_job_reaches_the_hook_as_bytes_with_its_type(
    hooked: AsyncDeploymentUnderTest, model_dir: Path, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    features, _ = digits
    # GIVEN a model whose preprocess hook reads images, WHEN a PNG is submitted inline
    code, submitted = hooked.submit(png(features[0]), "image/png")
    # THEN the job is taken, its payload stored as an image
    assert code == 202, submitted
    assert stored_type(hooked, submitted["job_id"]) == "image/png"
    # AND the worker's hook read it: the answer is the digits model's for the same row
    assert result(hooked, submitted["job_id"])["predictions"] == expected(model_dir, features[:1])


def test_a_text_job_keeps_its_charset_for_the_hook(
    hooked: AsyncDeploymentUnderTest, model_dir: Path, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    features, _ = digits
    text = "\n".join(" ".join(str(int(value)) for value in row) for row in features[:3])
    # GIVEN plain text in latin-1, WHEN it is submitted with its charset
    code, submitted = hooked.submit(text.encode("latin-1"), "text/plain; charset=latin-1")
    assert code == 202, submitted
    # THEN the hook got the whole type (it decodes with the charset) and read three rows
    assert result(hooked, submitted["job_id"])["predictions"] == expected(model_dir, features[:3])


def test_raw_bytes_go_through_a_presigned_upload(
    hooked: AsyncDeploymentUnderTest, model_dir: Path, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    features, _ = digits
    # GIVEN an upload slot asked for application/octet-stream
    request = json.dumps({"content_type": "application/octet-stream"})
    code, slot = hooked.submit(request, path="/jobs/uploads")
    assert code == 201, slot
    assert slot["upload"]["headers"] == {"Content-Type": "application/octet-stream"}
    # WHEN the raw pixels are PUT to it and the job confirmed
    pixels = (features[:2] * PIXEL_SCALE).astype(np.uint8).tobytes()
    upload = urllib.request.Request(slot["upload"]["url"], data=pixels, method="PUT", headers=slot["upload"]["headers"])
    with urllib.request.urlopen(upload, timeout=10) as response:
        assert response.status == 200
    code, _ = hooked.submit(b"", path=f"/jobs/{slot['job_id']}/confirm")
    assert code == 202
    # THEN the hook read the bytes: two rows, the digits model's answers
    assert result(hooked, slot["job_id"])["predictions"] == expected(model_dir, features[:2])


def test_bytes_the_hook_refuses_fail_the_job_with_its_reason(hooked: AsyncDeploymentUnderTest) -> None:
    # GIVEN bytes that are not an image, WHEN they are submitted as one
    code, submitted = hooked.submit(b"not an image", "image/png")
    assert code == 202, submitted
    hooked.drain()
    # THEN the job failed with the hook's reason, not retried (the request is at fault)
    _, status = hooked.status(submitted["job_id"])
    assert status["status"] == "failed"
    assert "preprocess rejected the request: not an image" in status["error"]["message"]


@pytest.mark.parametrize("content_type", ["image/jpeg", "application/octet-stream", "text/plain"])
def test_a_model_without_a_hook_refuses_a_raw_body_at_submit(
    plain: AsyncDeploymentUnderTest, content_type: str
) -> None:
    # GIVEN the plain digits model (no preprocess hook)
    # WHEN a body no codec reads is submitted, inline or as an upload
    inline = plain.submit(b"\xff\xd8\x00,,,", content_type)
    upload = plain.submit(json.dumps({"content_type": content_type}), path="/jobs/uploads")
    # THEN both are the online 415, naming the type and what the model takes
    refusal = {
        "type": "UnsupportedMediaType",
        "message": f"Content-Type: {content_type!r} is not supported",
        "field": "Content-Type",
        "value": content_type,
        "allowed": "application/json, text/csv, application/x-npy",
    }
    assert inline == (415, {"error": refusal})
    assert upload == (415, {"error": refusal})
    # AND no payload was stored (the queue holds only the S3 test event a new notification sends)
    stored = plain.aws.s3.list_objects_v2(Bucket=plain.names.bucket, Prefix=plain.names.request_prefix)
    assert stored.get("KeyCount", 0) == 0
