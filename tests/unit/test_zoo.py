"""The model zoo (tests/zoo.py) is what the other tests trust: every converted model answers as its
estimator does, on every row of its sample, and each model has the trait it stands for."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from servestack.conversion import check_answers, sample_columns, to_onnx, worst_row
from tests.zoo import ZooModel, news_tfidf

pytestmark = pytest.mark.slow  # trains and converts six models (once per session)
NAMES = ["wine-pipeline", "diabetes-gbr", "linnerud-multi", "news-tfidf", "cancer-hgb-nan", "diabetes-int"]


def onnx_answers(model: ZooModel) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, model.feed()), strict=True))


@pytest.mark.parametrize("name", NAMES)
def test_every_zoo_model_answers_as_its_estimator_does(zoo: dict[str, ZooModel], name: str) -> None:
    # GIVEN a zoo model WHEN its ONNX file runs on every row of its sample
    model = zoo[name]
    answers = onnx_answers(model)
    # THEN each output agrees with the estimator: labels exactly, numbers within float32 tolerance
    expected = model.expected()
    assert set(expected) <= set(answers)
    for output, values in expected.items():
        assert worst_row(output, values, answers[output]) is None
    assert model.rows >= 20


def input_kinds(model: ZooModel) -> dict[str, Any]:
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    return {node.name: (node.type, node.shape) for node in session.get_inputs()}


def test_each_zoo_model_has_the_trait_it_stands_for(zoo: dict[str, ZooModel]) -> None:
    # a ColumnTransformer pipeline: one [N, 1] input per column, a string column, string labels
    pipeline = input_kinds(zoo["wine-pipeline"])
    assert pipeline["shade"] == ("tensor(string)", [None, 1])
    assert pipeline["alcohol"] == ("tensor(float)", [None, 1])
    assert set(zoo["wine-pipeline"].expected()["label"]) == {"barolo", "grignolino", "barbera"}
    # one regression target, and two
    assert zoo["diabetes-gbr"].expected()["variable"].ndim == 1
    assert zoo["linnerud-multi"].expected()["variable"].shape == (20, 2)
    # one string input
    assert input_kinds(zoo["news-tfidf"]) == {"text": ("tensor(string)", [None, 1])}
    # NaN in the data: over a third of the rows have a missing value
    hgb = zoo["cancer-hgb-nan"]
    assert np.isnan(hgb.feed()["input"]).any(axis=1).mean() > 0.3
    # int64 columns
    assert input_kinds(zoo["diabetes-int"])["age"] == ("tensor(int64)", [None, 1])
    assert zoo["diabetes-int"].expected()["label"].dtype == np.int64


def test_the_check_catches_a_converter_that_answers_differently() -> None:
    # GIVEN a TfidfVectorizer with sublinear_tf=True, which skl2onnx 1.20 converts without matching it
    estimator, texts = news_tfidf(sublinear_tf=True)
    columns = sample_columns(texts)
    # WHEN its ONNX answers are compared with the estimator's
    mismatches, _ = check_answers(estimator, texts, columns, to_onnx(estimator, columns))
    # THEN the probabilities are outside the float32 tolerance, and the worst row is named
    assert [mismatch.output for mismatch in mismatches] == ["probabilities"]
    assert mismatches[0].excess > 1e-4
    assert "row" in mismatches[0].describe()
