"""`servestack.models.push(estimator, sample, name=...)`: every zoo model (tests/zoo.py) pushed from the
process that trained it, into a project-less artifacts folder and a directory registry in tmp, then loaded by
the real runtime and compared with its estimator; a conversion that answers differently, and a sample ONNX
cannot take, are refused before anything is written. XGBoost and LightGBM models:
test_python_push_boosting.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servestack import models
from servestack.conversion import feeds, sample_columns, worst_row
from servestack.inference import media_types
from servestack.inference.errors import InvalidInput
from servestack.inference.registry import DirectoryStore, ModelRegistry
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from tests.zoo import ZooModel, news_tfidf

pytestmark = pytest.mark.slow
NAMES = ["wine-pipeline", "diabetes-gbr", "linnerud-multi", "news-tfidf", "cancer-hgb-nan", "diabetes-int"]


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    return {"artifacts": tmp_path / "artifacts", "registry": tmp_path / "registry"}


def push(model: ZooModel, places: dict[str, Path], **extra: Any) -> models.Pushed:
    return models.push(
        model.estimator,
        model.sample,
        name=model.name,
        artifacts=places["artifacts"],
        registry=str(places["registry"]),
        **extra,
    )


def load(package: Path) -> ServedModel:
    return ServedModel.load(package, ServingSettings(providers="CPUExecutionProvider"))


@pytest.mark.parametrize("name", NAMES)
def test_a_zoo_model_pushed_from_python_serves_its_estimators_answers(
    zoo: dict[str, ZooModel], places: dict[str, Path], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a fitted zoo estimator and the sample it was trained on
    model = zoo[name]
    # WHEN it is pushed from Python
    pushed = push(model, places)
    out = capsys.readouterr().out
    # THEN `models push` wrote the package (its own report) and pushed it to the registry, as version 1
    assert pushed.manifest.key == f"{name}@1"
    assert pushed.checked_rows == model.rows
    assert f"{name}@1: packaged from" in out
    package = places["artifacts"] / name / "1"
    registry = ModelRegistry(DirectoryStore(places["registry"]))
    assert registry.versions(name) == ["1"]
    # AND its inputs are the sample's columns, named and typed as they are
    columns = sample_columns(model.sample)
    assert [(spec.name, spec.dtype) for spec in pushed.manifest.inputs] == [(c.name, c.kind) for c in columns]
    # AND the real runtime gives the estimator's answers on every row of the sample (NaN included)
    served = load(package)
    answers = served.predict(feeds(columns))
    for output, expected in model.expected().items():
        assert worst_row(output, expected, answers[output]) is None
    # AND the whole request pipeline answers the package's sample request as the estimator does
    request = (package / "sample-request.json").read_bytes()
    rows = models.sample_request_rows(columns)
    response = json.loads(served.infer(request, media_types.JSON, media_types.JSON).body)
    primary = "label" if model.classifier else "variable"
    assert worst_row(primary, model.expected(rows)[primary], np.asarray(response["predictions"])) is None
    assert json.loads((package / "sample-response.json").read_text())["predictions"] == response["predictions"]


def test_a_classifier_keeps_its_string_labels_and_a_version_can_be_given(
    zoo: dict[str, ZooModel], places: dict[str, Path]
) -> None:
    # GIVEN the wine pipeline WHEN it is pushed as version 7
    pushed = push(zoo["wine-pipeline"], places, version="7")
    # THEN the manifest carries its class labels, in the probability columns' order, and the prediction roles
    assert pushed.manifest.version == "7"
    assert pushed.manifest.labels == ("barbera", "barolo", "grignolino")
    assert (pushed.manifest.prediction_output, pushed.manifest.probability_output) == ("label", "probabilities")
    assert (places["artifacts"] / "wine-pipeline" / "7" / "manifest.json").is_file()


def test_an_estimator_without_a_column_transformer_still_takes_one_input_per_column(
    zoo: dict[str, ZooModel], places: dict[str, Path]
) -> None:
    # GIVEN a bare regressor fitted on int64 and float columns (scikit-learn casts them to one float matrix)
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import Ridge

    table = zoo["diabetes-int"].sample
    estimator = Ridge().fit(table, load_diabetes().target)
    # WHEN it is pushed
    pushed = models.push(estimator, table, name="ridge", artifacts=places["artifacts"])
    # THEN each column is an input of its own type, and the runtime gives the estimator's answers
    assert [(spec.name, spec.dtype) for spec in pushed.manifest.inputs] == [
        ("age", "int64"), ("sex", "int64"), ("bmi", "float32"), ("bp", "float32"),
    ]  # fmt: skip
    answers = load(places["artifacts"] / "ridge" / "1").predict(feeds(sample_columns(table)))
    assert worst_row("variable", estimator.predict(table), answers["variable"]) is None


def test_a_conversion_that_answers_differently_is_refused_before_anything_is_written(places: dict[str, Path]) -> None:
    # GIVEN a TfidfVectorizer with sublinear_tf=True, which skl2onnx converts but does not match
    estimator, texts = news_tfidf(sublinear_tf=True)
    # WHEN it is pushed THEN it is refused, naming the output, the worst row and the tolerance
    with pytest.raises(InvalidInput) as refused:
        models.push(estimator, texts, name="news", artifacts=places["artifacts"], registry=str(places["registry"]))
    message = refused.value.message
    assert "does not answer as the estimator does" in message
    assert "output 'probabilities' row" in message
    assert "1e-05 + 0.0001 * |estimator|" in message
    assert "nothing was written" in message
    # AND nothing was written
    assert not places["artifacts"].exists()
    assert not places["registry"].exists()


def test_a_sample_onnx_cannot_take_is_refused_naming_the_column(places: dict[str, Path]) -> None:
    # GIVEN a model trained on a table with a boolean column
    import pyarrow as pa
    from sklearn.linear_model import LogisticRegression

    table = pa.table({"age": np.arange(20, dtype=np.float32), "smoker": np.arange(20) % 2 == 0})
    estimator = LogisticRegression().fit(np.column_stack([table["age"], table["smoker"]]), np.arange(20) % 2)
    # WHEN it is pushed THEN the column and what is allowed are named, and nothing is written
    with pytest.raises(InvalidInput) as refused:
        models.push(estimator, table, name="smokers", artifacts=places["artifacts"])
    assert refused.value.field == "smoker"
    assert "cast booleans to int or float" in (refused.value.allowed or "")
    assert not places["artifacts"].exists()


def test_files_given_to_the_python_push_travel_with_the_package_and_its_hooks_read_them(
    places: dict[str, Path], tmp_path: Path
) -> None:
    # GIVEN a regressor, a labels file and a hook that reads it beside itself
    from sklearn.linear_model import LinearRegression

    features = np.arange(20, dtype=np.float32).reshape(10, 2)
    estimator = LinearRegression().fit(features, features.sum(axis=1))
    (tmp_path / "units.txt").write_text("grams\n", encoding="utf-8")
    hooks = tmp_path / "process.py"
    hooks.write_text(
        "from pathlib import Path\n\n"
        "UNIT = (Path(__file__).parent / 'units.txt').read_text().strip()\n\n\n"
        "def postprocess(outputs):\n"
        "    return {'predictions': outputs['variable'].ravel().tolist(), 'unit': UNIT}\n",
        encoding="utf-8",
    )
    # WHEN it is pushed from Python with files=
    pushed = models.push(
        estimator, features, name="weights", process=hooks, files=[tmp_path / "units.txt"],
        artifacts=places["artifacts"], registry=str(places["registry"]),
    )  # fmt: skip
    # THEN the manifest lists the file, the registry's copy holds it, and the hook answers with it
    assert [entry.name for entry in pushed.manifest.files] == ["units.txt"]
    assert (places["registry"] / "weights" / "1" / "units.txt").read_text() == "grams\n"
    fetched = ModelRegistry(DirectoryStore(places["registry"])).fetch("weights", "1", tmp_path / "cache")
    answer = json.loads(load(fetched).infer(b'{"instances": [[1, 2]]}', media_types.JSON, media_types.JSON).body)
    assert answer["unit"] == "grams"
