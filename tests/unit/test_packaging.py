"""Packaging any ONNX file: skl2onnx's ZipMap output becomes a tensor, class labels come from the graph, and
the sample request/response are written by the pipeline every mode serves with."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servestack.inference.errors import InvalidInput
from servestack.inference.manifest import read_manifest, sha256_of
from servestack.inference.packaging import build_package
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from tests.conftest import ARTIFACTS, REPO_ROOT


@pytest.fixture(scope="module")
def iris() -> tuple[np.ndarray, np.ndarray, list[str]]:
    from sklearn.datasets import load_iris

    data = load_iris()
    return data.data.astype(np.float32), data.target, [str(name) for name in data.target_names]


def skl2onnx_default(estimator: Any, features: np.ndarray, path: Path) -> Path:
    """The conversion as skl2onnx's docs show it: no options, so classifiers keep their ZipMap output."""
    from skl2onnx import to_onnx

    path.write_bytes(to_onnx(estimator, features[:1]).SerializeToString())
    return path


def served(package: Path) -> ServedModel:
    settings = ServingSettings(model_dir=package, providers="CPUExecutionProvider", warmup=False)
    return ServedModel.load(package, settings)


def answer(model: ServedModel, rows: np.ndarray, accept: str = "application/json") -> Any:
    body = json.dumps({"instances": rows.tolist()}).encode()
    encoded = model.infer(body, "application/json", accept).body
    return json.loads(encoded) if accept == "application/json" else encoded.decode()


def test_zipmap_output_becomes_the_probability_tensor_and_predictions_match_sklearn(
    iris: tuple[np.ndarray, np.ndarray, list[str]], tmp_path: Path
) -> None:
    from sklearn.linear_model import LogisticRegression

    # GIVEN an iris classifier converted with skl2onnx's defaults: output_probability is seq(map(int64, float))
    features, target, _ = iris
    classifier = LogisticRegression(max_iter=500).fit(features, target)
    onnx_file = skl2onnx_default(classifier, features, tmp_path / "iris.onnx")

    # WHEN it is packaged
    built = build_package(onnx_file, tmp_path / "package", name="iris", version="1")

    # THEN the ZipMap is gone: both outputs are tensors, roles and labels come from the graph
    manifest = built.manifest
    assert [(o.name, o.dtype, o.shape) for o in manifest.outputs] == [
        ("output_label", "int64", (None,)),
        ("output_probability", "float32", (None, 3)),
    ]
    assert (manifest.prediction_output, manifest.probability_output) == ("output_label", "output_probability")
    assert manifest.labels == (0, 1, 2)  # the classes as trained: integers
    assert built.labels_source == "the graph"
    assert any("ZipMap" in change for change in built.changes)
    # AND the served answers equal scikit-learn's
    got = answer(served(built.directory), features)
    assert got["predictions"] == classifier.predict(features).tolist()
    np.testing.assert_allclose(got["probabilities"], classifier.predict_proba(features), atol=1e-5)


def test_string_classes_are_recorded_as_labels_and_served_as_text(
    iris: tuple[np.ndarray, np.ndarray, list[str]], tmp_path: Path
) -> None:
    from sklearn.tree import DecisionTreeClassifier

    # GIVEN a classifier trained on class names (its ONNX label output is a string tensor)
    features, target, names = iris
    classes = np.array(names)[target]
    classifier = DecisionTreeClassifier(random_state=0).fit(features, classes)
    onnx_file = skl2onnx_default(classifier, features, tmp_path / "names.onnx")

    # WHEN it is packaged and asked for JSON and CSV
    built = build_package(onnx_file, tmp_path / "package", name="iris", version="1")
    model = served(built.directory)
    as_json = answer(model, features[:3])
    as_csv = answer(model, features[:3], accept="text/csv")

    # THEN the labels are the graph's class names and the predictions come back as text in both types
    assert built.manifest.labels == tuple(names)
    assert as_json["predictions"] == classifier.predict(features[:3]).tolist()
    assert as_json["labels"] == as_json["predictions"]
    assert [line.split(",")[0] for line in as_csv.splitlines()] == as_json["predictions"]


def test_integer_classes_are_recorded_as_integers_and_each_prediction_names_its_own(
    iris: tuple[np.ndarray, np.ndarray, list[str]], tmp_path: Path
) -> None:
    from sklearn.linear_model import LogisticRegression

    # GIVEN classes 1, 5, 7: the model predicts the class values themselves, not indexes
    features, target, _ = iris
    classifier = LogisticRegression(max_iter=500).fit(features, np.array([1, 5, 7])[target])
    onnx_file = skl2onnx_default(classifier, features, tmp_path / "gaps.onnx")

    # WHEN it is packaged without --labels
    built = build_package(onnx_file, tmp_path / "package", name="gaps", version="1")

    # THEN the labels are the original integer classes, and each answer's label is its predicted class
    assert built.manifest.labels == (1, 5, 7)
    assert built.labels_note is None
    got = answer(served(built.directory), features[::25])
    assert got["predictions"] == classifier.predict(features[::25]).tolist()
    assert got["labels"] == got["predictions"]
    assert all(type(label) is int for label in got["labels"])


def test_labels_given_replace_the_graphs_and_must_name_every_class(
    iris: tuple[np.ndarray, np.ndarray, list[str]], tmp_path: Path
) -> None:
    from sklearn.linear_model import LogisticRegression

    features, target, names = iris
    onnx_file = skl2onnx_default(LogisticRegression(max_iter=500).fit(features, target), features, tmp_path / "m.onnx")

    # WHEN --labels names the three classes THEN they are recorded, and said to come from --labels
    built = build_package(onnx_file, tmp_path / "good", name="iris", version="1", labels=names)
    assert (built.manifest.labels, built.labels_source) == (tuple(names), "--labels")
    # WHEN it names two THEN the push is refused with the count the model has
    with pytest.raises(InvalidInput) as refused:
        build_package(onnx_file, tmp_path / "bad", name="iris", version="1", labels=["a", "b"])
    assert refused.value.field == "labels"
    assert "3 classes" in refused.value.message


def test_a_zipmap_that_cannot_be_converted_is_refused_with_the_exact_fix(
    iris: tuple[np.ndarray, np.ndarray, list[str]], tmp_path: Path
) -> None:
    from sklearn.linear_model import LogisticRegression

    # GIVEN a ZipMap model, on a machine without the `onnx` package (a serving image: no cli extra)
    features, target, _ = iris
    skl2onnx_default(LogisticRegression(max_iter=500).fit(features, target), features, tmp_path / "m.onnx")
    script = (
        "import sys; sys.modules['onnx'] = None\n"  # what `import onnx` does where it is not installed
        "from pathlib import Path\n"
        "from servestack.inference.packaging import build_package\n"
        f"build_package(Path({str(tmp_path / 'm.onnx')!r}), Path({str(tmp_path / 'p')!r}), name='m', version='1')\n"
    )

    # WHEN it is packaged
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=False)

    # THEN it is refused, naming the output and the conversion options that avoid the ZipMap
    assert done.returncode != 0
    assert "ModelLoadError" in done.stderr
    assert "output_probability" in done.stderr
    assert 'options={"zipmap": False}' in done.stderr
    assert 'options={id(clf): {"zipmap": False}}' in done.stderr


def test_sample_files_come_from_the_signature_and_hold_the_served_answer(tmp_path: Path) -> None:
    # GIVEN the bundled digits model (64 float features, no ZipMap)
    source = ARTIFACTS / "digits" / "1" / "model.onnx"

    # WHEN it is packaged
    built = build_package(source, tmp_path / "package", name="digits", version="7")

    # THEN the model bytes are unchanged, the sample request has rows of the model's width,
    # and the sample response is what the served model answers to it
    assert built.manifest.sha256 == sha256_of(source)
    request = json.loads((built.directory / "sample-request.json").read_text())
    response = json.loads((built.directory / "sample-response.json").read_text())
    assert [len(row) for row in request["instances"]] == [64, 64]
    full = answer(served(built.directory), np.array(request["instances"], dtype=np.float32))
    assert response == {"predictions": full["predictions"]}
    assert read_manifest(built.directory).labels is None  # an MLP graph carries no classifier node with labels


def test_sample_rows_given_are_used_and_bad_ones_are_refused(tmp_path: Path) -> None:
    source = ARTIFACTS / "digits" / "1" / "model.onnx"
    rows = [[float(i % 16) for i in range(64)]]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    (tmp_path / "short.json").write_text(json.dumps([[1.0, 2.0]]))

    # WHEN --sample names good rows THEN they are the sample request
    built = build_package(source, tmp_path / "good", name="digits", version="1", sample=tmp_path / "rows.json")
    assert json.loads((built.directory / "sample-request.json").read_text()) == {"instances": rows}
    # WHEN the rows do not fit the model THEN the push is refused, naming --sample and what is allowed
    with pytest.raises(InvalidInput) as refused:
        build_package(source, tmp_path / "bad", name="digits", version="1", sample=tmp_path / "short.json")
    assert refused.value.message.startswith("--sample: the model refused it")


# ------------------------------------------------------------------------------------------ columns and samples


def summing_onnx(tmp_path: Path) -> Path:
    from tests.tabular_fixtures import summing_model

    return summing_model(tmp_path / "summing.onnx")


SAMPLES = {
    "rows.csv": "b,a,c\n2,1,3\n,4.5,6\n",
    "rows.jsonl": '{"b": 2, "a": 1, "c": 3}\n\n{"b": NaN, "a": 4.5, "c": 6}\n',
    "rows.json": json.dumps({"dataframe_records": [{"b": 2, "a": 1, "c": 3}, {"b": None, "a": 4.5, "c": 6}]}),
}


@pytest.mark.parametrize("file", [*sorted(SAMPLES), "rows.parquet"])
def test_a_sample_file_names_the_columns_of_one_input_and_becomes_the_sample_request(tmp_path: Path, file: str) -> None:
    # GIVEN a model with one [N, 3] input and a sample of rows whose columns are named (b first), with a
    # missing value in b
    if file == "rows.parquet":
        import pyarrow as pa
        import pyarrow.parquet as parquet

        parquet.write_table(pa.table({"b": [2.0, None], "a": [1.0, 4.5], "c": [3.0, 6.0]}), tmp_path / file)
    else:
        (tmp_path / file).write_text(SAMPLES[file])
    # WHEN it is packaged with the sample and NaN allowed in b
    source = summing_onnx(tmp_path)
    built = build_package(
        source, tmp_path / "package", name="summing", version="1", sample=tmp_path / file, allow_nan=["b"]
    )
    # THEN the columns are the file's names, in its order, b allowing NaN, and the sample request is its rows
    columns = built.manifest.columns
    assert columns is not None
    assert [(c.name, c.index, c.allow_nan) for c in columns] == [("b", 0, True), ("a", 1, False), ("c", 2, False)]
    request = json.loads((built.directory / "sample-request.json").read_text())
    if file != "rows.json":
        assert request == {"dataframe_split": {"columns": ["b", "a", "c"], "data": [[2, 1, 3], [None, 4.5, 6]]}}
    response = json.loads((built.directory / "sample-response.json").read_text())
    assert response["predictions"][0] == 6.0  # one target: flat
    assert response["predictions"][1] is None  # NaN reached the model (and orjson writes it as null)


def test_columns_flag_names_them_and_mistakes_are_refused_with_the_allowed_values(tmp_path: Path) -> None:
    source = summing_onnx(tmp_path)
    built = build_package(source, tmp_path / "ok", name="summing", version="1", columns=["x1", "x2", "x3"])
    assert [c.name for c in built.manifest.columns or ()] == ["x1", "x2", "x3"]
    request = json.loads((built.directory / "sample-request.json").read_text())
    assert request["dataframe_split"]["columns"] == ["x1", "x2", "x3"]
    for kwargs, said in (
        ({"columns": ["a", "b"]}, "2 column names ['a', 'b'] for input 'x' of 3 columns"),
        ({"columns": ["a", "b", "c"], "allow_nan": ["d"]}, "'d' is not a column"),
        ({"allow_nan": True}, "--allow-nan: this model has no named columns"),
    ):
        with pytest.raises(InvalidInput, match=re.escape(said)):
            build_package(source, tmp_path / "bad", name="summing", version="1", **kwargs)
    digits = ARTIFACTS / "digits" / "1" / "model.onnx"
    (tmp_path / "short.csv").write_text("a,b\n1,2\n")
    with pytest.raises(InvalidInput, match=re.escape("--sample short.csv: 2 column names")):
        build_package(digits, tmp_path / "digits", name="digits", version="1", sample=tmp_path / "short.csv")
    (tmp_path / "rows.txt").write_text("1,2\n")
    with pytest.raises(InvalidInput, match=r"\.txt is not a sample format"):
        build_package(digits, tmp_path / "txt", name="digits", version="1", sample=tmp_path / "rows.txt")
