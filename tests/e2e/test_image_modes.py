"""An image CNN pushed with one command (`models push cnn.onnx --image ... --labels ...`, no hook) and served in all
four modes under `local up`: each mode runs on what its deployment ships (Pillow comes with the package's
requirements, which push wrote), and answers a JPEG as torch does (tests/fixtures/deep_learning/export_image.py
wrote the model, the pictures and torch's logits on the same preprocessed tensors).

- realtime, serverless, async: `servestack invoke NAME --data picture.jpg` (sent as image/jpeg);
- batch: a JSON-lines input of `{"b64": ...}` pictures, one per line.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.e2e.conftest import start_local_up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SERVESTACK = str(Path(sys.executable).parent / "servestack")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "deep_learning"
PREPROCESS = "resize=72,crop=64,mean=0.485:0.456:0.406,std=0.229:0.224:0.225"  # export_image.PREPROCESS
PICTURES = ["landscape.jpg", "portrait.jpg", "grey.jpg", "square.png", "transparent.png"]  # export_image.IMAGES
LABELS = [f"class-{index}" for index in range(10)]
MODES = {"cnn-rt": "realtime", "cnn-api": "serverless", "cnn-jobs": "async", "cnn-nightly": "batch"}
TOLERANCE = 1e-4


def softmax(logits: np.ndarray) -> np.ndarray:
    exponentials = np.exp(logits - logits.max(axis=-1, keepdims=True))
    result: np.ndarray = exponentials / exponentials.sum(axis=-1, keepdims=True)
    return result


def cli(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([SERVESTACK, *args], cwd=root, env=env, capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    assert done.returncode == 0, f"servestack {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[list[int], list[str], np.ndarray]]]:
    """Each deployment's (predictions, labels, probabilities) for the pictures it was sent."""
    root = tmp_path_factory.mktemp("image-modes")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SERVESTACK_"))}
    cli(root, env, "init", ".")
    # GIVEN the CNN pushed with one command: its image preprocessing and labels declared, no hook
    cli(root, env, "models", "push", str(FIXTURES / "cnn.onnx"), "--name", "cnn", "--image", PREPROCESS,
        "--labels", ",".join(LABELS))  # fmt: skip
    deployments: dict[str, dict[str, object]] = {name: {"mode": mode, "model": "cnn"} for name, mode in MODES.items()}
    deployments["cnn-rt"]["instance_type"] = "ml.c6i.xlarge"
    spec = {"models": [{"name": "cnn", "version": 1}], "deployments": deployments}
    (root / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (root / "landscape.jpg").write_bytes((FIXTURES / "images" / "landscape.jpg").read_bytes())
    lines = [json.dumps({"b64": base64.b64encode((FIXTURES / "images" / n).read_bytes()).decode()}) for n in PICTURES]
    (root / "pictures.jsonl").write_text("".join(line + "\n" for line in lines))
    up = start_local_up(root, "--fresh", cwd=root, env=env, timeout_sec=600,
                        found_state=root / ".servestack" / "local.json")  # fmt: skip
    found: dict[str, tuple[list[int], list[str], np.ndarray]] = {}
    try:
        # WHEN each online deployment is sent the JPEG, and the batch deployment the pictures' lines
        for name in ("cnn-rt", "cnn-api", "cnn-jobs"):
            body = json.loads(cli(root, env, "invoke", name, "--data", "landscape.jpg").stdout)
            found[name] = (body["predictions"], body["labels"], np.asarray(body["probabilities"], dtype=np.float32))
        cli(root, env, "local", "put-input", "cnn-nightly", "pictures.jsonl")
        scores = root / "scores.jsonl"
        cli(root, env, "local", "run-batch", "cnn-nightly", "--download", str(scores))
        rows = [json.loads(line) for line in scores.read_text().splitlines() if line.strip()]
        found["cnn-nightly"] = (
            [row["prediction"] for row in rows],
            [row["label"] for row in rows],
            np.asarray([row["probabilities"] for row in rows], dtype=np.float32),
        )
        yield found
    finally:
        assert up.stop() == 0


@pytest.mark.parametrize("deployment", list(MODES))
def test_every_mode_answers_a_picture_as_torch_does(
    answers: dict[str, tuple[list[int], list[str], np.ndarray]], deployment: str
) -> None:
    logits = np.load(FIXTURES / "image_logits.npy")
    sent = [0] if deployment != "cnn-nightly" else list(range(len(PICTURES)))
    predictions, labels, probabilities = answers[deployment]
    # THEN torch's classes, their labels, and its logits' softmax within 1e-4
    assert predictions == logits[sent].argmax(axis=1).tolist()
    assert labels == [LABELS[index] for index in predictions]
    np.testing.assert_allclose(probabilities, softmax(logits[sent]), atol=TOLERANCE)
