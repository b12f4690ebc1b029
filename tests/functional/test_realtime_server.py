"""The SageMaker container entry as a real process over real HTTP: the contract, the REST surface, errors."""

from __future__ import annotations

import concurrent.futures
import io
import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from servestack.adapters.app import DECODE_INLINE_BYTES
from servestack.inference.packaging import create_package
from tests.conftest import ARTIFACTS, RealtimeServer
from tests.waiting import DEADLINE_SEC, Gate, log_says, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(realtime_server: RealtimeServer) -> httpx.Client:
    with httpx.Client(base_url=realtime_server.url, timeout=10) as client:
        yield client  # type: ignore[misc]


def post(client: httpx.Client, body: bytes, content_type: str = "application/json", **headers: str) -> httpx.Response:
    return client.post("/invocations", content=body, headers={"content-type": content_type, **headers})


def test_ping_is_200_once_ready(client: httpx.Client) -> None:
    response = client.get("/ping")
    assert response.status_code == 200
    assert response.json() == {"status": "ready"}


def test_a_digits_row_returns_the_class_scikit_learn_predicts(
    client: httpx.Client, digits: tuple[np.ndarray, np.ndarray], sklearn_digits: object
) -> None:
    features, _ = digits
    rows = features[100:164]
    response = post(client, json.dumps({"instances": rows.tolist()}).encode())
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json()["predictions"] == sklearn_digits.predict(rows).tolist()  # type: ignore[attr-defined]


def test_csv_in_csv_out(client: httpx.Client, digits: tuple[np.ndarray, np.ndarray]) -> None:
    features, targets = digits
    body = "\n".join(",".join(f"{v:g}" for v in row) for row in features[:5]).encode()
    response = post(client, body, "text/csv", accept="text/csv")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    assert [int(line.split(",")[0]) for line in response.text.splitlines()] == targets[:5].tolist()


def test_npy_in_npy_out(client: httpx.Client, digits: tuple[np.ndarray, np.ndarray]) -> None:
    features, targets = digits
    buffer = io.BytesIO()
    np.save(buffer, features[:32])
    response = post(client, buffer.getvalue(), "application/x-npy", accept="application/x-npy")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-npy"
    stream = io.BytesIO(response.content)
    predictions = np.load(stream, allow_pickle=False)
    assert predictions.dtype == np.int64
    np.testing.assert_array_equal(predictions, targets[:32])
    # The model's second output follows in the same body: the probabilities, one row of 10 per input row.
    probabilities = np.load(stream, allow_pickle=False)
    assert (probabilities.dtype, probabilities.shape) == (np.float32, (32, 10))
    np.testing.assert_array_equal(probabilities.argmax(axis=1), predictions)
    assert stream.read() == b""


def test_target_model_and_custom_attributes_headers(client: httpx.Client) -> None:
    sample = (ARTIFACTS / "breast-cancer" / "1" / "sample-request.json").read_bytes()
    expected = json.loads((ARTIFACTS / "breast-cancer" / "1" / "sample-response.json").read_text())
    response = post(
        client,
        sample,
        **{"X-Amzn-SageMaker-Target-Model": "breast-cancer.tar.gz", "X-Amzn-SageMaker-Custom-Attributes": "trace=42"},
    )
    assert response.status_code == 200
    assert response.json()["model"] == "breast-cancer"
    assert response.json()["labels"] == expected["labels"]
    assert response.headers["x-amzn-sagemaker-custom-attributes"] == "trace=42"


def test_rest_surface(client: httpx.Client) -> None:
    listed = client.get("/v1/models").json()["models"]
    assert sorted(model["name"] for model in listed) == ["breast-cancer", "digits"]
    described = client.get("/v1/models/digits").json()
    assert described["inputs"] == [{"name": "input", "dtype": "float32", "shape": [None, 64]}]
    sample = (ARTIFACTS / "digits" / "1" / "sample-request.json").read_bytes()
    predicted = client.post("/v1/models/digits@1/predict", content=sample, headers={"content-type": "application/json"})
    expected = json.loads((ARTIFACTS / "digits" / "1" / "sample-response.json").read_text())
    assert predicted.json()["predictions"] == expected["predictions"]
    assert client.get("/v1/models/fraud").status_code == 404


def test_openapi_documents_both_surfaces(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    assert {"/ping", "/invocations", "/v1/models", "/v1/models/{name}/predict"} <= set(spec["paths"])
    assert set(spec["paths"]["/invocations"]["post"]["requestBody"]["content"]) == {
        "application/json",
        "text/csv",
        "application/x-npy",
    }
    assert client.get("/docs").status_code == 200


def row(values: list[object]) -> bytes:
    return json.dumps({"instances": [values]}).encode()


BAD_REQUESTS = [
    ("malformed-json", b'{"instances": [[0, 1,', "application/json", {}, 400, "body"),
    ("63-features", row([0.0] * 63), "application/json", {}, 400, "instances[0]"),
    ("65-features", row([0.0] * 65), "application/json", {}, 400, "instances[0]"),
    ("string-feature", row([0.0] * 20 + ["a"] + [0.0] * 43), "application/json", {}, 400, "instances[0][20]"),
    ("nan", row([float("nan")] + [0.0] * 63), "application/json", {}, 400, "instances[0][0]"),
    ("empty-batch", b'{"instances": []}', "application/json", {}, 400, "instances"),
    ("7-mb-body", b"[" + b"0," * (7 * 1024 * 1024 // 2) + b"0]", "application/json", {}, 413, "body"),
    ("unsupported-type", b"hello", "text/plain", {}, 415, "Content-Type"),
    ("unknown-model", row([0.0] * 64), "application/json", {"X-Amzn-SageMaker-Target-Model": "fraud"}, 404, "model"),
    ("unwritable-accept", row([0.0] * 64), "application/json", {"accept": "image/png"}, 406, "Accept"),
]


@pytest.mark.parametrize(
    ("body", "content_type", "headers", "status", "field"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
def test_user_mistakes_get_a_json_4xx_and_the_server_keeps_serving(
    client: httpx.Client, body: bytes, content_type: str, headers: dict[str, str], status: int, field: str
) -> None:
    response = post(client, body, content_type, **headers)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["field"] == field
    assert error["message"]
    assert "allowed" in error
    # the next good request is served
    good = post(client, (ARTIFACTS / "digits" / "1" / "sample-request.json").read_bytes())
    assert good.status_code == 200


def test_chunked_body_over_the_limit_is_refused(client: httpx.Client) -> None:
    def chunks() -> object:
        for _ in range(8):
            yield b" " * (1024 * 1024)

    response = client.post("/invocations", content=chunks(), headers={"content-type": "application/json"})  # type: ignore[arg-type]
    assert response.status_code == 413


def test_unknown_route_and_method_are_json(client: httpx.Client) -> None:
    missing = client.get("/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "HTTPError"
    assert client.get("/invocations").status_code == 405


# uvicorn re-raises the signal it handled once shutdown has finished, so a drained SIGTERM exits as -15;
# granian exits 0.
GRACEFUL = (0, -15)


def loading_hooks(gate: Gate) -> str:
    """Hooks whose import reaches `gate` and waits there until the test opens it: a model still loading (as a large
    model takes seconds to load) for as long as the test needs."""
    return gate.source() + "\n\ndef preprocess(payload, content_type):\n    raise ValueError('unused')\n"


def test_ping_is_503_while_loading_and_200_after(tmp_path: Path) -> None:
    # GIVEN a model package whose hooks are still being imported (as a large model is still loading)
    models = tmp_path / "models"
    shutil.copytree(ARTIFACTS / "digits", models / "digits")
    hooks = tmp_path / "process.py"
    loading = Gate(tmp_path, "loading")
    hooks.write_text(loading_hooks(loading))
    create_package(
        ARTIFACTS / "digits" / "1" / "model.onnx", models / "slow" / "1", name="slow", version="1", process_file=hooks
    )
    server = RealtimeServer.start(tmp_path, env={"SERVESTACK_MODEL_DIR": str(models)}, wait_ready=False)
    try:
        loading.wait_reached()
        # WHEN /ping is called during loading THEN 503, and an invocation is a retryable 503 too
        during = httpx.get(f"{server.url}/ping")
        assert during.status_code == 503
        assert during.json()["status"] == "loading"
        early = httpx.post(f"{server.url}/invocations", content=b"{}", headers={"content-type": "application/json"})
        assert early.status_code == 503
        # THEN 200 once loaded
        loading.open()
        server.wait_ready()
    finally:
        loading.open()
        assert server.stop() in GRACEFUL


def test_a_checksum_failure_keeps_ping_at_503_with_the_reason(tmp_path: Path) -> None:
    models = tmp_path / "models"
    shutil.copytree(ARTIFACTS / "digits", models / "digits")
    (models / "digits" / "1" / "model.onnx").write_bytes(b"tampered")
    server = RealtimeServer.start(tmp_path, env={"SERVESTACK_MODEL_DIR": str(models)}, wait_ready=False)
    try:
        ping = wait_for(server.ping_once_loaded, "the model's load to end")
        assert ping.status_code == 503
        assert ping.json()["status"] == "failed"
        assert "sha256 mismatch" in ping.json()["error"]
        assert "sha256 mismatch" in server.log_path.read_text()
    finally:
        server.stop()


def gated_preprocess(gate: Gate) -> str:
    """Hooks whose preprocess reaches `gate` and waits there until the test opens it: a request held in flight."""
    return (
        "import numpy as np\n\n"
        "def preprocess(payload, content_type):\n"
        f"{gate.source(indent='    ')}"
        "    return np.asarray(payload['instances'], dtype=np.float32)\n"
    )


# What each HTTP server logs once SIGTERM has started its graceful shutdown, and once that has finished.
SHUTDOWN_STARTED_LOG = {"granian": "Shutting down granian", "uvicorn": "Shutting down"}
SHUTDOWN_LOG = {"granian": "Granian shutdown completed", "uvicorn": "Finished server process"}


@pytest.mark.parametrize("http_server", ["granian", "uvicorn"])
def test_sigterm_drains_in_flight_requests_and_exits_cleanly(tmp_path: Path, http_server: str) -> None:
    # GIVEN a container on either HTTP server, whose model's preprocess holds each request until the test lets
    # it go
    models = tmp_path / "models"
    hooks = tmp_path / "process.py"
    in_preprocess = Gate(tmp_path, "preprocess")
    hooks.write_text(gated_preprocess(in_preprocess))
    create_package(
        ARTIFACTS / "digits" / "1" / "model.onnx", models / "slow" / "1", name="slow", version="1", process_file=hooks
    )
    env = {
        "SERVESTACK_MODEL_DIR": str(models),
        "SERVESTACK_DEFAULT_MODEL": "slow",
        "SERVESTACK_HTTP_SERVER": http_server,
    }
    server = RealtimeServer.start(tmp_path, env=env)
    # A body over DECODE_INLINE_BYTES (the sample, padded with JSON whitespace) is decoded, preprocess and all,
    # on the worker's decode thread: its event loop stays free to see SIGTERM and begin the shutdown while the
    # request is held.
    sample = (ARTIFACTS / "digits" / "1" / "sample-request.json").read_bytes() + b" " * DECODE_INLINE_BYTES
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        in_flight = pool.submit(httpx.post, f"{server.url}/invocations", content=sample, timeout=DEADLINE_SEC)
        # WHEN SIGTERM arrives while the request is inside the model's preprocess
        in_preprocess.wait_reached()
        stopping = pool.submit(server.child.stop, grace_sec=DEADLINE_SEC)
        # (and the request goes on only once the server has begun to shut down: it is in flight throughout)
        wait_for(log_says(server.log_path, SHUTDOWN_STARTED_LOG[http_server]), "the server to begin its shutdown")
        assert not in_flight.done()
        in_preprocess.open()
        # THEN that request is still answered, and the server exits cleanly after it
        assert in_flight.result().status_code == 200
        exit_code = stopping.result()
    assert exit_code in GRACEFUL
    assert SHUTDOWN_LOG[http_server] in server.log_path.read_text()
