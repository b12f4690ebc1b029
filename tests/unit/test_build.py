"""The committed ONNX files are faithful conversions of the scikit-learn models they were built from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from servestack.sample_models import RECIPES, build_environment
from tests.conftest import ARTIFACTS, REPO_ROOT

TRAIN_AND_PREDICT = """
import sys
import numpy as np
from servestack.sample_models import RECIPES, train
estimator, features, _, labels = train(RECIPES[sys.argv[1]])
np.savez(sys.argv[2], features=features, label=estimator.predict(features), proba=estimator.predict_proba(features))
print("\\n".join(labels))
"""


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_committed_onnx_predicts_what_scikit_learn_predicts(name: str, tmp_path: Path) -> None:
    # GIVEN the scikit-learn model retrained by the seeded recipe in the build's environment (its BLAS kernels:
    # an AVX-512 machine's own give other last bits), and the committed ONNX package
    out = tmp_path / "predicted.npz"
    done = subprocess.run(
        [sys.executable, "-c", TRAIN_AND_PREDICT, name, str(out)],
        cwd=REPO_ROOT,
        env=build_environment(),
        capture_output=True,
        text=True,
        check=True,
    )
    trained = np.load(out)
    model = ServedModel.load(ARTIFACTS / name / RECIPES[name].version, ServingSettings())
    # WHEN both predict the whole dataset
    outputs = model.predict({"input": trained["features"]})
    # THEN every label agrees and the probabilities match to float32 precision
    np.testing.assert_array_equal(outputs["label"], trained["label"])
    np.testing.assert_allclose(outputs["probabilities"], trained["proba"], atol=1e-5)
    assert list(model.manifest.labels or []) == done.stdout.splitlines()


def test_rebuild_reproduces_the_committed_bytes(tmp_path: Path) -> None:
    # The build command pins the hash seed and BLAS threads itself; run it as a user does.
    subprocess.run(
        [sys.executable, "-m", "servestack.sample_models", "--out", str(tmp_path)],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    for name in RECIPES:
        built, committed = tmp_path / name / "1", ARTIFACTS / name / "1"
        for file in ("model.onnx", "manifest.json", "sample-request.json", "sample-response.json"):
            assert (built / file).read_bytes() == (committed / file).read_bytes(), f"{name}/{file}"
