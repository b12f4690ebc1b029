"""User hooks (`process.py`): run around predict, and their failures map to 400 or a 500 naming the hook."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from servestack.inference.errors import InvalidInput, ModelLoadError, UserCodeError
from servestack.inference.hooks import load_hooks
from servestack.inference.packaging import create_package
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from tests.conftest import ARTIFACTS, HOOKS_SOURCE


@pytest.fixture(scope="module")
def hooked(tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    package = tmp_path_factory.mktemp("hooked") / "digit-words" / "1"
    create_package(
        ARTIFACTS / "digits" / "1" / "model.onnx", package, name="digit-words", version="1", process_file=HOOKS_SOURCE
    )
    return ServedModel.load(package, ServingSettings())


def infer(model: ServedModel, document: object) -> dict[str, object]:
    result: dict[str, object] = orjson.loads(model.infer(orjson.dumps(document), "application/json", None).body)
    return result


def test_hooks_shape_the_request_and_the_response(hooked: ServedModel, digits: tuple) -> None:  # type: ignore[type-arg]
    features, targets = digits
    images = features[:3].reshape(3, 8, 8).tolist()
    response = infer(hooked, {"images": images})
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    assert response["digits"] == [names[t] for t in targets[:3]]
    assert response["model"] == "digit-words"
    assert len(response["confidence"]) == 3  # type: ignore[arg-type]


def test_input_error_raised_by_a_hook_is_a_400(hooked: ServedModel) -> None:
    with pytest.raises(InvalidInput) as caught:
        infer(hooked, {"images": "nope"})
    assert caught.value.field == "images"


def test_value_error_in_a_hook_is_a_400(hooked: ServedModel) -> None:
    with pytest.raises(InvalidInput, match="digit-words@1: preprocess rejected"):
        hooked.infer(b"1,2\n", "text/csv", None)


def test_a_bug_in_a_hook_is_a_500_naming_model_and_hook(hooked: ServedModel) -> None:
    with pytest.raises(UserCodeError) as caught:
        infer(hooked, {"explode": True})
    assert caught.value.status_code == 500
    assert "digit-words@1" in caught.value.message
    assert "preprocess" in caught.value.message


def test_hook_output_is_still_validated_against_the_manifest(hooked: ServedModel) -> None:
    with pytest.raises(InvalidInput):
        infer(hooked, {"images": [[[float("nan")] * 8] * 8]})


def test_hooks_that_fail_to_import_are_a_load_error(tmp_path: Path) -> None:
    broken = tmp_path / "process.py"
    broken.write_text("raise ImportError('missing dependency: pandas')\n")
    with pytest.raises(ModelLoadError, match="missing dependency"):
        load_hooks(broken, "broken@1")


def test_package_without_hooks_uses_the_codecs() -> None:
    model = ServedModel.load(ARTIFACTS / "digits" / "1", ServingSettings())
    assert model.hooks.preprocess is None
    assert model.hooks.postprocess is None
