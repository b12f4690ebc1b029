"""Images through async and batch under `local up` (issue 36): a model whose `preprocess` hook reads images
(tests/fixtures/raw_digits_process.py, pushed with `--process` and `--requirement Pillow`), deployed `mode: async`
and `mode: batch`.

- async: `servestack invoke jobs --data digit.png` submits the PNG as `image/png`; the worker's hook reads it;
- batch: `servestack local put-input nightly *.png` uploads the images, `local run-batch --download` scores each
  as one record keyed by its object, and a file the hook refuses is a row with its reason.

Each answer is compared with the plain digits model's for the same pixels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from servestack.inference import media_types
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from tests.conftest import ARTIFACTS, RAW_HOOKS
from tests.e2e.conftest import LocalUp, start_local_up
from tests.functional.test_raw_bodies import png

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SERVESTACK = str(Path(sys.executable).parent / "servestack")
# The raw-body hook, reading JSON rows too: `models push` checks the package answers its sample (a JSON request)
SPLIT = '    media_type, _, parameters = content_type.partition(";")\n'
BOTH_FORMS = RAW_HOOKS.read_text().replace(
    SPLIT,
    SPLIT + '    if media_type == "application/json":\n'
    '        return np.asarray(payload["instances"], dtype=np.float32)\n',
)


@dataclass
class Project:
    root: Path
    env: dict[str, str]

    def cli(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([SERVESTACK, *args], cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=600, check=False)  # fmt: skip
        if ok:
            assert done.returncode == 0, f"servestack {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    root = tmp_path_factory.mktemp("binary-modes")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SERVESTACK_"))}
    made = Project(root, env)
    made.cli("init", ".")
    assert RAW_HOOKS.read_text() != BOTH_FORMS
    (root / "process.py").write_text(BOTH_FORMS)
    digits = ARTIFACTS / "digits" / "1"
    made.cli("models", "push", str(digits / "model.onnx"), "--name", "raw-digits", "--process", "process.py",
             "--requirement", "Pillow", "--sample", str(digits / "sample-request.json"))  # fmt: skip
    spec = {
        "models": [{"name": "raw-digits", "version": 1}],
        "deployments": {
            "jobs": {"mode": "async", "model": "raw-digits"},
            "nightly": {"mode": "batch", "model": "raw-digits"},
        },
    }
    (root / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    up: LocalUp = start_local_up(root, cwd=root, env=env, timeout_sec=600,
                                 found_state=root / ".servestack" / "local.json")  # fmt: skip
    try:
        yield made
    finally:
        assert up.stop() == 0


def digits_answers(rows: np.ndarray) -> list[Any]:
    model = ServedModel.load(ARTIFACTS / "digits" / "1", ServingSettings(warmup=False))
    body = json.dumps({"instances": rows.tolist()}).encode()
    predictions: list[Any] = json.loads(model.infer(body, media_types.JSON, media_types.JSON).body)["predictions"]
    return predictions


def test_an_async_job_of_an_image(project: Project, digits: tuple[np.ndarray, np.ndarray]) -> None:
    features, _ = digits
    # GIVEN a PNG, WHEN `servestack invoke` submits it to the async deployment and waits for the job
    (project.root / "digit.png").write_bytes(png(features[0]))
    done = project.cli("invoke", "jobs", "--data", "digit.png")
    # THEN the worker's hook read it: the digits model's answer for those pixels
    assert json.loads(done.stdout)["predictions"] == digits_answers(features[:1])


def test_a_batch_run_over_images(project: Project, digits: tuple[np.ndarray, np.ndarray]) -> None:
    features, _ = digits
    # GIVEN three PNGs and a file that is no image, put in with put-input
    names = []
    for index in range(3):
        (project.root / f"digit{index}.png").write_bytes(png(features[index]))
        names.append(f"digit{index}.png")
    (project.root / "broken.png").write_bytes(b"not an image")
    project.cli("local", "put-input", "nightly", *names, "broken.png")
    # WHEN the batch runs and its output is downloaded
    scores = project.root / "scores.jsonl"
    project.cli("local", "run-batch", "nightly", "--download", str(scores), ok=False)
    rows = {row["file"].rsplit("/", 1)[-1]: row for row in map(json.loads, scores.read_text().splitlines())}
    # THEN each file is one row keyed by its object: the images scored as the digits model scores their pixels
    assert sorted(rows) == sorted([*names, "broken.png"])
    assert [rows[name]["prediction"] for name in names] == digits_answers(features[:3])
    assert all(rows[name]["id"] == rows[name]["file"] and rows[name]["error"] is None for name in names)
    # AND the file the hook refused is there with its reason
    assert "not an image" in rows["broken.png"]["error"]["message"]
