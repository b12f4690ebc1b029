"""The frameworks users bring, in all four modes under one `local up`: a Keras model (converted by tf2onnx through
`servestack.models.push` in tests/fixtures/deep_learning/export_frameworks.py, whose pushed package is committed
with Keras's own answers), and an XGBoost and a LightGBM classifier pushed from Python here, with the real
libraries, from a pandas DataFrame. Each deployment's answers are held to the framework's own: Keras's outputs
within float32 tolerance, the boosters' classes exactly and their probabilities within float32 tolerance.

- realtime, serverless, async: `servestack invoke NAME --data rows.json`;
- batch: a JSON Lines input of rows (a list per row for Keras, row objects by column for the boosters)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from servestack.conversion import worst_row
from tests.e2e.conftest import start_local_up
from tests.functional.test_python_push_boosting import estimator, houses

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SERVESTACK = str(Path(sys.executable).parent / "servestack")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "deep_learning"
MODES = {"rt": "realtime", "api": "serverless", "jobs": "async", "nightly": "batch"}
BOOSTERS = {"xgb-houses": "xgboost-classifier", "lgbm-houses": "lightgbm-classifier"}
MODELS = ["keras-mlp", *BOOSTERS]
ROWS = 6  # rows per request, none with a missing value (JSON has no NaN)


def cli(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([SERVESTACK, *args], cwd=root, env=env, capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    assert done.returncode == 0, f"servestack {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def answered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Any, dict[str, list[Any]]]]]:
    """Per deployment: (the framework's own answers, the deployment's predictions and probabilities)."""
    from servestack import models

    root = tmp_path_factory.mktemp("framework-modes")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SERVESTACK_"))}
    cli(root, env, "init", ".")
    artifacts = root / "models" / "artifacts"
    # GIVEN the Keras model's package, as models.push wrote it from Keras (export_frameworks.py)
    shutil.copytree(FIXTURES / "registry" / "keras-mlp" / "1", artifacts / "keras-mlp" / "1")
    keras_inputs = np.load(FIXTURES / "answers" / "keras-mlp" / "inputs.input.npy")[:ROWS]
    keras_outputs = np.load(FIXTURES / "answers" / "keras-mlp" / "outputs.output.npy")[:ROWS]
    requests: dict[str, Any] = {"keras-mlp": {"instances": keras_inputs.tolist()}}
    lines: dict[str, list[Any]] = {"keras-mlp": keras_inputs.tolist()}
    expected: dict[str, Any] = {"keras-mlp": keras_outputs}
    # AND the boosters fitted on a DataFrame and pushed from Python, with the real libraries
    frame, grade, _ = houses()
    complete = frame.dropna().head(ROWS)
    for name, kind in BOOSTERS.items():
        fitted, _ = estimator(kind)
        fitted.fit(frame, grade)
        models.push(fitted, frame, name=name, artifacts=artifacts)
        records = json.loads(complete.to_json(orient="records"))
        requests[name] = {"dataframe_records": records}
        lines[name] = records
        expected[name] = (fitted.predict(complete), fitted.predict_proba(complete))
    deployments: dict[str, dict[str, object]] = {}
    for model in MODELS:
        deployments.update({f"{model}-{suffix}": {"mode": mode, "model": model} for suffix, mode in MODES.items()})
        deployments[f"{model}-rt"]["instance_type"] = "ml.c6i.xlarge"
    spec = {"models": [{"name": model, "version": 1} for model in MODELS], "deployments": deployments}
    (root / "serving.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    for model in MODELS:
        (root / f"{model}.json").write_text(json.dumps(requests[model]))
        (root / f"{model}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines[model]))
    up = start_local_up(root, "--fresh", cwd=root, env=env, timeout_sec=600,
                        found_state=root / ".servestack" / "local.json")  # fmt: skip
    found: dict[str, tuple[Any, dict[str, list[Any]]]] = {}
    try:
        for model in MODELS:
            # WHEN each online deployment is sent the rows, and the batch deployment the rows' lines
            for suffix in ("rt", "api", "jobs"):
                body = json.loads(cli(root, env, "invoke", f"{model}-{suffix}", "--data", f"{model}.json").stdout)
                found[f"{model}-{suffix}"] = (expected[model], body)
            cli(root, env, "local", "put-input", f"{model}-nightly", f"{model}.jsonl")
            scores = root / f"{model}-scores.jsonl"
            cli(root, env, "local", "run-batch", f"{model}-nightly", "--download", str(scores))
            rows = sorted((json.loads(line) for line in scores.read_text().splitlines() if line.strip()),
                          key=lambda row: row["line"])  # fmt: skip
            assert all(row["error"] is None for row in rows), rows
            body = {"predictions": [row["prediction"] for row in rows]}
            per_class = [key for key in rows[0] if key.startswith("proba_")]  # a model of named columns' classes
            if per_class:
                body["probabilities"] = [[row[key] for key in per_class] for row in rows]
            found[f"{model}-nightly"] = (expected[model], body)
        yield found
    finally:
        assert up.stop() == 0


@pytest.mark.parametrize("deployment", [f"{model}-{suffix}" for model in MODELS for suffix in MODES])
def test_every_mode_answers_as_the_framework_does(
    answered: dict[str, tuple[Any, dict[str, list[Any]]]], deployment: str
) -> None:
    own, body = answered[deployment]
    if deployment.startswith("keras-mlp"):
        # THEN Keras's outputs, within float32 tolerance
        mismatch = worst_row("output", own, np.asarray(body["predictions"], dtype=np.float32))
    else:
        # THEN the booster's classes exactly, and its probabilities within float32 tolerance
        classes, probabilities = own
        assert body["predictions"] == classes.tolist(), deployment
        mismatch = worst_row("probabilities", probabilities, np.asarray(body["probabilities"], dtype=np.float32))
    assert mismatch is None, f"{deployment}: {mismatch.describe()}"
