"""`servestack models optimize` on the models users bring (tests/zoo.py): a regressor goes through a tolerance
gate (graph and dynamic int8), a classifier with string labels keeps the accuracy gate, `--method graph` is
never refused, and the eval rows come from the package's sample whatever form it is written in. Each model is
pushed with `servestack models push` to a directory registry in tmp, and the CLI runs as users run it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servestack.cli.main import main
from servestack.conversion import Column, to_onnx, worst_row
from servestack.inference.registry import ModelRegistry
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from servestack.registry import open_registry
from tests.zoo import WINE_CULTIVARS, ZooModel

pytestmark = pytest.mark.slow
# Timing is reported, never asserted, and decides nothing here: keep it short, and let the speed gate
# (tests/functional/test_optimize_speed_gate.py) push a version whatever this machine measures.
FAST = ["--speed-sec", "0.05", "--allow-slower"]
SAMPLE_ROWS = np.arange(5)


def push(registry: ModelRegistry, tmp_path: Path, name: str, onnx_path: Path, sample: dict[str, Any]) -> None:
    """`servestack models push MODEL.onnx --name NAME --sample sample.json` into the directory registry."""
    sample_file = tmp_path / f"{name}-sample.json"
    sample_file.write_text(json.dumps(sample))
    argv = ["models", "push", str(onnx_path), "--name", name, "--sample", str(sample_file)]
    assert main([*argv, "--artifacts", str(tmp_path / "artifacts"), "--registry", registry.uri]) == 0


@pytest.fixture
def registry(tmp_path: Path, zoo: dict[str, ZooModel]) -> ModelRegistry:
    """The zoo's regressor and string-labelled pipeline, each pushed with a five-row sample: the regressor's in
    `instances` form, the pipeline's (several inputs) in `inputs` form."""
    store = open_registry(str(tmp_path / "registry"))
    for name in ("diabetes-gbr", "wine-pipeline"):
        push(store, tmp_path, name, zoo[name].onnx_path, zoo[name].request(SAMPLE_ROWS))
    return store


def run_cli(registry: ModelRegistry, *args: str) -> int:
    return main(["models", "optimize", *args, "--registry", registry.uri, *FAST])


def served(registry: ModelRegistry, name: str, version: str, cache: Path) -> ServedModel:
    return ServedModel.load(registry.fetch(name, version, cache), ServingSettings(providers="CPUExecutionProvider"))


def write_rows(path: Path, model: ZooModel, labels: np.ndarray | None = None) -> Path:
    """Every row of the zoo model's sample, one per line: a list for a one-input model, an object keyed by
    input name for several inputs; `{"instance": row, "label": ...}` when labels are given."""
    arrays = model.feed()
    with path.open("w") as out:
        for index in range(model.rows):
            row: Any = {name: values[index].tolist() for name, values in arrays.items()}
            if len(row) == 1:
                row = next(iter(row.values()))
            out.write(json.dumps(row if labels is None else {"instance": row, "label": labels[index].item()}) + "\n")
    return path


@pytest.mark.parametrize("method", ["graph", "dynamic-int8"])
def test_a_regressor_passes_the_tolerance_gate_and_is_pushed(
    registry: ModelRegistry, zoo: dict[str, ZooModel], tmp_path: Path, method: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the gradient-boosted diabetes regressor and its 442 rows as eval rows
    model = zoo["diabetes-gbr"]
    rows = write_rows(tmp_path / "eval.jsonl", model)
    report = tmp_path / "outcome.json"
    # WHEN it is optimized
    code = run_cli(registry, "diabetes-gbr", "--method", method, "--eval", str(rows), "--report", str(report))
    out = capsys.readouterr().out
    # THEN the tolerance gate (default bounds) holds and version 2 is pushed
    assert code == 0, out
    assert "gate holds: all 442 rows within" in out
    assert "pushed diabetes-gbr@2" in out
    outcome = json.loads(report.read_text())
    tolerance = outcome["tolerance"]
    assert tolerance["rows"] == 442
    assert tolerance["rows_outside"] == 0
    assert tolerance["max_abs_error"] <= tolerance["max_abs_error_allowed"] + 0.01 * 350  # bounded by the gate
    manifest = registry.manifest("diabetes-gbr", "2")
    assert manifest is not None
    assert manifest.optimization is not None
    assert manifest.optimization.method == method
    assert manifest.optimization.accuracy.measure == "agreement"
    assert manifest.optimization.accuracy.optimized_percent == 100
    # AND the new version answers as the estimator does, within float32 tolerance, on every row
    optimized = served(registry, "diabetes-gbr", "2", tmp_path / "cache")
    answers = optimized.predict(model.feed())["variable"]
    assert worst_row("variable", model.expected()["variable"], answers) is None


@pytest.fixture
def mlp_onnx(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A small MLP regressor on the diabetes data: MatMul weights, which dynamic int8 does quantize."""
    from sklearn.datasets import load_diabetes
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    features, target = load_diabetes(return_X_y=True)
    features = (features * 20).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a tiny net is enough to have int8 change answers
        model = MLPRegressor(hidden_layer_sizes=(32,), max_iter=300, random_state=0).fit(features, target / 100)
    path = tmp_path / "mlp.onnx"
    path.write_bytes(to_onnx(model, [Column("input", "float32", features)]))
    return path, features


def test_the_tolerance_gate_refuses_answers_that_int8_moved(
    registry: ModelRegistry, mlp_onnx: tuple[Path, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN an MLP regressor, whose weights dynamic int8 quantizes
    path, features = mlp_onnx
    push(registry, tmp_path, "diabetes-mlp", path, {"instances": features[:5].tolist()})
    rows = tmp_path / "eval.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in features.tolist()))
    # WHEN the answers must stay within 1e-6 of the float model's
    code = run_cli(
        registry, "diabetes-mlp", "--method", "dynamic-int8", "--eval", str(rows), "--max-rel-error", "1e-6",
        "--max-abs-error", "0",
    )  # fmt: skip
    out = capsys.readouterr().out
    # THEN it refuses, naming the worst row and the bounds, and pushes nothing
    assert code == 1, out
    assert "refused:" in out
    assert "rows of eval.jsonl outside" in out
    assert "worst: line" in out
    assert "--max-rel-error 1e-06" in out
    assert registry.versions("diabetes-mlp") == ["1"]
    # AND under the default bounds (within 1%) int8 still moves answers too far: about a fifth of the rows here
    code = run_cli(registry, "diabetes-mlp", "--method", "dynamic-int8", "--eval", str(rows))
    out = capsys.readouterr().out
    assert code == 1, out
    assert "<= 0.0001 + 0.01 x |float| (--max-abs-error 0.0001, --max-rel-error 0.01)" in out
    assert "max abs error" in out
    assert registry.versions("diabetes-mlp") == ["1"]


def test_a_string_labelled_classifier_keeps_the_accuracy_gate(
    registry: ModelRegistry, zoo: dict[str, ZooModel], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the wine pipeline (several inputs, a string column) and its 178 rows labelled with the cultivars
    from sklearn.datasets import load_wine

    model = zoo["wine-pipeline"]
    truth = WINE_CULTIVARS[load_wine().target]
    rows = write_rows(tmp_path / "eval.jsonl", model, truth)
    # WHEN it is optimized with dynamic int8
    code = run_cli(registry, "wine-pipeline", "--method", "dynamic-int8", "--eval", str(rows))
    out = capsys.readouterr().out
    # THEN accuracy against the string labels is measured for both models, the gate holds, version 2 is pushed
    assert code == 0, out
    manifest = registry.manifest("wine-pipeline", "2")
    assert manifest is not None
    assert manifest.optimization is not None
    accuracy = manifest.optimization.accuracy
    assert accuracy.measure == "accuracy"
    assert accuracy.rows == 178
    estimator_percent = 100 * float(np.mean(model.expected()["label"] == truth))
    assert accuracy.float_percent == pytest.approx(estimator_percent, abs=1e-4)
    assert accuracy.drop_points <= 0.5
    # AND the pushed version's sample response is its own answer, with string labels
    stored = registry.store.read(f"{registry.prefix}wine-pipeline/2/sample-response.json")
    assert stored is not None
    assert json.loads(stored)["predictions"] == model.expected(SAMPLE_ROWS)["label"].tolist()


@pytest.mark.parametrize("name", ["wine-pipeline", "news-tfidf", "linnerud-multi", "cancer-hgb-nan", "diabetes-int"])
def test_graph_is_never_refused_and_takes_its_eval_rows_from_the_sample(
    registry: ModelRegistry, zoo: dict[str, ZooModel], tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a zoo model pushed with a five-row sample: `inputs` form for several inputs (the pipelines),
    # `instances` for one (rows without NaN: a request may not carry NaN unless the manifest allows it)
    model = zoo[name]
    complete = np.flatnonzero(~np.isnan(model.feed()["input"]).any(axis=1)) if name == "cancer-hgb-nan" else None
    rows = SAMPLE_ROWS if complete is None else complete[:5]
    if name != "wine-pipeline":  # the fixture pushed the pipeline already
        push(registry, tmp_path, name, model.onnx_path, model.request(rows))
    # WHEN only graph optimizations are asked for, with no --eval
    code = run_cli(registry, name, "--method", "graph")
    out = capsys.readouterr().out
    # THEN the sample's rows are the eval rows, every answer agrees and the version is pushed
    assert code == 0, out
    assert "the 5 rows of sample-request.json" in out
    manifest = registry.manifest(name, "2")
    assert manifest is not None
    assert manifest.optimization is not None
    assert (manifest.optimization.accuracy.rows, manifest.optimization.accuracy.drop_points) == (5, 0)
    # AND the new version answers as the estimator does on every row of the data, NaN included
    optimized = served(registry, name, "2", tmp_path / "cache")
    answers = optimized.predict(model.feed())
    for output, expected in model.expected().items():
        assert worst_row(output, expected, answers[output]) is None


def test_bad_tolerance_flags_are_refused_naming_what_is_allowed(
    registry: ModelRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(registry, "diabetes-gbr", "--max-rel-error", "-1") == 2
    assert "--max-rel-error" in capsys.readouterr().err
    assert run_cli(registry, "diabetes-gbr", "--max-abs-error", "lots") == 2
    assert "a number >= 0" in capsys.readouterr().err
    assert registry.versions("diabetes-gbr") == ["1"]


def test_a_row_without_every_input_is_named_with_the_inputs_expected(
    registry: ModelRegistry, zoo: dict[str, ZooModel], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN eval rows for the pipeline whose second row has no `shade`
    rows = write_rows(tmp_path / "eval.jsonl", zoo["wine-pipeline"])
    lines = rows.read_text().splitlines()
    second = json.loads(lines[1])
    del second["shade"]
    rows.write_text("\n".join([lines[0], json.dumps(second), *lines[2:5]]) + "\n")
    # WHEN optimize runs THEN it stops before building anything, naming the line and the inputs expected
    assert run_cli(registry, "wine-pipeline", "--eval", str(rows)) == 2
    err = capsys.readouterr().err
    assert "eval.jsonl line 2" in err
    assert "'shade'" in err
    assert registry.versions("wine-pipeline") == ["1"]
