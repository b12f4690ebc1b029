"""A text classifier pushed with its Hugging Face tokenizer (`models push --tokenizer tokenizer.json`), no hook,
served in all four modes under `local up`: each deployment installs `tokenizers` because the package declares
it, and answers texts (a `text/plain` body, a JSON list, a batch job's lines of text) with the logits torch
computed for them (tests/fixtures/deep_learning/export_text.py)."""

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

from tests.e2e.conftest import LocalUp, start_local_up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SERVESTACK = str(Path(sys.executable).parent / "servestack")
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "deep_learning" / "text"
EXPECTED: dict[str, Any] = json.loads((FIXTURE / "expected.json").read_text())
SENTENCES = [entry["text"] for entry in EXPECTED["sentences"]]
LOGITS = np.array([entry["logits"] for entry in EXPECTED["sentences"]], dtype=np.float32)
MODES = {"rt": "realtime", "api": "serverless", "jobs": "async", "nightly": "batch"}
TOLERANCE = 1e-4


@dataclass
class Project:
    root: Path
    env: dict[str, str]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([SERVESTACK, *args], cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=600, check=False)  # fmt: skip
        assert done.returncode == 0, f"servestack {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    root = tmp_path_factory.mktemp("text-modes")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SERVESTACK_"))}
    made = Project(root, env)
    made.cli("init", ".")
    # GIVEN the classifier pushed with its tokenizer, with one command
    made.cli("models", "push", str(FIXTURE / "text_classifier.onnx"), "--name", "sentiment", "--tokenizer",
             str(FIXTURE / "tokenizer.json"), "--max-length", f"input_ids={EXPECTED['max_length']}")  # fmt: skip
    deployments: dict[str, dict[str, object]] = {
        f"sentiment-{suffix}": {"mode": mode, "model": "sentiment"} for suffix, mode in MODES.items()
    }
    deployments["sentiment-rt"]["instance_type"] = "ml.c6i.xlarge"
    spec = {"models": [{"name": "sentiment", "version": 1}], "deployments": deployments}
    (root / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (root / "texts.json").write_text(json.dumps({"instances": SENTENCES}))
    (root / "one.txt").write_text(SENTENCES[0])
    (root / "texts.jsonl").write_text("".join(json.dumps(text) + "\n" for text in SENTENCES))
    up: LocalUp = start_local_up(root, "--fresh", cwd=root, env=env, timeout_sec=600,
                                 found_state=root / ".servestack" / "local.json")  # fmt: skip
    try:
        yield made
    finally:
        assert up.stop() == 0


def close_to_torch(predictions: Any, rows: slice | list[int], where: str) -> None:
    found = np.asarray(predictions, dtype=np.float32)
    assert found.shape == LOGITS[rows].shape, where
    assert np.abs(found - LOGITS[rows]).max() < TOLERANCE, (where, found, LOGITS[rows])


@pytest.mark.parametrize("suffix", ["rt", "api", "jobs"])
def test_an_online_deployment_answers_texts_as_torch_does(project: Project, suffix: str) -> None:
    # WHEN a JSON list of texts is sent to the deployment
    listed = json.loads(project.cli("invoke", f"sentiment-{suffix}", "--data", "texts.json").stdout)
    # THEN it answers torch's logits (the long texts truncated to the model's maximum length)
    close_to_torch(listed["predictions"], slice(None), f"sentiment-{suffix} list")
    if suffix == "jobs":
        return  # the async front takes the codecs' types only (it reads no model to know what else one takes)
    # AND one text sent as text/plain too
    plain = project.cli("invoke", f"sentiment-{suffix}", "--data", "one.txt", "--content-type", "text/plain")
    close_to_torch(json.loads(plain.stdout)["predictions"], [0], f"sentiment-{suffix} text/plain")


def test_a_batch_job_answers_each_line_of_text(project: Project, tmp_path: Path) -> None:
    # WHEN a batch job reads lines, each a text
    project.cli("local", "put-input", "sentiment-nightly", "texts.jsonl")
    scores = tmp_path / "scores.jsonl"
    project.cli("local", "run-batch", "sentiment-nightly", "--download", str(scores))
    rows = [json.loads(line) for line in scores.read_text().splitlines() if line.strip()]
    # THEN a row per line, each torch's logits for its text
    close_to_torch([row["prediction"] for row in rows], slice(None), "sentiment-nightly")
