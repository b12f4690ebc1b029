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
from tests.e2e.test_docs import Block, parse_blocks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SERVESTACK = str(Path(sys.executable).parent / "servestack")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "deep_learning"
PICTURES = ["landscape.jpg", "portrait.jpg", "grey.jpg", "square.png", "transparent.png"]  # export_image.IMAGES
SENT_ONLINE = {"landscape.jpg": 0, "square.png": 3}  # a raw JPEG body and a raw PNG body, by their index
LABELS = [f"class-{index}" for index in range(10)]
MODES = {"rt": "realtime", "api": "serverless", "jobs": "async", "nightly": "batch"}
# model -> (its ONNX file, torch's logits, the tolerance of its probabilities against their softmax)
MODELS = {
    "cnn": ("cnn.onnx", "image_logits.npy", 1e-4),
    "cnn16": ("cnn-fp16.onnx", "image_logits_fp16.npy", 1e-2),  # half precision: about 3 decimal digits
}
DEPLOYMENTS = [f"{model}-{suffix}" for model in MODELS for suffix in MODES]


DOCUMENT = "docs/deep-learning.md"


def doc_blocks() -> list[Block]:
    """docs/deep-learning.md's blocks this module runs as written: the push commands, serving.yaml, the sends."""
    text = (Path(__file__).resolve().parents[2] / DOCUMENT).read_text(encoding="utf-8")
    tested = [b for b in parse_blocks(text, DOCUMENT) if b.marker is not None and b.marker.kind == "tested"]
    return [b for b in tested if b.marker is not None and Path(__file__).name in b.marker.text]


def shell(root: Path, env: dict[str, str], block: Block) -> None:
    """A docs block run as written by `bash -e -o pipefail`, with this environment's servestack first on PATH."""
    path = f"{Path(SERVESTACK).parent}{os.pathsep}{env['PATH']}"
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=root, env={**env, "PATH": path},
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, f"{block.where}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


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
    """Each deployment's (predictions, labels, probabilities) for the pictures it was sent: online, the JPEG then
    the PNG (`SENT_ONLINE`); batch, every picture as a line of `{"b64": ...}`, then the JPEG and PNG files."""
    root = tmp_path_factory.mktemp("image-modes")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SERVESTACK_"))}
    cli(root, env, "init", ".")
    push, spec, sends = doc_blocks()
    for onnx_file, _, _ in MODELS.values():
        (root / onnx_file).write_bytes((FIXTURES / onnx_file).read_bytes())
    # GIVEN each CNN pushed with one command (the docs' own): its image preprocessing and labels declared, no hook
    assert f"--labels {','.join(LABELS)}" in push.text
    shell(root, env, push)
    # AND the docs' serving.yaml: each in all four modes
    (root / "serving.yaml").write_text(spec.text)
    assert set(yaml.safe_load(spec.text)["deployments"]) == set(DEPLOYMENTS)
    for picture in SENT_ONLINE:
        (root / picture).write_bytes((FIXTURES / "images" / picture).read_bytes())
    lines = [json.dumps({"b64": base64.b64encode((FIXTURES / "images" / n).read_bytes()).decode()}) for n in PICTURES]
    (root / "pictures.jsonl").write_text("".join(line + "\n" for line in lines))
    up = start_local_up(root, "--fresh", cwd=root, env=env, timeout_sec=600,
                        found_state=root / ".servestack" / "local.json")  # fmt: skip
    found: dict[str, tuple[list[int], list[str], np.ndarray]] = {}
    try:
        shell(root, env, sends)  # the docs' sends, as written
        for model in MODELS:
            # WHEN each online deployment is sent the JPEG and the PNG as raw bodies (invoke sends a file with its
            # media type), and the batch deployment the pictures' lines
            for suffix in ("rt", "api", "jobs"):
                bodies = [json.loads(cli(root, env, "invoke", f"{model}-{suffix}", "--data", picture).stdout)
                          for picture in SENT_ONLINE]  # fmt: skip
                found[f"{model}-{suffix}"] = (
                    [p for body in bodies for p in body["predictions"]],
                    [label for body in bodies for label in body["labels"]],
                    np.asarray([row for body in bodies for row in body["probabilities"]], dtype=np.float32),
                )
            # (the lines of pictures, then the raw picture files: a file is one record, its key the id)
            for given in ("pictures.jsonl", *SENT_ONLINE):
                cli(root, env, "local", "put-input", f"{model}-nightly", given)
            scores = root / f"{model}-scores.jsonl"
            cli(root, env, "local", "run-batch", f"{model}-nightly", "--download", str(scores))
            by_file = [json.loads(line) for line in scores.read_text().splitlines() if line.strip()]
            assert all(row["error"] is None for row in by_file), by_file
            line_rows = sorted(
                (row for row in by_file if row["file"].endswith("pictures.jsonl")), key=lambda r: r["line"]
            )
            files = [next(row for row in by_file if row["file"].endswith(f"/{picture}")) for picture in SENT_ONLINE]
            rows = [*line_rows, *files]
            found[f"{model}-nightly"] = (
                [row["prediction"] for row in rows],
                [row["label"] for row in rows],
                np.asarray([row["probabilities"] for row in rows], dtype=np.float32),
            )
        yield found
    finally:
        assert up.stop() == 0


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_every_mode_answers_a_picture_as_torch_does(
    answers: dict[str, tuple[list[int], list[str], np.ndarray]], deployment: str
) -> None:
    model, suffix = deployment.rsplit("-", 1)
    _, logits_file, tolerance = MODELS[model]
    logits = np.load(FIXTURES / logits_file).astype(np.float32)
    online = list(SENT_ONLINE.values())
    sent = online if suffix != "nightly" else [*range(len(PICTURES)), *online]
    predictions, labels, probabilities = answers[deployment]
    # THEN torch's classes, their labels, and its logits' softmax within the model's precision
    assert predictions == logits[sent].argmax(axis=1).tolist()
    assert labels == [LABELS[index] for index in predictions]
    np.testing.assert_allclose(probabilities, softmax(logits[sent]), atol=tolerance)
