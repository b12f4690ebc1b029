"""The refusals of servestack/inference/images.py, each naming the item and what is accepted: pictures that do not
fit the crop, forms and JSON that hold no picture, batches past the rows a request may carry."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import orjson
import pytest
from PIL import Image

from servestack.inference.errors import InvalidInput, PayloadTooLarge, ServingError, UnsupportedMediaType
from servestack.inference.packaging import build_package
from servestack.inference.push_images import image_options
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings

CNN = Path(__file__).resolve().parents[1] / "fixtures" / "deep_learning" / "cnn.onnx"
BOUNDARY = "b0undary"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    """The fixture CNN pushed with `--image` alone: pictures taken at the input's 64x64, not resized."""
    package = tmp_path_factory.mktemp("images") / "cnn"
    build_package(CNN, package, name="cnn", version="1", image=image_options(""))
    settings = ServingSettings(
        model_dir=package, default_model="cnn", providers="CPUExecutionProvider", warmup=False, max_batch_rows=4
    )
    return ServedModel.load(package, settings)


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def refusal(served: ServedModel, body: bytes, content_type: str) -> ServingError:
    with pytest.raises(ServingError) as caught:
        served.decode(body, content_type)
    return caught.value


def test_a_picture_smaller_than_the_crop_is_refused_with_its_size(served: ServedModel) -> None:
    error = refusal(served, png(40, 90), "image/png")
    assert isinstance(error, InvalidInput)
    assert error.message == (
        "body: a 40x90 picture is smaller than the model's 64x64 input (push with --image resize=N to resize "
        "pictures first)"
    )
    assert (error.field, error.value) == ("body", "40x90")
    # AND a larger one is cut to the input's size
    assert served.decode(png(100, 80), "image/png")["image"].shape == (1, 3, 64, 64)


def test_json_instances_that_are_not_pictures_are_named(served: ServedModel) -> None:
    body = orjson.dumps({"instances": [{"b64": base64.b64encode(png(64, 64)).decode()}, {"b64": "%%%"}]})
    error = refusal(served, body, "application/json")
    assert (error.field, error.message) == ("instances[1].b64", "instances[1].b64: not base64")
    error = refusal(served, orjson.dumps({"instances": [{"image": "x"}]}), "application/json")
    assert error.field == "instances[0]"
    assert '{"b64"' in str(error.allowed)


def test_a_form_without_pictures_is_refused(served: ServedModel) -> None:
    body = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="caption"\r\n\r\nhello\r\n--{BOUNDARY}--\r\n'
    error = refusal(served, body.encode(), f"multipart/form-data; boundary={BOUNDARY}")
    assert isinstance(error, InvalidInput)
    assert "the form holds no image parts" in error.message


def test_more_pictures_than_a_request_may_carry_is_a_413(served: ServedModel) -> None:
    picture = base64.b64encode(png(64, 64)).decode()
    error = refusal(served, orjson.dumps({"instances": [{"b64": picture}] * 5}), "application/json")
    assert isinstance(error, PayloadTooLarge)
    assert error.message == "body: 5 pictures, more than the 4 rows a request may carry"


def test_a_type_no_image_form_has_is_a_415(served: ServedModel) -> None:
    error = refusal(served, b"...", "audio/wav")
    assert isinstance(error, UnsupportedMediaType)
    assert error.value == "audio/wav"
