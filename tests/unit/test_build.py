"""The committed ONNX files are faithful conversions of the scikit-learn models they were built from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from models.build import RECIPES, train
from models.service import ServedModel
from models.settings import ServingSettings
from tests.conftest import ARTIFACTS, REPO_ROOT


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_committed_onnx_predicts_what_scikit_learn_predicts(name: str) -> None:
    # GIVEN the scikit-learn model retrained by the seeded recipe, and the committed ONNX package
    estimator, features, _, labels = train(RECIPES[name])
    model = ServedModel.load(ARTIFACTS / name / RECIPES[name].version, ServingSettings())
    # WHEN both predict the whole dataset
    outputs = model.predict({"input": features})
    # THEN every label agrees and the probabilities match to float32 precision
    np.testing.assert_array_equal(outputs["label"], estimator.predict(features))
    np.testing.assert_allclose(outputs["probabilities"], estimator.predict_proba(features), atol=1e-5)
    assert list(model.manifest.labels or []) == labels


def test_rebuild_reproduces_the_committed_bytes(tmp_path: Path) -> None:
    # The build command pins the hash seed and BLAS threads itself; run it as a user does.
    subprocess.run(
        [sys.executable, "-m", "models.build", "--out", str(tmp_path)], cwd=REPO_ROOT, check=True, capture_output=True
    )
    for name in RECIPES:
        built, committed = tmp_path / name / "1", ARTIFACTS / name / "1"
        for file in ("model.onnx", "manifest.json", "sample-request.json", "sample-response.json"):
            assert (built / file).read_bytes() == (committed / file).read_bytes(), f"{name}/{file}"
