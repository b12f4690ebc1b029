"""An image CNN pushed with `--image` serves pictures with no hook, through the realtime container's HTTP server
and the Lambda handler alike: raw JPEG and PNG bodies, base64 JSON of several pictures, multipart forms of several;
fp32 and fp16. Its answers are torch's (tests/fixtures/deep_learning/export_image.py wrote the model, the pictures
and torch's logits on the same preprocessed tensors): within 1e-4 for fp32, 1e-2 for fp16 (half precision's
resolution near 1 is 1e-3, and the graph runs in it). Its logits are answered as a classifier's: probabilities,
prediction, labels, top k; a model of probabilities alone gets its prediction derived."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import orjson
import pytest

from servestack.inference.errors import InvalidInput
from servestack.inference.packaging import build_package
from servestack.inference.push_images import image_options
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings
from tests.conftest import LambdaHandler, RealtimeServer, fresh_lambda_handler, lambda_event, response_body

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "deep_learning"
# As export_image.py's PREPROCESS: the preprocessing its reference tensors went through.
PREPROCESS = "resize=72,crop=64,mean=0.485:0.456:0.406,std=0.229:0.224:0.225"
PICTURES = ["landscape.jpg", "portrait.jpg", "grey.jpg", "square.png", "transparent.png"]  # export_image.IMAGES
LABELS = [f"class-{index}" for index in range(10)]
FP32_TOLERANCE = 1e-4
FP16_TOLERANCE = 1e-2
SERVESTACK = str(Path(sys.executable).parent / "servestack")
BOUNDARY = "----servestack-image-boundary"
HOOK = """
import numpy as np

def preprocess(payload, content_type):
    return np.zeros((1, 3, 64, 64), dtype=np.float32)  # whatever the body: the hook, not --image, reads it
"""


def picture(name: str) -> bytes:
    return (FIXTURES / "images" / name).read_bytes()


def softmax(logits: np.ndarray) -> np.ndarray:
    exponentials = np.exp(logits - logits.max(axis=-1, keepdims=True))
    result: np.ndarray = exponentials / exponentials.sum(axis=-1, keepdims=True)
    return result


def centred_log(probabilities: np.ndarray) -> np.ndarray:
    """The logits a softmax's probabilities came from, up to a constant per row (removed: each row's mean)."""
    logs = np.log(probabilities.astype(np.float64))
    result: np.ndarray = logs - logs.mean(axis=-1, keepdims=True)
    return result


def probabilities_model(path: Path) -> Path:
    """cnn.onnx with a Softmax after its logits: one output, `probabilities`."""
    model = onnx.load(str(FIXTURES / "cnn.onnx"))
    model.graph.node.append(onnx.helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1))
    output = model.graph.output[0]
    dims = [onnx.helper.make_tensor_value_info("probabilities", onnx.TensorProto.FLOAT, ["batch", 10])]
    model.graph.output.remove(output)
    model.graph.output.extend(dims)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`cnn` (fp32, labels, top 3), `cnn-fp16`, `cnn-probs` (probabilities only) and `cnn-hooked` (a hook), as
    `servestack models push --image ...` builds them."""
    root = tmp_path_factory.mktemp("image-models")
    image = image_options(PREPROCESS)
    build_package(
        FIXTURES / "cnn.onnx", root / "cnn" / "1", name="cnn", version="1", image=image, labels=LABELS, top_k=3
    )
    build_package(FIXTURES / "cnn-fp16.onnx", root / "cnn-fp16" / "1", name="cnn-fp16", version="1", image=image)
    probabilities = probabilities_model(tmp_path_factory.mktemp("probs") / "probs.onnx")
    build_package(probabilities, root / "cnn-probs" / "1", name="cnn-probs", version="1", image=image, labels=LABELS)
    hook = tmp_path_factory.mktemp("hook") / "process.py"
    hook.write_text(HOOK)
    build_package(
        FIXTURES / "cnn.onnx", root / "cnn-hooked" / "1", name="cnn-hooked", version="1", image=image, process_file=hook
    )
    return root


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealtimeServer]:
    env = {"SERVESTACK_MODEL_DIR": str(model_dir), "SERVESTACK_DEFAULT_MODEL": "cnn"}
    running = RealtimeServer.start(tmp_path_factory.mktemp("image-server"), env=env)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def handler(model_dir: Path) -> Iterator[LambdaHandler]:
    """The Lambda entry module, initialised as a Lambda process does (models load at import), on these models."""
    yield from fresh_lambda_handler(model_dir, "cnn", "serverless_image_models")


Post = Callable[[str, bytes, str], tuple[int, Any]]


@pytest.fixture(params=["container", "lambda"])
def post(request: pytest.FixtureRequest) -> Post:
    """POST a body to a model's REST route, through the realtime server or the Lambda handler: (status, JSON)."""
    if request.param == "container":
        server: RealtimeServer = request.getfixturevalue("server")

        def to_container(model: str, body: bytes, content_type: str) -> tuple[int, Any]:
            answer = httpx.post(
                f"{server.url}/v1/models/{model}/predict", content=body, headers={"content-type": content_type}
            )
            return answer.status_code, answer.json()

        return to_container
    handler: LambdaHandler = request.getfixturevalue("handler")

    def to_lambda(model: str, body: bytes, content_type: str) -> tuple[int, Any]:
        event = lambda_event(
            "http-api-v2", body, path=f"/v1/models/{model}/predict", headers={"content-type": content_type}
        )
        response = handler(event)
        return response["statusCode"], orjson.loads(response_body(response))

    return to_lambda


def b64_json(names: list[str]) -> bytes:
    return orjson.dumps({"instances": [{"b64": base64.b64encode(picture(name)).decode()} for name in names]})


def form(names: list[str]) -> bytes:
    caption = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="caption"\r\n\r\nfive pictures\r\n'.encode()
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="{name}"\r\n'
        f"Content-Type: {'image/png' if name.endswith('.png') else 'image/jpeg'}\r\n\r\n".encode()
        + picture(name)
        + b"\r\n"
        for name in names
    ]
    return caption + b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


# name -> (Content-Type, body, the pictures it carries, in order)
FORMS: dict[str, tuple[str, bytes, list[str]]] = {
    "raw-jpeg": ("image/jpeg", picture("landscape.jpg"), ["landscape.jpg"]),
    "raw-jpeg-grey": ("image/jpeg", picture("grey.jpg"), ["grey.jpg"]),
    "raw-png": ("image/png", picture("square.png"), ["square.png"]),
    "raw-png-rgba": ("image/png", picture("transparent.png"), ["transparent.png"]),
    "b64-json": ("application/json", b64_json(PICTURES), PICTURES),
    "multipart": (f"multipart/form-data; boundary={BOUNDARY}", form(PICTURES), PICTURES),
}


def reference(names: list[str], file: str = "image_logits.npy") -> np.ndarray:
    logits: np.ndarray = np.load(FIXTURES / file)
    return logits[[PICTURES.index(name) for name in names]]


@pytest.mark.parametrize("name", list(FORMS))
def test_an_fp32_cnn_answers_pictures_as_torch_does(post: Post, name: str) -> None:
    content_type, body, names = FORMS[name]
    expected = reference(names)
    # GIVEN the CNN pushed with --image, its logits' labels and top 3
    # WHEN pictures are posted in this form
    status, answer = post("cnn", body, content_type)
    # THEN torch's answer on the same pictures: its logits (recovered from the probabilities, up to a constant per
    # row) within 1e-4, their argmax and its label, and the three best classes
    assert status == 200, answer
    probabilities = np.asarray(answer["probabilities"], dtype=np.float32)
    assert probabilities.shape == (len(names), 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(
        centred_log(probabilities), expected - expected.mean(axis=1, keepdims=True), atol=FP32_TOLERANCE
    )
    np.testing.assert_allclose(probabilities, softmax(expected), atol=FP32_TOLERANCE)
    assert answer["predictions"] == expected.argmax(axis=1).tolist()
    assert answer["labels"] == [LABELS[index] for index in expected.argmax(axis=1)]
    for row, best in enumerate(answer["top_k"]):
        order = np.argsort(-expected[row])[:3].tolist()
        assert [entry["class"] for entry in best] == order
        assert [entry["label"] for entry in best] == [LABELS[index] for index in order]
        assert [entry["probability"] for entry in best] == sorted((e["probability"] for e in best), reverse=True)


@pytest.mark.parametrize("name", ["raw-jpeg", "raw-png-rgba", "b64-json", "multipart"])
def test_an_fp16_cnn_answers_pictures_as_torch_does(post: Post, name: str) -> None:
    content_type, body, names = FORMS[name]
    expected = reference(names, "image_logits_fp16.npy").astype(np.float32)
    # GIVEN the fp16 copy (input and logits float16), WHEN pictures are posted, THEN torch's fp16 answer, within 1e-2
    status, answer = post("cnn-fp16", body, content_type)
    assert status == 200, answer
    probabilities = np.asarray(answer["probabilities"], dtype=np.float32)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)  # the softmax runs in float32
    np.testing.assert_allclose(
        centred_log(probabilities), expected - expected.mean(axis=1, keepdims=True), atol=FP16_TOLERANCE
    )
    assert answer["predictions"] == expected.argmax(axis=1).tolist()
    assert "labels" not in answer  # none given, none in the graph


def test_a_model_of_probabilities_gets_its_prediction_derived(post: Post) -> None:
    expected = reference(PICTURES)
    # GIVEN the CNN ending in a Softmax, pushed with labels and no other role declared
    # WHEN five pictures are posted
    status, answer = post("cnn-probs", b64_json(PICTURES), "application/json")
    # THEN its probabilities, and their argmax as the prediction, named by its label
    assert status == 200, answer
    np.testing.assert_allclose(answer["probabilities"], softmax(expected), atol=FP32_TOLERANCE)
    assert answer["predictions"] == expected.argmax(axis=1).tolist()
    assert answer["labels"] == [LABELS[index] for index in expected.argmax(axis=1)]
    assert "top_k" not in answer


def test_a_tensor_still_reaches_an_image_model(post: Post) -> None:
    # GIVEN the reference tensors, already preprocessed, WHEN posted as .npy, THEN the same classes as torch's
    buffer = io.BytesIO()
    np.save(buffer, np.load(FIXTURES / "image_inputs.npy"))
    status, answer = post("cnn", buffer.getvalue(), "application/x-npy")
    assert status == 200, answer
    assert answer["predictions"] == reference(PICTURES).argmax(axis=1).tolist()


@pytest.mark.parametrize(
    ("body", "content_type", "field"),
    [
        (b"not a picture", "image/jpeg", "body"),
        (picture("landscape.jpg")[:300], "image/jpeg", "body"),  # truncated
        (b"GIF89a" + bytes(40), "image/png", "body"),  # a format this does not take
        (orjson.dumps({"instances": [{"b64": base64.b64encode(picture("square.png")).decode()}, {"b64": "AAAA"}]}),
         "application/json", "instances[1].b64"),
    ],
)  # fmt: skip
def test_a_bad_picture_is_a_400_naming_the_item(post: Post, body: bytes, content_type: str, field: str) -> None:
    # GIVEN bytes that are no JPEG, PNG or WebP picture, WHEN posted to the image model
    status, answer = post("cnn", body, content_type)
    # THEN a 400 naming the item and what is accepted
    assert status == 400, answer
    error = answer["error"]
    assert error["field"] == field
    assert error["message"].startswith(f"{field}: not a JPEG, PNG or WebP picture")
    assert "image/jpeg, image/png or image/webp" in error["allowed"]
    assert '{"b64"' in error["allowed"]


def test_a_body_no_image_form_holds_is_a_415_naming_the_forms(post: Post) -> None:
    status, answer = post("cnn", b"RIFF....WAVE", "audio/wav")
    assert status == 415, answer
    assert answer["error"]["value"] == "audio/wav"
    assert "multipart/form-data" in answer["error"]["allowed"]


def test_a_hook_wins_over_the_declared_image(post: Post) -> None:
    # GIVEN a package pushed with --image and a preprocess hook, WHEN bytes no decoder reads are posted as a PNG
    status, answer = post("cnn-hooked", b"not a picture", "image/png")
    # THEN the hook read them (it ignores them): 200, not the image decoder's 400
    assert status == 200, answer
    assert len(answer["predictions"]) == 1


def test_push_refuses_labels_whose_count_is_not_the_classes(tmp_path: Path) -> None:
    # GIVEN the CNN's 10 logits, WHEN pushed with 3 labels
    done = subprocess.run(
        [SERVESTACK, "models", "push", str(FIXTURES / "cnn.onnx"), "--name", "cnn", "--artifacts", str(tmp_path),
         "--labels", "cat,dog,bird"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    # THEN refused in one line naming both counts, and nothing written
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--labels: 3 labels given, but the model's 'logits' has 10 classes" in lines[0]
    assert not (tmp_path / "cnn").exists()


def test_labels_on_scores_of_no_declared_role_are_refused(tmp_path: Path) -> None:
    # GIVEN a model whose one output is float [N, 10] under a name that says nothing of its role
    model = onnx.load(str(FIXTURES / "cnn.onnx"))
    model.graph.node.append(onnx.helper.make_node("Identity", ["logits"], ["scores"]))
    model.graph.output.remove(model.graph.output[0])
    model.graph.output.extend([onnx.helper.make_tensor_value_info("scores", onnx.TensorProto.FLOAT, ["batch", 10])])
    onnx.save(model, str(tmp_path / "scores.onnx"))
    # WHEN pushed with labels alone, THEN refused: which role its scores have (not labels naming the scores)
    with pytest.raises(InvalidInput, match=r"--outputs logits=scores or --outputs probabilities=scores"):
        build_package(tmp_path / "scores.onnx", tmp_path / "a", name="scores", version="1", labels=LABELS)
    # AND with the role declared, the labels name the argmax
    built = build_package(
        tmp_path / "scores.onnx", tmp_path / "b", name="scores", version="1", labels=LABELS,
        outputs_role=("logits", None), image=image_options(PREPROCESS),
    )  # fmt: skip
    assert built.manifest.logits_output == "scores"
    sample = orjson.loads((tmp_path / "b" / "sample-response.json").read_bytes())
    assert sample["labels"][0] in LABELS


def test_push_records_the_image_and_requires_pillow(model_dir: Path) -> None:
    manifest = orjson.loads((model_dir / "cnn" / "1" / "manifest.json").read_bytes())
    assert manifest["image"] == {
        "input": "image",
        "layout": "NCHW",
        "crop": [64, 64],
        "resize": 72,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
    }
    assert manifest["requirements"] == ["Pillow>=9.1"]
    assert manifest["logits_output"] == "logits"
    assert manifest["top_k"] == 3
    # the sample request is a picture, as the model's users send them
    sample = orjson.loads((model_dir / "cnn" / "1" / "sample-request.json").read_bytes())
    assert list(sample["instances"][0]) == ["b64"]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("resize=32,crop=64", "makes the shorter side smaller than the 64x64 crop"),
        ("crop=32", "image.crop: 32x32, but input 'image' (NCHW) has height 64"),
        ("layout=NHWC", "NHWC puts the channels at axis 3, which has 64, not 3"),
        ("std=1:0:1", "every channel's std must be > 0"),
        ("size=3", "'size=3' is not KEY=VALUE of a known key"),
        ("mean=1:2", "'mean=1:2' is not a valid mean"),
    ],
)
def test_push_refuses_an_image_the_model_cannot_take(tmp_path: Path, given: str, message: str) -> None:
    with pytest.raises(InvalidInput, match="--image: .*" + message.replace("(", r"\(").replace(")", r"\)")):
        build_package(FIXTURES / "cnn.onnx", tmp_path, name="cnn", version="1", image=image_options(given))


def test_the_docs_push_command_runs_as_written(tmp_path: Path) -> None:
    # GIVEN docs/model-packages.md's `--image` push command, in a project beside the fixture CNN
    document = (Path(__file__).resolve().parents[2] / "docs" / "model-packages.md").read_text(encoding="utf-8")
    command = next(
        line for line in document.splitlines() if line.startswith("servestack models push cnn.onnx --name cnn --image")
    )
    (tmp_path / "serving.yaml").touch()
    (tmp_path / "cnn.onnx").write_bytes((FIXTURES / "cnn.onnx").read_bytes())
    # WHEN it runs
    done = subprocess.run(
        ["bash", "-e", "-c", command.replace("servestack ", f"{SERVESTACK} ", 1)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    # THEN the package answers the docs' example (landscape.jpg) as the docs show it
    assert done.returncode == 0, done.stdout + done.stderr
    package = tmp_path / "models" / "artifacts" / "cnn" / "1"
    settings = ServingSettings(model_dir=package, default_model="cnn", providers="CPUExecutionProvider", warmup=False)
    answer = orjson.loads(ServedModel.load(package, settings).infer(picture("landscape.jpg"), "image/jpeg", None).body)
    shown = orjson.loads(document.split("The CNN above answers a JPEG with:")[1].split("```json\n")[1].split("```")[0])
    assert answer["predictions"] == shown["predictions"]
    assert answer["labels"] == shown["labels"]
    np.testing.assert_allclose(answer["probabilities"], shown["probabilities"], atol=1e-3)
    assert [[entry["label"] for entry in row] for row in answer["top_k"]] == [
        [entry["label"] for entry in row] for row in shown["top_k"]
    ]
