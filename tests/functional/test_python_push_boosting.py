"""`servestack.models.push` of real XGBoost and LightGBM models (converted by onnxmltools' converters through
skl2onnx), alone and inside a scikit-learn Pipeline with a ColumnTransformer: each is trained on a small pandas
DataFrame with named float and int columns and missing values, pushed into an artifacts folder in tmp, loaded by
the inference core and held to the estimator's own predictions and probabilities on every row."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from servestack import models
from servestack.conversion import BOOSTING_OPSET, feeds, sample_columns, worst_row
from servestack.inference.errors import InvalidInput
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings

pytestmark = pytest.mark.slow
ROWS = 120
# Few, shallow trees: the conversion is what is under test, not the model; this keeps each case well under a second.
TREES = 8


def houses() -> tuple[Any, np.ndarray, np.ndarray]:
    """A DataFrame of float and int columns (`age` a tenth missing, which both libraries route natively), a
    three-class target and a price."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "area": rng.normal(80, 25, ROWS),
            "rooms": rng.integers(1, 6, ROWS),
            "age": rng.normal(30, 12, ROWS),
        }
    )
    frame.loc[::10, "age"] = np.nan
    price = frame["area"] * 3 + frame["rooms"] * 20 - np.nan_to_num(frame["age"].to_numpy(), nan=30.0)
    grade = np.digitize(price, np.quantile(price, [1 / 3, 2 / 3]))
    return frame, grade, price.to_numpy()


def estimator(kind: str) -> tuple[Any, bool]:
    """A fresh (unfitted) estimator of `kind`, and whether it is a classifier."""
    if kind.startswith("xgboost"):
        from xgboost import XGBClassifier, XGBRegressor

        booster: Any = XGBClassifier if kind.endswith("classifier") else XGBRegressor
        return booster(n_estimators=TREES, max_depth=3, n_jobs=1), kind.endswith("classifier")
    from lightgbm import LGBMClassifier, LGBMRegressor

    booster = LGBMClassifier if kind.endswith("classifier") else LGBMRegressor
    return booster(n_estimators=TREES, num_leaves=7, n_jobs=1, verbose=-1), kind.endswith("classifier")


def served_answers(pushed: models.Pushed, artifacts: Path, frame: Any) -> tuple[ServedModel, dict[str, np.ndarray]]:
    served = ServedModel.load(
        artifacts / pushed.manifest.name / pushed.manifest.version, ServingSettings(providers="CPUExecutionProvider")
    )
    return served, served.predict(feeds(sample_columns(frame)))


def assert_answers_as_the_estimator(
    fitted: Any, frame: Any, served: ServedModel, answers: dict[str, np.ndarray]
) -> None:
    manifest = served.manifest
    mismatch = worst_row(manifest.primary_output, fitted.predict(frame), answers[manifest.primary_output])
    assert mismatch is None, mismatch.describe()
    if manifest.probability_output is not None:
        probabilities = answers[manifest.probability_output]
        mismatch = worst_row(manifest.probability_output, fitted.predict_proba(frame), probabilities)
        assert mismatch is None, mismatch.describe()


@pytest.mark.parametrize(
    "kind", ["xgboost-classifier", "xgboost-regressor", "lightgbm-classifier", "lightgbm-regressor"]
)
def test_a_boosting_model_fitted_on_a_dataframe_serves_its_own_answers(kind: str, tmp_path: Path) -> None:
    # GIVEN an XGBoost or LightGBM model fitted on a DataFrame with float and int columns and missing values
    frame, grade, price = houses()
    fitted, classifier = estimator(kind)
    fitted.fit(frame, grade if classifier else price)
    # WHEN it is pushed from Python
    pushed = models.push(fitted, frame, name="houses", artifacts=tmp_path / "artifacts")
    # THEN each column is an input of its own name and type, and missing values are allowed
    manifest = pushed.manifest
    assert [(spec.name, spec.dtype) for spec in manifest.inputs] == [
        ("area", "float32"), ("rooms", "int64"), ("age", "float32"),
    ]  # fmt: skip
    assert pushed.checked_rows == ROWS
    # AND the inference core gives the estimator's predictions (and probabilities) on every row, NaN included
    served, answers = served_answers(pushed, tmp_path / "artifacts", frame)
    assert_answers_as_the_estimator(fitted, frame, served, answers)
    if classifier:
        assert manifest.probability_output is not None
        assert answers[manifest.probability_output].shape == (ROWS, 3)
    # AND the graph imports the stated opsets, which every onnxruntime the runtime extra allows runs
    import onnx

    graph = onnx.load(str(tmp_path / "artifacts" / "houses" / "1" / manifest.file))
    imported = {opset.domain or "": opset.version for opset in graph.opset_import}
    assert imported.get("ai.onnx.ml") == BOOSTING_OPSET["ai.onnx.ml"]
    assert imported.get("", 0) <= BOOSTING_OPSET[""]
    # AND an XGBoost model still predicts on the DataFrame by column name after the conversion set its names aside
    if kind.startswith("xgboost"):
        assert fitted.get_booster().feature_names == ["area", "rooms", "age"]


@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_a_boosting_model_inside_a_column_transformer_pipeline_serves_its_own_answers(
    library: str, tmp_path: Path
) -> None:
    # GIVEN a Pipeline whose ColumnTransformer passes the number columns through and one-hot encodes a text one,
    # then a boosting classifier
    from sklearn.compose import ColumnTransformer
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder

    frame, grade, _ = houses()
    frame["town"] = np.array(["north", "south", "harbour"])[np.arange(ROWS) % 3]
    prepare = ColumnTransformer(
        [("numbers", "passthrough", ["area", "rooms", "age"]), ("town", OneHotEncoder(), ["town"])],
        sparse_threshold=0,
    )
    pipeline = Pipeline([("prepare", prepare), ("boost", estimator(f"{library}-classifier")[0])]).fit(frame, grade)
    # WHEN it is pushed from Python
    pushed = models.push(pipeline, frame, name="houses", artifacts=tmp_path / "artifacts")
    # THEN the text column is a string input beside the others
    assert [(spec.name, spec.dtype) for spec in pushed.manifest.inputs][-1] == ("town", "string")
    # AND the inference core gives the pipeline's labels and probabilities on every row
    served, answers = served_answers(pushed, tmp_path / "artifacts", frame)
    assert_answers_as_the_estimator(pipeline, frame, served, answers)


def test_a_lightgbm_model_without_onnxmltools_says_which_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a real LightGBM model, in a process where onnxmltools cannot be imported (None in sys.modules makes
    # an import raise ImportError, as on a machine without the extra)
    frame, _, price = houses()
    fitted = estimator("lightgbm-regressor")[0].fit(frame, price)
    for module in [name for name in sys.modules if name.split(".")[0] == "onnxmltools"] + ["onnxmltools"]:
        monkeypatch.setitem(sys.modules, module, None)
    # WHEN it is pushed THEN the refusal names the extra to install, and nothing is written
    with pytest.raises(InvalidInput) as refused:
        models.push(fitted, frame, name="houses", artifacts=tmp_path / "artifacts")
    assert "servestack[onnxmltools]" in (refused.value.allowed or "")
    assert not (tmp_path / "artifacts").exists()
