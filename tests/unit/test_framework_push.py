"""PyTorch and Keras models pushed with `servestack.models.push` (issue 36, item 4). torch and TensorFlow are not
dependencies of the project: tests/fixtures/deep_learning/export_frameworks.py pushed tiny models of each, in a
venv that has them, into the fixtures' registry folder, with each framework's answers on fixed inputs. Here, with
onnxruntime alone, the pushed packages must answer as the frameworks did, and keep their batch axis free."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from servestack import models
from servestack.conversion import worst_row
from servestack.frameworks import INSTALL, framework_of
from servestack.inference import media_types
from servestack.inference.errors import InvalidInput
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from tests.fixtures.deep_learning.export_frameworks import ANSWERS, FIXED_ROWS, MODELS, REGISTRY, SAMPLE_ROWS

PUSHED = [name for names in MODELS.values() for name in names]


def _arrays(model: str, kind: str) -> dict[str, np.ndarray]:
    return {path.name.split(".")[1]: np.load(path) for path in sorted((ANSWERS / model).glob(f"{kind}.*.npy"))}


def _served(name: str) -> ServedModel:
    package = REGISTRY / name / "1"
    settings = ServingSettings(model_dir=package, default_model=name, providers="CPUExecutionProvider")
    return ServedModel.load(package, settings)


@pytest.mark.parametrize("name", PUSHED)
def test_a_pushed_package_answers_as_its_framework_did(name: str) -> None:
    # GIVEN the package the framework's model was pushed as, and the framework's answers on fixed inputs
    model = _served(name)
    inputs, expected = _arrays(name, "inputs"), _arrays(name, "outputs")
    assert len(next(iter(inputs.values()))) == FIXED_ROWS != SAMPLE_ROWS
    # WHEN onnxruntime runs the package's model on them
    answers = model.runtime.predict(inputs)
    # THEN every output agrees with the framework's (the push's own tolerance), labels exactly
    assert sorted(answers) == sorted(expected)
    for output, want in expected.items():
        assert worst_row(output, want, answers[output]) is None, output


@pytest.mark.parametrize("name", PUSHED)
def test_the_manifest_keeps_the_batch_axis_free_and_the_samples_names(name: str) -> None:
    manifest = _served(name).manifest
    assert all(spec.shape[0] is None for spec in (*manifest.inputs, *manifest.outputs))
    # A tensor sample is the input `input`, a dict sample gives its keys; outputs are named as the model answers
    expected_inputs = ["features", "mask"] if name == "torch-two-inputs" else ["input"]
    assert [spec.name for spec in manifest.inputs] == expected_inputs
    assert sorted(_arrays(name, "outputs")) == sorted(spec.name for spec in manifest.outputs)


def test_the_sample_request_is_served_by_name() -> None:
    # GIVEN torch-two-inputs, whose sample request names its two inputs (`{"inputs": {...}}`)
    model = _served("torch-two-inputs")
    body = (REGISTRY / "torch-two-inputs" / "1" / "sample-request.json").read_bytes()
    assert sorted(json.loads(body)["inputs"]) == ["features", "mask"]
    # WHEN it is sent THEN it is answered as the package's recorded sample response (the first output by default)
    answer = json.loads(model.infer(body, media_types.JSON, media_types.JSON).body)
    recorded = json.loads((REGISTRY / "torch-two-inputs" / "1" / "sample-response.json").read_bytes())
    np.testing.assert_allclose(answer["predictions"], recorded["predictions"], rtol=1e-5, atol=1e-6)
    assert len(answer["predictions"]) == len(json.loads(body)["inputs"]["mask"])


def test_a_missing_framework_library_is_one_line_naming_the_pip_install(tmp_path: Path) -> None:
    # GIVEN a model whose class is torch's `nn.Module` by its module, in this venv without torch
    module = type("Module", (), {"__module__": "torch.nn.modules.module"})
    assert framework_of(module()) == "torch"
    # WHEN it is pushed THEN the refusal names what to install, and nothing is written
    with pytest.raises(InvalidInput) as caught:
        models.push(module(), np.zeros((2, 3), np.float32), name="no-torch", artifacts=tmp_path)
    assert caught.value.allowed == INSTALL["torch"]
    assert "\n" not in caught.value.message
    assert list(tmp_path.iterdir()) == []


def test_other_objects_are_not_deep_learning_models() -> None:
    assert framework_of(object()) is None
    assert framework_of(np.zeros(3)) is None
