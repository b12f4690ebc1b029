"""Bodies no codec reads (images, audio, raw bytes, plain text, multipart forms) reach a model's `preprocess` hook
as bytes, through the realtime container's HTTP server and the Lambda handler alike; a model without the hook
refuses them with the codecs' 415."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from PIL import Image

from tests.conftest import (
    LambdaHandler,
    RealtimeServer,
    fresh_lambda_handler,
    lambda_event,
    raw_digits_models,
    response_body,
)

SERVESTACK = str(Path(sys.executable).parent / "servestack")

PIXEL_SCALE = 15  # as the hook reads them: features 0..16 times 15 fit a byte
BOUNDARY = "----servestack-test-boundary"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`raw-digits` (the digits model behind the raw-body hook) beside the plain `digits` model."""
    return raw_digits_models(tmp_path_factory.mktemp("raw-bodies"))


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    env = {"SERVESTACK_MODEL_DIR": str(model_dir), "SERVESTACK_DEFAULT_MODEL": "raw-digits"}
    running = RealtimeServer.start(tmp_path_factory.mktemp("raw-bodies-server"), env=env)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def handler(model_dir: Path) -> Iterator[LambdaHandler]:
    """The Lambda entry module, initialised as a Lambda process does (models load at import), on these models."""
    yield from fresh_lambda_handler(model_dir, "raw-digits", "serverless_raw_bodies")


def png(features: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray((features.reshape(8, 8) * PIXEL_SCALE).astype(np.uint8), mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


def jpeg(features: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray((features.reshape(8, 8) * PIXEL_SCALE).astype(np.uint8), mode="L").save(buffer, format="JPEG")
    return buffer.getvalue()


def wav(rows: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(8000)
        audio.writeframes(rows.astype("<i2").tobytes())
    return buffer.getvalue()


def form(images: list[bytes]) -> bytes:
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="digit{index}.png"\r\n'
        f"Content-Type: image/png\r\n\r\n".encode()
        + image
        + b"\r\n"
        for index, image in enumerate(images)
    ]
    caption = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="caption"\r\n\r\nthree digits\r\n'.encode()
    return caption + b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def bodies(features: np.ndarray) -> dict[str, tuple[str, bytes, int]]:
    """Each form a client sends the first rows of `features` in: name -> (Content-Type, body, rows)."""
    three = features[:3]
    text = "\n".join(" ".join(str(int(value)) for value in row) for row in three)
    return {
        "png": ("image/png", png(three[0]), 1),
        "wav": ("audio/wav", wav(three), 3),
        "octet-stream": ("application/octet-stream", (three * PIXEL_SCALE).astype(np.uint8).tobytes(), 3),
        "text": ("text/plain; charset=latin-1", text.encode("latin-1"), 3),
        "multipart": (f"multipart/form-data; boundary={BOUNDARY}", form([png(row) for row in three]), 3),
    }


FORMS = ["png", "wav", "octet-stream", "text", "multipart"]


def expected_predictions(server: RealtimeServer, rows: np.ndarray) -> list[Any]:
    """What the plain digits model answers for these rows sent as JSON."""
    answer = httpx.post(f"{server.url}/v1/models/digits/predict", json={"instances": rows.tolist()}, timeout=30)
    assert answer.status_code == 200, answer.text
    predictions: list[Any] = answer.json()["predictions"]
    return predictions


@pytest.mark.parametrize("name", FORMS)
def test_the_container_hands_a_raw_body_to_preprocess(
    server: RealtimeServer, digits: tuple[np.ndarray, np.ndarray], name: str
) -> None:
    features, _ = digits
    content_type, body, rows = bodies(features)[name]
    # GIVEN a model whose preprocess hook reads this form
    # WHEN a client posts the body with its media type
    answer = httpx.post(f"{server.url}/invocations", content=body, headers={"content-type": content_type}, timeout=30)
    # THEN the hook read the bytes: the answer is the digits model's for the same rows
    assert answer.status_code == 200, answer.text
    assert answer.json()["predictions"] == expected_predictions(server, features[:rows])


def test_a_jpeg_reaches_the_hook_through_the_rest_route(
    server: RealtimeServer, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    features, _ = digits
    # GIVEN a JPEG (lossy: its pixels only approximate the digit)
    # WHEN it is posted to the model's REST route
    answer = httpx.post(
        f"{server.url}/v1/models/raw-digits/predict", content=jpeg(features[0]), headers={"content-type": "image/jpeg"}
    )
    # THEN the hook decoded it into one row
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["predictions"]) == 1


@pytest.mark.parametrize("content_type", ["image/jpeg", "application/octet-stream", "text/plain", "audio/wav"])
def test_a_model_without_a_hook_refuses_a_raw_body_with_the_codecs_415(
    server: RealtimeServer, content_type: str
) -> None:
    # GIVEN the plain digits model (no preprocess hook)
    # WHEN it is sent a body no codec reads
    answer = httpx.post(
        f"{server.url}/v1/models/digits/predict", content=b"\xff\xd8\x00,,,", headers={"content-type": content_type}
    )
    # THEN 415, naming the type and what the model takes
    assert answer.status_code == 415
    assert answer.json() == {
        "error": {
            "type": "UnsupportedMediaType",
            "message": f"Content-Type: {content_type!r} is not supported",
            "field": "Content-Type",
            "value": content_type,
            "allowed": "application/json, text/csv, application/x-npy",
        }
    }


def test_a_multipart_form_to_a_model_without_a_hook_names_the_type_without_its_boundary(
    server: RealtimeServer,
) -> None:
    # GIVEN a model without a hook, WHEN a form is posted to it, THEN the 415 names the bare media type
    answer = httpx.post(
        f"{server.url}/v1/models/digits/predict",
        content=form([b"x"]),
        headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
    )
    assert answer.status_code == 415
    assert answer.json()["error"]["value"] == "multipart/form-data"


def test_a_hook_that_refuses_a_raw_body_is_a_400(server: RealtimeServer) -> None:
    # GIVEN bytes the hook cannot read as an image
    # WHEN they are posted as one
    answer = httpx.post(f"{server.url}/invocations", content=b"not an image", headers={"content-type": "image/png"})
    # THEN the hook's ValueError blames the request: a 400 carrying its message
    assert answer.status_code == 400
    assert "raw-digits@1: preprocess rejected the request: not an image" in answer.json()["error"]["message"]
    # AND a type the hook does not read at all is refused by the hook, not by the codecs
    answer = httpx.post(f"{server.url}/invocations", content=b"...", headers={"content-type": "video/mp4"})
    assert answer.status_code == 400
    assert "not video/mp4" in answer.json()["error"]["message"]


@pytest.mark.parametrize("name", FORMS)
def test_the_lambda_handler_hands_a_base64_body_to_preprocess(
    handler: LambdaHandler, server: RealtimeServer, digits: tuple[np.ndarray, np.ndarray], name: str
) -> None:
    features, _ = digits
    content_type, body, rows = bodies(features)[name]
    # GIVEN an API Gateway HTTP API (v2) event carrying the body (base64, when it is not UTF-8 text)
    event = lambda_event("http-api-v2", body, headers={"content-type": content_type})
    assert event["isBase64Encoded"] is (name not in ("text",))
    # WHEN the Lambda handler runs it
    response = handler(event)
    # THEN the hook got the bytes, as in the container
    assert response["statusCode"] == 200, response
    assert orjson.loads(response_body(response))["predictions"] == expected_predictions(server, features[:rows])


def test_the_lambda_handler_refuses_a_raw_body_for_a_model_without_a_hook(handler: LambdaHandler) -> None:
    # GIVEN the plain digits model behind the Lambda handler, WHEN a JPEG event reaches it, THEN the codecs' 415
    event = lambda_event(
        "http-api-v2", b"\xff\xd8\xff\xe0", path="/v1/models/digits/predict", headers={"content-type": "image/jpeg"}
    )
    response = handler(event)
    assert response["statusCode"] == 415
    assert orjson.loads(response_body(response))["error"]["value"] == "image/jpeg"


@pytest.mark.parametrize(
    ("file_name", "given", "sent_as"),
    [
        ("digit.png", None, "image/png"),  # mimetypes' guess from the extension
        ("digit.jpg", None, "image/jpeg"),
        ("digit", "image/png", "image/png"),  # no extension: --content-type says what it is
    ],
)
def test_servestack_invoke_sends_a_file_with_its_media_type(
    server: RealtimeServer,
    digits: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
    file_name: str,
    given: str | None,
    sent_as: str,
) -> None:
    features, _ = digits
    # GIVEN an image file, and a state file naming a serverless deployment served by the raw-digits container
    data = tmp_path / file_name
    data.write_bytes(jpeg(features[0]) if sent_as == "image/jpeg" else png(features[0]))
    state = tmp_path / "state.json"
    state.write_text(
        json.dumps({"region": "us-east-1", "deployments": {"api": {"mode": "serverless", "url": server.url}}})
    )
    # WHEN `servestack invoke` sends it
    command = [SERVESTACK, "invoke", "api", "--data", str(data), "--state", str(state)]
    if given is not None:
        command += ["--content-type", given]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    # THEN it went as an image: the hook read it (sent as JSON, the hook would have refused it with a 400)
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    if sent_as == "image/png":
        assert answer["predictions"] == expected_predictions(server, features[:1])
    else:
        assert len(answer["predictions"]) == 1


def test_servestack_invoke_without_an_extension_or_content_type_sends_json(
    server: RealtimeServer, tmp_path: Path
) -> None:
    # GIVEN a file without an extension, WHEN it is sent without --content-type, THEN as JSON (as before): the hook,
    # which reads no JSON, refuses it by name
    data = tmp_path / "request"
    data.write_text('{"instances": []}')
    state = tmp_path / "state.json"
    state.write_text(
        json.dumps({"region": "us-east-1", "deployments": {"api": {"mode": "serverless", "url": server.url}}})
    )
    done = subprocess.run(
        [SERVESTACK, "invoke", "api", "--data", str(data), "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "not application/json" in json.loads(done.stdout)["error"]["message"]
