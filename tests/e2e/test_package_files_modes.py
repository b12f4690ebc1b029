"""Model packages that carry files, served in all four modes under `local up`, and again after a restart without
`--fresh`, every file verified at each load:

- `affine`: 105 MB of weights in ONNX external data (`model.onnx.data`, as torch.onnx.export writes them),
  pushed with one command; its Lambda functions ship as container images (past the zip limit), and its
  package travels through the emulator's S3 (the registry, SageMaker's model data) as multipart objects;
- `words`: a hook that reads a vocabulary file and a folder of labels beside itself (`--file`).

Each mode's answer is compared with numpy's (affine) and with the hook's answer in this process (words).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.e2e.conftest import LocalUp, start_local_up
from tests.external_data_model import ExternalDataModel, write_external_data_model
from tests.unit.test_package_files import ANSWER, HOOK, TEXTS, write_words_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SERVESTACK = str(Path(sys.executable).parent / "servestack")
MODES = {"rt": "realtime", "api": "serverless", "jobs": "async", "nightly": "batch"}
# The words hook, taking a request's `texts` online and a batch's lines (each a text: the `instances` form a batch
# job gives a hook)
BOTH_FORMS = HOOK.replace(
    '    counts = np.zeros((len(payload["texts"]), len(VOCABULARY)), np.float32)\n'
    '    for row, text in enumerate(payload["texts"]):',
    '    texts = payload["texts"] if "texts" in payload else payload["instances"]\n'
    "    counts = np.zeros((len(texts), len(VOCABULARY)), np.float32)\n"
    "    for row, text in enumerate(texts):",
)


@dataclass
class Project:
    root: Path
    affine: ExternalDataModel
    env: dict[str, str]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([SERVESTACK, *args], cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=600, check=False)  # fmt: skip
        assert done.returncode == 0, f"servestack {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    def up(self, *args: str) -> LocalUp:
        return start_local_up(self.root, *args, cwd=self.root, env=self.env, timeout_sec=600,
                              found_state=self.root / ".servestack" / "local.json")  # fmt: skip


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    root = tmp_path_factory.mktemp("package-files")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SERVESTACK_"))}
    made = Project(root, write_external_data_model(root / "export", width=5120), env)
    made.cli("init", ".")
    # GIVEN each model pushed with one command: the external data found beside the graph, the words' files named
    made.cli("models", "push", str(made.affine.onnx_file), "--name", "affine")
    words = write_words_model(root / "words-src")
    assert BOTH_FORMS != HOOK
    words["process.py"].write_text(BOTH_FORMS)
    made.cli("models", "push", str(words["words.onnx"]), "--name", "words", "--process", str(words["process.py"]),
             "--file", str(words["vocab.txt"]), "--file", str(words["labels"]),
             "--sample", str(words["request.json"]))  # fmt: skip
    deployments: dict[str, dict[str, object]] = {}
    for model in ("affine", "words"):
        for suffix, mode in MODES.items():
            deployments[f"{model}-{suffix}"] = {"mode": mode, "model": model}
        deployments[f"{model}-rt"]["instance_type"] = "ml.c6i.xlarge"
    spec = {"models": [{"name": "affine", "version": 1}, {"name": "words", "version": 1}], "deployments": deployments}
    (root / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (root / "affine.json").write_text(json.dumps({"instances": made.affine.rows().tolist()}))
    (root / "words.json").write_text(json.dumps(TEXTS))
    (root / "affine.jsonl").write_text("".join(json.dumps(row) + "\n" for row in made.affine.rows().tolist()))
    (root / "words.jsonl").write_text("".join(json.dumps(text) + "\n" for text in TEXTS["texts"]))
    return made


def answers(project: Project, tmp: Path) -> dict[str, object]:
    """What each deployment answers: the online and async ones to a request, the batch ones to a run."""
    found: dict[str, object] = {}
    for model in ("affine", "words"):
        for suffix in ("rt", "api", "jobs"):
            done = project.cli("invoke", f"{model}-{suffix}", "--data", f"{model}.json")
            body = json.loads(done.stdout)
            found[f"{model}-{suffix}"] = body["predictions"] if model == "affine" else body["sentiment"]
        project.cli("local", "put-input", f"{model}-nightly", f"{model}.jsonl")
        scores = tmp / f"{model}-scores.jsonl"
        project.cli("local", "run-batch", f"{model}-nightly", "--download", str(scores))
        rows = [json.loads(line) for line in scores.read_text().splitlines() if line.strip()]
        if model == "affine":  # a row per input line: its prediction
            found[f"{model}-nightly"] = [row["prediction"] for row in rows]
        else:  # a line is a text: the hook's label for it
            found[f"{model}-nightly"] = [row["sentiment"] for row in rows]
    return found


def check(found: dict[str, object], affine: ExternalDataModel) -> None:
    expected = affine.expected(affine.rows())
    for name, value in found.items():
        if name.startswith("affine"):
            assert np.array_equal(np.asarray(value, dtype=np.float32), expected), name
        else:
            assert value == ANSWER, (name, value)


@pytest.fixture(scope="module")
def first_run(project: Project, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    up = project.up("--fresh")
    try:
        yield answers(project, tmp_path_factory.mktemp("first"))
    finally:
        assert up.stop() == 0


def test_every_mode_answers_with_the_files_its_package_carries(project: Project, first_run: dict[str, object]) -> None:
    # THEN in every mode, the external-data model answers what numpy computes, and the words model its labels
    check(first_run, project.affine)
    # AND the affine Lambda functions ship as container images (its package passes the zip limit)
    template = json.loads((project.root / ".servestack/cdk.out/servestack-affine-api.template.json").read_text())
    functions = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    assert [f.get("PackageType") for f in functions if "ImageConfig" in f] == ["Image"]


def test_a_restart_without_fresh_serves_the_same_files_verified(
    project: Project, first_run: dict[str, object], tmp_path: Path
) -> None:
    # GIVEN the first local up stopped, its emulator's data kept (the model data, the registry's copies)
    # WHEN local up starts again without --fresh, restoring them
    up = project.up()
    try:
        again = answers(project, tmp_path)
    finally:
        assert up.stop() == 0
    # THEN every mode answers the same, each package's files verified against its manifest at load
    check(again, project.affine)
    assert again == first_run
    assert "Expected checksum" not in up.log_text()
