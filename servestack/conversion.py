"""scikit-learn (and, with `onnxmltools`, LightGBM / XGBoost) models to ONNX, in the user's own process.

The inputs come from the sample the model was trained on: a DataFrame (pandas, polars or a pyarrow Table)
gives one `[N, 1]` input per column, named after it and typed by its dtype (float columns as float32, integer
columns as int64, text columns as strings), which is how skl2onnx converts a `ColumnTransformer` pipeline; a
one-dimensional sample (a text column) gives one `[N, 1]` input; a two-dimensional array gives one `[N, k]`
input named `input`. An estimator that does not start with a `ColumnTransformer` takes one matrix, so a `Concat`
of the column inputs is put in front of its graph: every tabular model has one named input per column.

Three habits of skl2onnx 1.20 are handled here, each found by comparing answers with scikit-learn's:
- a `ZipMap` (a list of {class: probability} maps) is added to classifiers unless the `zipmap` option is off;
- `TfidfVectorizer`'s converter asks for the `en_US.UTF-8` locale, which many machines (containers) lack:
  the `C` locale is passed through its `locale` option;
- the tree converter writes the `missing_go_to_left` flags of `HistGradientBoosting*` as booleans, which the
  `onnx` package refuses in an integer attribute: they are written as 0/1 during the conversion.

And two of onnxmltools' boosting converters (1.16), found by pushing real XGBoost and LightGBM models:
- without a `target_opset`, skl2onnx targets the newest `ai.onnx.ml` opset the `onnx` package knows (5), which
  the converters then write and skl2onnx itself refuses ("version 5 of domain 'ai.onnx.ml' not supported"):
  boosting models are converted at `BOOSTING_OPSET`;
- the XGBoost converter reads feature ids from the booster's text dump, which names features by the
  DataFrame's column names once the model was fitted on one, and it understands only `f0`, `f1`...: the
  booster's feature names are set aside during the conversion (the ONNX inputs keep the column names).

Nothing here is trusted on its own: `check_answers` holds the ONNX answers to the estimator's own.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from servestack.inference.errors import InvalidInput

ColumnKind = Literal["float32", "int64", "string"]
SINGLE_INPUT = "input"
# float32 tolerance of an ONNX answer against the estimator's float64 one: |onnx - estimator| must be at most
# ABSOLUTE_TOLERANCE + RELATIVE_TOLERANCE * |estimator|. A float32 carries ~7 significant digits; tree sums and
# linear algebra done in float32 lose a few more, which 1e-4 relative leaves room for. Labels must be equal.
RELATIVE_TOLERANCE = 1e-4
ABSOLUTE_TOLERANCE = 1e-5
TOLERANCE_TEXT = f"|onnx - estimator| <= {ABSOLUTE_TOLERANCE:g} + {RELATIVE_TOLERANCE:g} * |estimator|"


@dataclass(frozen=True)
class Column:
    """One ONNX input taken from the sample: its name, element type, width and the sample's values."""

    name: str
    kind: ColumnKind
    values: np.ndarray  # [N, width], in the input's dtype (object for strings)

    @property
    def width(self) -> int:
        return int(self.values.shape[1])


# ------------------------------------------------------------------------------------------ the sample


def _kind_of(name: str, values: np.ndarray) -> ColumnKind:
    kind = values.dtype.kind
    if kind == "f":
        return "float32"
    if kind in "iu":
        return "int64"
    if kind in "OUST":
        odd = next((v for v in values.reshape(-1) if not isinstance(v, str)), None) if kind == "O" else None
        if kind == "O" and odd is not None:
            raise InvalidInput(
                f"column {name!r}: holds {type(odd).__name__} {odd!r} among its values; a text column holds only "
                "strings",
                field=name,
                value=repr(odd),
                allowed="float, integer or string columns (fill missing text with a string first)",
            )
        return "string"
    raise InvalidInput(
        f"column {name!r}: dtype {values.dtype} cannot be an ONNX input here",
        field=name,
        value=str(values.dtype),
        allowed="float (float32), integer (int64) or text (string) columns; cast booleans to int or float",
    )


def _typed(values: np.ndarray, kind: ColumnKind) -> np.ndarray:
    if kind == "string":
        return values.astype(object)
    return values.astype(np.float32 if kind == "float32" else np.int64)


def column_names(sample: Any) -> list[str] | None:
    """The column names of a DataFrame-like sample (pandas, polars, pyarrow), else None."""
    names = getattr(sample, "column_names", None)  # pyarrow Table / RecordBatch
    if names is None and not isinstance(sample, np.ndarray) and getattr(sample, "ndim", 2) == 2:
        names = getattr(sample, "columns", None)  # pandas / polars DataFrame
    return [str(name) for name in names] if names is not None else None


def sample_columns(sample: Any) -> list[Column]:
    """The model's inputs as the sample defines them (see the module's docstring)."""
    names = column_names(sample)
    if names is not None:
        if not names:
            raise InvalidInput("the sample has no columns", field="sample", allowed="a DataFrame with columns")
        columns = []
        for name in names:
            values = np.asarray(sample[name])
            kind = _kind_of(name, values)
            columns.append(Column(name, kind, _typed(values.reshape(-1, 1), kind)))
        return columns
    values = np.asarray(sample)
    if values.ndim not in (1, 2):
        raise InvalidInput(
            f"the sample has {values.ndim} dimensions",
            field="sample",
            value=str(values.shape),
            allowed="a DataFrame (pandas, polars, pyarrow), a 1-D column or a 2-D array",
        )
    name = str(getattr(sample, "name", None) or SINGLE_INPUT)
    kind = _kind_of(name, values)
    return [Column(name, kind, _typed(values.reshape(len(values), -1), kind))]


def feeds(columns: list[Column], rows: slice | np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The ONNX inputs for the sample's rows (all of them by default)."""
    chosen = slice(None) if rows is None else rows
    return {column.name: np.ascontiguousarray(column.values[chosen]) for column in columns}


# ------------------------------------------------------------------------------------------ converting


def initial_types(columns: list[Column]) -> list[tuple[str, Any]]:
    from skl2onnx.common.data_types import FloatTensorType, Int64TensorType, StringTensorType

    makers = {"float32": FloatTensorType, "int64": Int64TensorType, "string": StringTensorType}
    return [(c.name, makers[c.kind]([None, c.width])) for c in columns]


def steps_of(estimator: Any) -> Iterator[Any]:
    """The estimator and every fitted estimator inside it (pipelines, column transformers, unions, the members
    and final estimator of stacking and voting ensembles)."""
    yield estimator
    children: list[Any] = []
    for attribute in ("steps", "transformers_", "transformer_list"):
        children.extend(item[1] for item in getattr(estimator, attribute, None) or ())
    if _is_stack(estimator):
        children.extend(getattr(estimator, "estimators_", None) or ())
        children.append(getattr(estimator, "final_estimator_", None))
    for child in children:
        if hasattr(child, "fit"):  # not "drop", "passthrough" or None
            yield from steps_of(child)


def _is_stack(estimator: Any) -> bool:
    return type(estimator).__name__.startswith(("Stacking", "Voting"))


def converter_options(estimator: Any) -> dict[int, dict[str, Any]]:
    """Per-step skl2onnx options: no ZipMap on classifiers, the `C` locale for text vectorizers."""
    from sklearn.base import is_classifier

    options: dict[int, dict[str, Any]] = {}
    for step in steps_of(estimator):
        name = type(step).__name__
        if is_classifier(step) and hasattr(step, "predict_proba"):
            options.setdefault(id(step), {})["zipmap"] = False
        if name in ("TfidfVectorizer", "CountVectorizer"):
            options.setdefault(id(step), {})["locale"] = "C"
    return options


@contextlib.contextmanager
def _integer_missing_flags() -> Iterator[None]:
    """During one conversion, skl2onnx's tree writer gets 0/1 instead of booleans for the missing-value
    direction of `HistGradientBoosting*` nodes (the `onnx` package refuses booleans in `ints`)."""
    from skl2onnx.common import tree_ensemble

    original: Callable[..., Any] = tree_ensemble.add_node

    def add_node(*args: Any, **kwargs: Any) -> Any:
        if "nodes_missing_value_tracks_true" in kwargs:
            kwargs["nodes_missing_value_tracks_true"] = int(kwargs["nodes_missing_value_tracks_true"])
        return original(*args, **kwargs)

    tree_ensemble.add_node = add_node
    try:
        yield
    finally:
        tree_ensemble.add_node = original


@contextlib.contextmanager
def _xgboost_features_by_position(estimator: Any) -> Iterator[None]:
    """During one conversion, the boosters of the estimator's XGBoost steps have no feature names, so that their
    dump names features `f0`, `f1`... by position, the only form onnxmltools' converter reads. The names are
    put back afterwards (the estimator still predicts on the DataFrame by name, as `check_answers` does)."""
    boosters = [step.get_booster() for step in steps_of(estimator) if _library_of(step) == "xgboost"]
    names = [booster.feature_names for booster in boosters]
    for booster in boosters:
        booster.feature_names = None
    try:
        yield
    finally:
        for booster, kept in zip(boosters, names, strict=True):
            booster.feature_names = kept


def _boosting_library(estimator: Any) -> str | None:
    """'lightgbm' or 'xgboost' when the estimator (or a step of it) comes from there."""
    return next((library for library in map(_library_of, steps_of(estimator)) if library is not None), None)


def _library_of(step: Any) -> str | None:
    root = type(step).__module__.split(".")[0]
    return root if root in ("lightgbm", "xgboost") else None


def _register_boosting_converters(library: str) -> None:
    """skl2onnx converts LightGBM / XGBoost estimators (alone or in a pipeline) once onnxmltools' converters
    are registered with it."""
    from skl2onnx.common.shape_calculator import (
        calculate_linear_classifier_output_shapes,
        calculate_linear_regressor_output_shapes,
    )

    converters = {
        "lightgbm": ("onnxmltools.convert.lightgbm.operator_converters.LightGbm", "convert_lightgbm", "LGBM"),
        "xgboost": ("onnxmltools.convert.xgboost.operator_converters.XGBoost", "convert_xgboost", "XGB"),
    }
    module_name, function_name, prefix = converters[library]
    try:
        estimators = importlib.import_module(library)
        converter = getattr(importlib.import_module(module_name), function_name)
        pairs = [
            (getattr(estimators, f"{prefix}Classifier"), calculate_linear_classifier_output_shapes, True),
            (getattr(estimators, f"{prefix}Regressor"), calculate_linear_regressor_output_shapes, False),
        ]
    except ImportError:
        raise InvalidInput(
            f"a {library} model needs onnxmltools to be converted",
            field="estimator",
            value=library,
            allowed="scikit-learn estimators, or pip install 'servestack[onnxmltools]' for LightGBM / XGBoost",
        ) from None
    from skl2onnx import update_registered_converter

    for model, shapes, classifier in pairs:
        update_registered_converter(
            model,
            f"{library}{model.__name__}",
            shapes,
            converter,
            options={"nocl": [True, False], "zipmap": [True, False, "columns"]} if classifier else None,
        )


# The opsets boosting models are converted at. `ai.onnx.ml` 3 is the newest skl2onnx 1.20 accepts from a
# converter (its `get_default_opset_for_domain`), and onnxmltools' LightGBM / XGBoost converters write their
# TreeEnsembleClassifier / TreeEnsembleRegressor nodes at it; `ai.onnx` 17 is the one the bundled models
# (servestack/sample_models.py) use. Both are below what onnxruntime 1.20, the oldest the `runtime` extra
# allows, runs, so the package serves on every onnxruntime a deployment may install, not only on the one of
# the machine that converted it (which `check_answers` runs it on).
BOOSTING_OPSET: dict[str, int] = {"": 17, "ai.onnx.ml": 3}


def to_onnx(estimator: Any, columns: list[Column]) -> bytes:
    """The serialized ONNX model of a fitted estimator whose inputs are `columns`.

    A pipeline that starts with a `ColumnTransformer` takes the columns as they are. Any other estimator takes
    one matrix: it is converted with one float `[N, k]` input, and a `Concat` of the `[N, 1]` columns (integer
    ones cast to float, as scikit-learn casts them) is put in front of it, so every tabular model keeps one
    named input per column."""
    if len(columns) > 1 and not _takes_columns(estimator):
        joined = _converted(estimator, [Column(JOINED, "float32", np.zeros((1, len(columns)), np.float32))])
        return _columns_in_front(joined, columns)
    return _converted(estimator, columns)


# The name of the matrix a non-ColumnTransformer estimator takes, inside a graph with one input per column.
JOINED = "servestack_columns"


def _takes_columns(estimator: Any) -> bool:
    """Whether the estimator starts with a ColumnTransformer (through nested pipelines)."""
    first = estimator
    while hasattr(first, "steps"):
        first = first.steps[0][1]
    return type(first).__name__ == "ColumnTransformer"


def _converted(estimator: Any, columns: list[Column]) -> bytes:
    from skl2onnx import convert_sklearn

    library = _boosting_library(estimator)
    if library is not None:
        _register_boosting_converters(library)
    try:
        with _integer_missing_flags(), _xgboost_features_by_position(estimator):
            model = convert_sklearn(
                estimator,
                initial_types=initial_types(columns),
                options=converter_options(estimator),
                target_opset=BOOSTING_OPSET if library is not None else None,
            )
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:  # skl2onnx's own errors
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise InvalidInput(
            f"skl2onnx cannot convert {type(estimator).__name__}: {first}",
            field="estimator",
            value=type(estimator).__name__,
            allowed="estimators skl2onnx converts (https://onnx.ai/sklearn-onnx/supported.html)",
        ) from None
    return bytes(model.SerializeToString())


def _columns_in_front(serialized: bytes, columns: list[Column]) -> bytes:
    """`serialized` (one float [N, k] input named JOINED) with one [N, 1] input per column concatenated into it."""
    import onnx
    from onnx import TensorProto, helper

    text = [column.name for column in columns if column.kind == "string"]
    if text:
        raise InvalidInput(
            f"column {text[0]!r} holds text, and the estimator takes one matrix of numbers",
            field=text[0],
            allowed="numeric columns, or a pipeline whose ColumnTransformer encodes the text columns",
        )
    model = onnx.load_from_string(serialized)
    graph = model.graph
    taken = {name for node in graph.node for name in node.output} | {i.name for i in graph.initializer}
    taken |= {output.name for output in graph.output}
    clash = next((column.name for column in columns if column.name in taken), None)
    if clash is not None:
        raise InvalidInput(
            f"column {clash!r} has the name of a tensor inside the converted model",
            field=clash,
            allowed=f"column names other than {sorted(taken)[:10]}",
        )
    front, parts = [], []
    inputs = []
    for column in columns:
        element = TensorProto.FLOAT if column.kind == "float32" else TensorProto.INT64
        inputs.append(helper.make_tensor_value_info(column.name, element, [None, 1]))
        if column.kind == "float32":
            parts.append(column.name)
        else:
            parts.append(f"{JOINED}_{len(parts)}")
            front.append(helper.make_node("Cast", [column.name], [parts[-1]], to=TensorProto.FLOAT))
    front.append(helper.make_node("Concat", parts, [JOINED], axis=1))
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend([*front, *rest])
    del graph.input[:]
    graph.input.extend(inputs)
    if not any(opset.domain in ("", "ai.onnx") for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid("", DEFAULT_OPSET))
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


# The `ai.onnx` opset imported for the Concat/Cast in front when a converted graph has none (Concat and Cast
# have kept their meaning since opset 13).
DEFAULT_OPSET = 13


# ------------------------------------------------------------------------------------------ comparing


@dataclass(frozen=True)
class Mismatch:
    """The worst row of one output: where the ONNX answer is furthest outside the tolerance."""

    output: str
    row: int
    expected: Any
    actual: Any
    excess: float  # how far past the tolerance (inf for labels that differ)
    rows: int  # how many rows are outside it

    def describe(self) -> str:
        return (
            f"output {self.output!r} row {self.row}: the estimator gives {self.expected!r}, ONNX gives "
            f"{self.actual!r} ({self.rows} row(s) outside {TOLERANCE_TEXT})"
        )


def worst_row(output: str, expected: np.ndarray, actual: np.ndarray) -> Mismatch | None:
    """None when every row of `actual` agrees with `expected`: labels exactly, numbers within tolerance."""
    rows = len(expected)
    want = np.asarray(expected).reshape(rows, -1)
    got = np.asarray(actual).reshape(rows, -1)
    if want.shape != got.shape:
        return Mismatch(output, 0, want.shape, got.shape, float("inf"), rows)
    if want.dtype.kind in "fc" and got.dtype.kind in "fc":
        excess = np.abs(got - want) - (ABSOLUTE_TOLERANCE + RELATIVE_TOLERANCE * np.abs(want))
        excess = np.where(np.isnan(want) & np.isnan(got), 0.0, np.nan_to_num(excess, nan=np.inf))
        per_row = excess.max(axis=1)
    else:
        per_row = np.where((want.astype(str) != got.astype(str)).any(axis=1), np.inf, 0.0)
    outside = per_row > 0
    if not outside.any():
        return None
    row = int(np.argmax(per_row))
    return Mismatch(output, row, _shown(want[row]), _shown(got[row]), float(per_row[row]), int(outside.sum()))


def _shown(values: np.ndarray) -> Any:
    listed = values.tolist()
    return listed[0] if len(listed) == 1 else listed


def estimator_answers(estimator: Any, sample: Any, output_names: list[str]) -> dict[str, np.ndarray]:
    """The estimator's own answers, keyed like skl2onnx's outputs: `label` (+ `probabilities`) for a
    classifier, the one prediction output for a regressor."""
    from sklearn.base import is_classifier

    if is_classifier(estimator):
        answers = {output_names[0]: np.asarray(estimator.predict(sample))}
        if len(output_names) > 1 and hasattr(estimator, "predict_proba"):
            answers[output_names[1]] = np.asarray(estimator.predict_proba(sample))
        return answers
    return {output_names[0]: np.asarray(estimator.predict(sample))}


def check_answers(
    estimator: Any, sample: Any, columns: list[Column], onnx_model: bytes
) -> tuple[list[Mismatch], dict[str, np.ndarray]]:
    """Run the ONNX model on the sample and compare with the estimator: the mismatches (worst row of each
    output that has one) and the ONNX answers."""
    import onnxruntime as ort

    session = ort.InferenceSession(onnx_model, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    answers = dict(zip(names, session.run(names, feeds(columns)), strict=True))
    expected = estimator_answers(estimator, sample, names)
    found = [worst_row(name, want, answers[name]) for name, want in expected.items()]
    return [mismatch for mismatch in found if mismatch is not None], answers
