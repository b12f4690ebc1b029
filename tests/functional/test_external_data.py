"""A model over 100 MB whose weights are ONNX external data (`model.onnx` + `model.onnx.data`, what
`torch.onnx.export` writes by default and every model over 2 GB must use), pushed with one command as a user
runs it, then served by the realtime container's process and by the Lambda handler in this process: both answer
what numpy computes from the same weights, exactly. The project's registry copy and the version's multi-model
archive hold the data file, and a byte changed in it after the push refuses the package, naming the file.

One model of 105 MB, made once for the module (tests/external_data_model.py); the cheap checks of the same paths
run on a small one in tests/unit/test_package_files.py."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import httpx
import numpy as np
import pytest

from servestack.inference.errors import ChecksumMismatch
from servestack.inference.manifest import read_manifest
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from tests.conftest import LambdaHandler, RealtimeServer, lambda_event, response_body
from tests.external_data_model import ExternalDataModel, write_external_data_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SERVESTACK = str(Path(sys.executable).parent / "servestack")
WIDTH = 5120  # W is 5120 x 5120 float32: 104.9 MB of external data


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExternalDataModel, Path]:
    """The exported model, and the project it was pushed into with `servestack models push model.onnx`."""
    work = tmp_path_factory.mktemp("external-data")
    exported = write_external_data_model(work / "export", width=WIDTH)
    assert exported.data_file.stat().st_size > 100 * 10**6
    project = work / "project"
    project.mkdir()
    (project / "serving.yaml").write_text("models: []\ndeployments: {}\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVESTACK_", "AWS_"))}
    done = subprocess.run(
        [SERVESTACK, "models", "push", str(exported.onnx_file), "--name", "big"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "model.onnx.data (104.9 MB, external data, found beside the model)" in done.stdout
    return exported, project


def request(exported: ExternalDataModel) -> tuple[bytes, np.ndarray]:
    rows = exported.rows(2)
    return json.dumps({"instances": rows.tolist()}).encode(), exported.expected(rows)


def test_the_package_the_registry_copy_and_the_archive_hold_the_data_file(
    pushed: tuple[ExternalDataModel, Path],
) -> None:
    exported, project = pushed
    artifacts = project / "models" / "artifacts"
    package = artifacts / "big" / "1"
    # THEN the manifest lists the data file with the checksum of the user's file, and the package's copy has it
    (listed,) = read_manifest(package).files
    expected = sha256(exported.data_file)
    assert (listed.name, listed.sha256, listed.size, listed.external_data) == (
        "model.onnx.data",
        expected,
        exported.data_file.stat().st_size,
        True,
    )
    assert sha256(package / "model.onnx.data") == expected
    # AND the version's multi-model archive (the project's artifacts are a directory registry) holds it
    with tarfile.open(artifacts / "big" / "1.tar.gz") as archive:
        member = archive.getmember("model.onnx.data")
        assert member.size == listed.size
        stream = archive.extractfile(member)
        assert stream is not None
        digest = hashlib.sha256()
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
        assert digest.hexdigest() == expected


def test_the_realtime_container_serves_it_exactly(pushed: tuple[ExternalDataModel, Path], tmp_path: Path) -> None:
    exported, project = pushed
    env = {"SERVESTACK_MODEL_DIR": str(project / "models" / "artifacts"), "SERVESTACK_DEFAULT_MODEL": "big"}
    server = RealtimeServer.start(tmp_path, env=env)
    try:
        body, expected = request(exported)
        answer = httpx.post(f"{server.url}/invocations", content=body, timeout=60)
        assert answer.status_code == 200, answer.text
        np.testing.assert_array_equal(np.array(answer.json()["predictions"], np.float32), expected)
    finally:
        server.stop()


def test_the_lambda_handler_serves_it_exactly_in_this_process(
    pushed: tuple[ExternalDataModel, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    exported, project = pushed
    # GIVEN the Lambda entry module, initialised as a Lambda process does, on the pushed package
    monkeypatch.setenv("SERVESTACK_MODEL_DIR", str(project / "models" / "artifacts"))
    monkeypatch.setenv("SERVESTACK_DEFAULT_MODEL", "big")
    entry = importlib.util.find_spec("servestack.adapters.serverless")  # found, not imported: its init loads
    assert entry is not None
    assert entry.origin is not None
    spec = importlib.util.spec_from_file_location("serverless_external_data", entry.origin)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        spec.loader.exec_module(module)  # the models load during init
        asyncio.set_event_loop(None)
        handler = LambdaHandler(module.handler, loop)
        # WHEN an HTTP API event asks for a prediction
        body, expected = request(exported)
        response = handler(lambda_event("http-api-v2", body, headers={"content-type": "application/json"}))
        # THEN it answers what numpy computes
        assert response["statusCode"] == 200, response
        predictions = json.loads(response_body(response))["predictions"]
        np.testing.assert_array_equal(np.array(predictions, np.float32), expected)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_a_byte_changed_in_the_data_file_after_the_push_refuses_the_package(
    pushed: tuple[ExternalDataModel, Path],
) -> None:
    _, project = pushed
    data = project / "models" / "artifacts" / "big" / "1" / "model.onnx.data"
    with data.open("r+b") as stream:  # one byte, in place: a copy of 105 MB is not needed to damage it
        stream.seek(data.stat().st_size // 2)
        byte = stream.read(1)
        stream.seek(-1, os.SEEK_CUR)
        stream.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(ChecksumMismatch) as refused:
        ServedModel.load(data.parent, ServingSettings(providers="CPUExecutionProvider"))
    assert str(data) in refused.value.message
    assert "sha256 mismatch" in refused.value.message
