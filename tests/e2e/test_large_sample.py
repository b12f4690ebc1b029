"""An image model's default sample is large (a `[N, 3, 224, 224]` input: over a megabyte of JSON), and a serverless
deployment of it still releases: CodeDeploy's pre-traffic hook asks the new version for the sample its package
carries (`{"servestack": "sample"}`), sends it as an HTTP API event and compares the answer, so no sample
travels in the hook's environment (4 KB at most) and none is too large."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.conftest import LocalUp, start_local_up

pytestmark = pytest.mark.slow
SERVESTACK = str(Path(sys.executable).parent / "servestack")


def image_model(path: Path) -> np.ndarray:
    """A small image classifier's graph: the per-channel mean of a 3x224x224 image, times a 3x10 matrix."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(7).normal(size=(3, 10)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["image", "axes"], ["means"], keepdims=0),
            helper.make_node("MatMul", ["means", "weights"], ["logits"]),
        ],
        "image-classifier",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [None, 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 10])],
        [
            numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "axes"),
            numpy_helper.from_array(weights, "weights"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return weights


def servestack(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SERVESTACK, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, LocalUp]]:
    root = tmp_path_factory.mktemp("large-sample")
    assert servestack("init", ".", cwd=root).returncode == 0
    image_model(root / "classifier.onnx")
    pushed = servestack("models", "push", "classifier.onnx", "--name", "classifier", cwd=root)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    (root / "serving.yaml").write_text(
        "models:\n  - name: classifier\n    version: 1\n"
        "deployments:\n  classifier-api:\n    mode: serverless\n    model: classifier\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SERVESTACK_"))}
    up = start_local_up(root, cwd=root, found_state=root / ".servestack" / "local.json", timeout_sec=300, env=env)
    try:
        yield root, up
    finally:
        up.stop()


def test_the_default_sample_of_an_image_model_is_over_a_megabyte(project: tuple[Path, LocalUp]) -> None:
    root, _ = project
    sample = root / "models" / "artifacts" / "classifier" / "1" / "sample-request.json"
    assert sample.stat().st_size > 1_000_000


def test_it_answers_and_its_release_passes_the_pre_traffic_hook(project: tuple[Path, LocalUp], tmp_path: Path) -> None:
    root, up = project
    package = root / "models" / "artifacts" / "classifier" / "1"
    # GIVEN the deployment answers its sample through its HTTP API
    answered = servestack("invoke", "classifier-api", "--data", str(package / "sample-request.json"), cwd=root)
    assert answered.returncode == 0, answered.stderr
    expected = json.loads((package / "sample-response.json").read_text())
    assert json.loads(answered.stdout)["predictions"] == expected["predictions"]
    # WHEN its alias is released by CodeDeploy, whose pre-traffic hook checks the new version with that sample
    outcome = tmp_path / "release.json"
    done = servestack("local", "deploy", "classifier-api", "--version", "1", "--interval-sec", "0.2",
                      "--state", str(up.state_path), "--output", str(outcome), cwd=root)  # fmt: skip
    # THEN the release succeeds, the hook having passed
    assert done.returncode == 0, done.stdout + done.stderr
    release = json.loads(outcome.read_text())
    assert release["status"] == "Succeeded", release
    assert any("BeforeAllowTraffic: Succeeded" in m for m in release["deploymentStatusMessages"])
