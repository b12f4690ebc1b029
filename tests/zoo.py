"""A zoo of the models users bring, built inside the tests from scikit-learn's bundled datasets (nothing is
downloaded), each converted to ONNX with skl2onnx and kept next to its estimator, so that any answer
servestack gives can be compared with the estimator's own.

- `wine-pipeline`: ColumnTransformer (scaled numbers + one-hot `shade` text) -> LogisticRegression; four float
  and one string [N, 1] inputs; string labels (the three cultivars).
- `diabetes-gbr`: GradientBoostingRegressor with one target; `input` float [N, 10].
- `linnerud-multi`: LinearRegression with two targets (weight, waist); `input` float [N, 3].
- `news-tfidf`: TfidfVectorizer -> LogisticRegression on a small synthetic text set; `text` string [N, 1];
  string labels.
- `cancer-hgb-nan`: HistGradientBoostingClassifier, ~10% of the values NaN; `input` float [N, 6]; string labels.
- `diabetes-int`: ColumnTransformer with int64 `age` / `sex` columns -> LogisticRegression; two int64 and two
  float [N, 1] inputs; int labels.

Tabular samples are pyarrow Tables (scikit-learn fits and predicts on them by column name as on a pandas
DataFrame); the text model's sample is a one-dimensional array of strings. `build_zoo` trains and converts
everything in a few seconds; the `zoo` fixture (tests/conftest.py) does it once per session.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servestack.conversion import Column, feeds, sample_columns, to_onnx

SEED = 0
WINE_COLUMNS = ("alcohol", "malic_acid", "color_intensity", "proline")
WINE_CULTIVARS = np.array(["barolo", "grignolino", "barbera"])  # the three cultivars of the UCI wine data


@dataclass(frozen=True)
class ZooModel:
    """A fitted estimator, the sample it predicts on, and its ONNX file with the inputs that file takes."""

    name: str
    estimator: Any
    sample: Any  # pyarrow Table, or a 1-D object array of text
    columns: list[Column]  # the ONNX file's inputs, holding the sample's values
    onnx_path: Path
    classifier: bool

    @property
    def rows(self) -> int:
        return len(self.sample)

    def sample_rows(self, index: np.ndarray) -> Any:
        """The sample's rows at `index`, in the sample's own type (what the estimator predicts on)."""
        if hasattr(self.sample, "column_names"):
            return self.sample.take(index)
        return np.asarray(self.sample)[index]

    def feed(self, index: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The ONNX file's inputs for the rows at `index` (every row by default)."""
        return feeds(self.columns, index)

    def expected(self, index: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The estimator's answers, keyed by the ONNX output they correspond to."""
        rows = self.sample if index is None else self.sample_rows(index)
        if self.classifier:
            return {
                "label": np.asarray(self.estimator.predict(rows)),
                "probabilities": np.asarray(self.estimator.predict_proba(rows)),
            }
        return {"variable": np.asarray(self.estimator.predict(rows), dtype=np.float64)}

    def request(self, index: np.ndarray) -> dict[str, Any]:
        """A JSON request body for the rows at `index`: `instances` for a one-input model, `inputs` else."""
        arrays = self.feed(index)
        if len(arrays) == 1:
            return {"instances": next(iter(arrays.values())).tolist()}
        return {"inputs": {name: values.tolist() for name, values in arrays.items()}}


def _table(columns: dict[str, np.ndarray]) -> Any:
    import pyarrow as pa

    return pa.table(columns)


def _single_input(table: Any) -> list[Column]:
    """One float [N, k] input named `input` holding every column of `table`, as `to_onnx(model, X)` gives."""
    matrix = np.column_stack([np.asarray(table[name], dtype=np.float32) for name in table.column_names])
    return [Column("input", "float32", matrix)]


def wine_pipeline() -> tuple[Any, Any]:
    """The newcomer's pipeline: scaled numeric columns, a one-hot text column, string class labels."""
    from sklearn.compose import ColumnTransformer
    from sklearn.datasets import load_wine
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    wine = load_wine()
    data = {name: wine.data[:, wine.feature_names.index(name)].astype(np.float32) for name in WINE_COLUMNS}
    hue = wine.data[:, wine.feature_names.index("hue")]
    data["shade"] = np.where(hue < 0.78, "amber", np.where(hue < 1.1, "ruby", "pale")).astype(object)
    table = _table(data)
    pipeline = Pipeline(
        [
            (
                "prepare",
                ColumnTransformer(
                    [
                        ("numbers", StandardScaler(), list(WINE_COLUMNS)),
                        ("shade", OneHotEncoder(handle_unknown="ignore"), ["shade"]),
                    ]
                ),
            ),
            ("classify", LogisticRegression(max_iter=1000)),
        ]
    )
    return pipeline.fit(table, WINE_CULTIVARS[wine.target]), table


def diabetes_gbr() -> tuple[Any, Any]:
    from sklearn.datasets import load_diabetes
    from sklearn.ensemble import GradientBoostingRegressor

    diabetes = load_diabetes()
    table = _table({name: diabetes.data[:, i].astype(np.float32) for i, name in enumerate(diabetes.feature_names)})
    model = GradientBoostingRegressor(n_estimators=60, max_depth=3, random_state=SEED)
    return model.fit(table, diabetes.target), table


def linnerud_multi() -> tuple[Any, Any]:
    from sklearn.datasets import load_linnerud
    from sklearn.linear_model import LinearRegression

    linnerud = load_linnerud()
    table = _table({name: linnerud.data[:, i].astype(np.float32) for i, name in enumerate(linnerud.feature_names)})
    targets = linnerud.target[:, :2]  # weight, waist
    return LinearRegression().fit(table, targets), table


NEWS_WORDS = {
    "cars": ["engine", "wheels", "brakes", "fuel", "gearbox", "tyres", "clutch", "garage", "motorway", "driver"],
    "sport": ["goal", "match", "referee", "striker", "league", "coach", "stadium", "penalty", "season", "keeper"],
    "food": ["recipe", "oven", "flour", "butter", "garlic", "sauce", "bake", "simmer", "pepper", "dough"],
}
COMMON_WORDS = ["the", "a", "and", "of", "with", "for", "new", "last", "today", "our"]


def news_texts(rows: int = 90) -> tuple[np.ndarray, np.ndarray]:
    """A small synthetic news set: each text mixes its topic's words with common ones (seeded)."""
    rng = np.random.default_rng(SEED)
    topics = np.array(sorted(NEWS_WORDS))
    labels = topics[np.arange(rows) % len(topics)]
    texts = []
    for topic in labels:
        words = list(rng.choice(NEWS_WORDS[str(topic)], size=4)) + list(rng.choice(COMMON_WORDS, size=3))
        rng.shuffle(words)
        texts.append(" ".join(words))
    return np.array(texts, dtype=object), labels


def news_tfidf(sublinear_tf: bool = False) -> tuple[Any, Any]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    texts, labels = news_texts()
    pipeline = Pipeline([("tfidf", TfidfVectorizer(sublinear_tf=sublinear_tf)), ("classify", LogisticRegression())])
    return pipeline.fit(texts, labels), texts


def cancer_hgb_nan() -> tuple[Any, Any]:
    """Six breast-cancer measurements with ~10% of the values missing (NaN), which HistGradientBoosting learns
    a direction for."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.ensemble import HistGradientBoostingClassifier

    cancer = load_breast_cancer()
    names = [name.replace(" ", "_") for name in cancer.feature_names[:6]]
    values = cancer.data[:, :6].astype(np.float32)
    values[np.random.default_rng(SEED).random(values.shape) < 0.1] = np.nan
    table = _table({name: values[:, i] for i, name in enumerate(names)})
    model = HistGradientBoostingClassifier(max_iter=30, max_depth=3, random_state=SEED)
    return model.fit(table, cancer.target_names[cancer.target]), table


def diabetes_int() -> tuple[Any, Any]:
    """int64 `age` and `sex` columns (the unscaled diabetes data): does the progression exceed the median?"""
    from sklearn.compose import ColumnTransformer
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    diabetes = load_diabetes(scaled=False)
    table = _table(
        {
            "age": diabetes.data[:, 0].astype(np.int64),
            "sex": diabetes.data[:, 1].astype(np.int64),
            "bmi": diabetes.data[:, 2].astype(np.float32),
            "bp": diabetes.data[:, 3].astype(np.float32),
        }
    )
    pipeline = Pipeline(
        [
            (
                "prepare",
                ColumnTransformer(
                    [
                        ("numbers", StandardScaler(), ["age", "bmi", "bp"]),
                        ("sex", OneHotEncoder(handle_unknown="ignore"), ["sex"]),
                    ]
                ),
            ),
            ("classify", LogisticRegression()),
        ]
    )
    high = (diabetes.target > np.median(diabetes.target)).astype(np.int64)
    return pipeline.fit(table, high), table


def build_zoo(directory: Path) -> dict[str, ZooModel]:
    """Train and convert every zoo model, writing `<name>.onnx` files into `directory`."""
    from sklearn.base import is_classifier

    directory.mkdir(parents=True, exist_ok=True)
    builders = {
        "wine-pipeline": (wine_pipeline, sample_columns),
        "diabetes-gbr": (diabetes_gbr, _single_input),
        "linnerud-multi": (linnerud_multi, _single_input),
        "news-tfidf": (news_tfidf, lambda texts: [Column("text", "string", texts.reshape(-1, 1))]),
        "cancer-hgb-nan": (cancer_hgb_nan, _single_input),
        "diabetes-int": (diabetes_int, sample_columns),
    }
    zoo: dict[str, ZooModel] = {}
    for name, (train, inputs_of) in builders.items():
        estimator, sample = train()
        columns = inputs_of(sample)
        path = directory / f"{name}.onnx"
        path.write_bytes(to_onnx(estimator, columns))
        zoo[name] = ZooModel(name, estimator, sample, columns, path, is_classifier(estimator))
    return zoo
