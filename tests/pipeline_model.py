"""A real user's tabular model, built once per test session: a scikit-learn Pipeline with a ColumnTransformer
(scaled numeric columns, a one-hot string column) and string class labels, converted with skl2onnx (one
`[None, 1]` input per column, ZipMap off) and packaged by `build_package`, as `servestack models push` does.

The frame is a pyarrow Table (scikit-learn selects its columns by name through the dataframe interchange
protocol); a pandas DataFrame works the same way.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

NUMERIC = ("sepal_length", "sepal_width", "petal_length", "petal_width")
STRING = "site"
COLUMNS = (*NUMERIC, STRING)
SITES = ("north", "south", "east")
SPECIES = ("setosa", "versicolor", "virginica")


@dataclass(frozen=True)
class PipelineModel:
    estimator: Any  # the fitted scikit-learn Pipeline
    onnx_file: Path
    package: Path  # <root>/flowers/1, a package as `models push` writes it
    root: Path  # a model_dir holding <name>/<version>/
    rows: dict[str, list[Any]]  # 12 rows by column, for requests
    expected: list[str]  # the estimator's predictions for them
    probabilities: np.ndarray  # the estimator's probabilities for them


def frame(columns: dict[str, list[Any]]) -> Any:
    import pyarrow as pa

    return pa.table({name: columns[name] for name in COLUMNS})


@functools.cache
def pipeline_model() -> PipelineModel:
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    from servestack.inference.packaging import build_package

    features, target = load_iris(return_X_y=True)
    features = features.astype(np.float32)
    data: dict[str, list[Any]] = {name: features[:, i].tolist() for i, name in enumerate(NUMERIC)}
    data[STRING] = [SITES[i % 3] for i in range(len(features))]
    labels = np.array(SPECIES)[target]
    classifier = LogisticRegression(max_iter=1000)
    pipeline = Pipeline(
        [
            (
                "prepare",
                ColumnTransformer([("scaled", StandardScaler(), list(NUMERIC)), ("sites", OneHotEncoder(), [STRING])]),
            ),
            ("classify", classifier),
        ]
    ).fit(frame(data), labels)
    inputs = [(name, FloatTensorType([None, 1])) for name in NUMERIC] + [(STRING, StringTensorType([None, 1]))]
    converted = to_onnx(pipeline, initial_types=inputs, options={id(classifier): {"zipmap": False}})
    work = Path(tempfile.mkdtemp(prefix="servestack-pipeline-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # built once per test process, removed with it
    onnx_file = work / "flowers.onnx"
    onnx_file.write_bytes(converted.SerializeToString())
    package = work / "models" / "flowers" / "1"
    build_package(onnx_file, package, name="flowers", version="1")
    rows = {name: values[::13] for name, values in data.items()}
    request = frame(rows)
    return PipelineModel(
        pipeline,
        onnx_file,
        package,
        work / "models",
        rows,
        pipeline.predict(request).tolist(),
        pipeline.predict_proba(request),
    )
