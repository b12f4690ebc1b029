"""`servestack models optimize` on the two bundled models, with real onnxruntime quantization, a directory
registry in tmp, and the CLI as users run it: the gate holds and a version is pushed whose manifest records
the source, the method and the figures; a lossy method under a gate of 0 points is refused; bad rows files
are named by line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servestack.cli.main import main
from servestack.inference import media_types
from servestack.inference.registry import ModelRegistry
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from servestack.registry import open_registry, seed
from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.slow
# Timing is reported, never asserted, and decides nothing here: keep it short, and let the speed gate
# (tests/functional/test_optimize_speed_gate.py) push a version whatever this machine measures.
FAST = ["--speed-sec", "0.05", "--allow-slower"]


@pytest.fixture
def registry(tmp_path: Path) -> ModelRegistry:
    """A directory registry holding both bundled packages (with their samples), as `local up` seeds one."""
    store = open_registry(str(tmp_path / "registry"))
    seed(store, [ARTIFACTS / "digits" / "1", ARTIFACTS / "breast-cancer" / "1"])
    return store


def write_rows(path: Path, rows: np.ndarray, labels: np.ndarray | None = None) -> Path:
    with path.open("w") as out:
        for index, row in enumerate(rows.tolist()):
            line: Any = row if labels is None else {"instance": row, "label": int(labels[index])}
            out.write(json.dumps(line) + "\n")
    return path


def dataset(name: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_breast_cancer, load_digits

    data = load_digits() if name == "digits" else load_breast_cancer()
    return data.data.astype(np.float32), data.target


def run_cli(registry: ModelRegistry, *args: str) -> int:
    return main(["models", "optimize", *args, "--registry", registry.uri, *FAST])


def served(registry: ModelRegistry, name: str, version: str, cache: Path) -> ServedModel:
    return ServedModel.load(registry.fetch(name, version, cache), ServingSettings(providers="CPUExecutionProvider"))


def test_dynamic_int8_digits_holds_the_gate_and_is_pushed(
    registry: ModelRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN 300 labelled digits rows held out for evaluation
    features, labels = dataset("digits")
    rows = write_rows(tmp_path / "eval.jsonl", features[::6], labels[::6])
    report = tmp_path / "outcome.json"
    # WHEN `servestack models optimize digits --method dynamic-int8 --eval eval.jsonl` runs
    code = run_cli(registry, "digits", "--method", "dynamic-int8", "--eval", str(rows), "--report", str(report))
    out = capsys.readouterr().out
    # THEN the default gate (0.5 points) holds and digits@2 is pushed
    assert code == 0, out
    assert "gate holds" in out
    assert "pushed digits@2" in out
    assert registry.versions("digits") == ["1", "2"]
    assert registry.aliases("digits") == {"live": "1"}  # promoting is a separate, deliberate step
    # AND its manifest records the source version, the method and the measured figures
    manifest = registry.manifest("digits", "2")
    assert manifest is not None
    assert manifest.optimization is not None
    optimization = manifest.optimization
    source = registry.manifest("digits", "1")
    assert source is not None
    assert (optimization.source_version, optimization.source_sha256) == ("1", source.sha256)
    assert optimization.method == "dynamic-int8"
    assert optimization.int8_weights == 2  # both MatMul weight matrices of the MLP
    assert optimization.optimized_bytes < optimization.float_bytes
    assert optimization.accuracy.measure == "accuracy"
    assert optimization.accuracy.rows == 300
    assert optimization.accuracy.drop_points <= 0.5
    assert [figure.batch_rows for figure in optimization.speed] == [1, 32]
    assert all(figure.optimized_rows_per_sec > 0 for figure in optimization.speed)
    assert manifest.labels == source.labels
    assert (manifest.inputs, manifest.outputs) == (source.inputs, source.outputs)
    # AND the pushed version serves: its sample response is its own answer to the sample request
    model = served(registry, "digits", "2", tmp_path / "cache")
    sample = (ARTIFACTS / "digits" / "1" / "sample-request.json").read_bytes()
    answer = model.respond(model.predict(model.decode(sample, media_types.JSON)))
    stored = registry.store.read(f"{registry.prefix}digits/2/sample-response.json")
    assert stored is not None
    assert json.loads(stored)["predictions"] == answer["predictions"].tolist()
    assert json.loads(report.read_text())["pushed"] == "digits@2"


def test_static_int8_breast_cancer_holds_the_gate_and_is_pushed(
    registry: ModelRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN 64 calibration rows and every labelled row for evaluation
    features, labels = dataset("breast-cancer")
    calibration = write_rows(tmp_path / "calibration.jsonl", features[:64])
    rows = write_rows(tmp_path / "eval.jsonl", features, labels)
    # WHEN the gradient-boosted trees are optimized with static int8
    code = run_cli(
        registry, "breast-cancer@1", "--method", "static-int8", "--calibration", str(calibration), "--eval", str(rows)
    )
    out = capsys.readouterr().out
    # THEN the gate holds and breast-cancer@2 is pushed
    assert code == 0, out
    assert "pushed breast-cancer@2" in out
    manifest = registry.manifest("breast-cancer", "2")
    assert manifest is not None
    assert manifest.optimization is not None
    assert manifest.optimization.method == "static-int8"
    assert manifest.optimization.calibration_rows == 64
    assert manifest.optimization.calibration_source == "calibration.jsonl"
    assert manifest.optimization.accuracy.rows == 569
    # AND the run says plainly that onnxruntime had nothing to quantize in a tree ensemble
    assert manifest.optimization.int8_weights == 0
    assert "nothing was quantized" in out
    assert "TreeEnsembleClassifier" in out
    # AND the new version gives the float model's answers
    float_model = served(registry, "breast-cancer", "1", tmp_path / "cache")
    optimized = served(registry, "breast-cancer", "2", tmp_path / "cache")
    batch = {"input": features}
    assert np.array_equal(float_model.predict(batch)["label"], optimized.predict(batch)["label"])


def boundary_rows(features: np.ndarray, pairs: int = 100, steps: int = 21) -> np.ndarray:
    """Blends of two digit images: rows crossing a decision boundary, where int8 rounding flips some answers."""
    weights = np.linspace(0, 1, steps, dtype=np.float32)[:, None]
    return np.concatenate([features[i] * (1 - weights) + features[i + 1] * weights for i in range(0, 2 * pairs, 2)])


def test_a_lossy_method_under_a_gate_of_zero_points_is_refused(
    registry: ModelRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN 2,100 unlabelled rows near the digits' decision boundaries (agreement with the float model)
    features, _ = dataset("digits")
    rows = write_rows(tmp_path / "boundary.jsonl", boundary_rows(features))
    # WHEN dynamic int8 is asked to lose nothing
    code = run_cli(registry, "digits", "--method", "dynamic-int8", "--eval", str(rows), "--max-accuracy-drop", "0")
    captured = capsys.readouterr()
    # THEN it refuses, says why with the measured figures, and pushes nothing
    assert code == 1, captured.out + captured.err
    assert "refused: the accuracy drop is" in captured.out
    assert "agreement on 2,100 rows of boundary.jsonl" in captured.out
    assert "over --max-accuracy-drop 0" in captured.out
    assert registry.versions("digits") == ["1"]


def test_graph_optimizations_alone_lose_nothing_under_a_gate_of_zero(
    registry: ModelRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the same boundary rows WHEN only onnxruntime's graph optimizations are applied
    features, _ = dataset("digits")
    rows = write_rows(tmp_path / "boundary.jsonl", boundary_rows(features, pairs=20))
    code = run_cli(registry, "digits", "--method", "graph", "--eval", str(rows), "--max-accuracy-drop", "0")
    # THEN every answer agrees and the version is pushed
    assert code == 0, capsys.readouterr().out
    manifest = registry.manifest("digits", "2")
    assert manifest is not None
    assert manifest.optimization is not None
    assert manifest.optimization.accuracy.drop_points == 0


def test_bad_rows_and_bad_names_are_refused_naming_them(
    registry: ModelRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN an eval file whose third row has 3 features instead of 64
    features, _ = dataset("digits")
    rows = tmp_path / "eval.jsonl"
    rows.write_text("\n".join([json.dumps(features[0].tolist()), json.dumps(features[1].tolist()), "[1, 2, 3]"]))
    # WHEN optimize runs THEN it stops before building anything, naming the file and line
    assert run_cli(registry, "digits", "--eval", str(rows)) == 2
    assert "eval.jsonl line 3" in capsys.readouterr().err
    # AND labels on some lines only are refused
    rows.write_text(
        json.dumps({"instance": features[0].tolist(), "label": 0}) + "\n" + json.dumps(features[1].tolist())
    )
    assert run_cli(registry, "digits", "--eval", str(rows)) == 2
    assert "line 2: has no label" in capsys.readouterr().err
    # AND an unknown model lists the known ones, a bad gate says what is allowed
    assert run_cli(registry, "fraud") == 4  # not found (the documented exit codes)
    assert "breast-cancer, digits" in capsys.readouterr().err
    assert run_cli(registry, "digits", "--max-accuracy-drop", "half") == 2
    assert "0..100" in capsys.readouterr().err
    # AND an existing version is refused before any work (versions are immutable)
    assert run_cli(registry, "digits", "--version", "1") == 2
    assert "digits@1 already exists" in capsys.readouterr().err
    assert registry.versions("digits") == ["1"]
