"""The committed ONNX files are faithful conversions of the scikit-learn models they were built from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.build import RECIPES
from models.service import ServedModel
from models.settings import ServingSettings
from tests.conftest import ARTIFACTS


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_committed_onnx_predicts_what_scikit_learn_predicts(name: str) -> None:
    # GIVEN the scikit-learn model retrained by the seeded recipe, and the committed ONNX package
    estimator, features, _, labels = RECIPES[name].train()
    model = ServedModel.load(ARTIFACTS / name / RECIPES[name].version, ServingSettings())
    # WHEN both predict the whole dataset
    outputs = model.predict({"input": features})
    # THEN every label agrees and the probabilities match to float32 precision
    np.testing.assert_array_equal(outputs["label"], estimator.predict(features))
    np.testing.assert_allclose(outputs["probabilities"], estimator.predict_proba(features), atol=1e-5)
    assert list(model.manifest.labels or []) == labels


def test_rebuild_reproduces_the_committed_bytes(tmp_path: Path) -> None:
    from models.build import build

    built = build(RECIPES["digits"], tmp_path)
    assert (built / "model.onnx").read_bytes() == (ARTIFACTS / "digits" / "1" / "model.onnx").read_bytes()
    committed = ARTIFACTS / "digits" / "1" / "sample-response.json"
    assert (built / "sample-response.json").read_text() == committed.read_text()
