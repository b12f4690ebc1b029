"""IO binding (issue 36, item 6): on an accelerator a run's inputs are bound to its memory once, as OrtValues, and
its outputs bound there too. The same code path runs here with the CPU provider (device 'cpu'): its answers must
be those of a plain `session.run`, for float32 and float16 models, float16 inputs cast from JSON floats."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from servestack.inference import media_types
from servestack.inference.packaging import build_package
from servestack.inference.runtime import ModelRuntime
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings

FEATURES = 4
CLASSES = 3


def _write_linear_model(path: Path, dtype: type[np.floating]) -> Path:
    """scores = relu(x @ W + b) and label = argmax(scores) in `dtype`, with a free batch axis."""
    import onnx
    from onnx import helper, numpy_helper

    element = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    generator = np.random.default_rng(7)
    weights = numpy_helper.from_array(generator.normal(size=(FEATURES, CLASSES)).astype(dtype), "weights")
    bias = numpy_helper.from_array(generator.normal(size=(CLASSES,)).astype(dtype), "bias")
    nodes = [
        helper.make_node("MatMul", ["x", "weights"], ["product"]),
        helper.make_node("Add", ["product", "bias"], ["shifted"]),
        helper.make_node("Relu", ["shifted"], ["scores"]),
        helper.make_node("ArgMax", ["scores"], ["label"], axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("x", element, ["batch", FEATURES])],
        [
            helper.make_tensor_value_info("scores", element, ["batch", CLASSES]),
            helper.make_tensor_value_info("label", onnx.TensorProto.INT64, ["batch"]),
        ],
        [weights, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module", params=[np.float32, np.float16], ids=["fp32", "fp16"])
def package(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp(f"linear-{np.dtype(request.param).name}")
    source = _write_linear_model(folder / "source.onnx", request.param)
    return build_package(source, folder / "package", name="linear", version="1").directory


def _load(package: Path, *, io_binding: bool) -> ServedModel:
    settings = ServingSettings(model_dir=package, default_model="linear", providers="CPUExecutionProvider")
    model = ServedModel.load(package, settings)
    model.runtime = ModelRuntime(
        model.manifest, package / model.manifest.file, providers="CPUExecutionProvider", io_binding=io_binding
    )
    return model


def test_a_cpu_session_runs_unbound_unless_asked(package: Path) -> None:
    # GIVEN a session on the CPU provider, with the default binding choice
    runtime = _load(package, io_binding=False).runtime
    default = ModelRuntime(runtime.manifest, package / runtime.manifest.file, providers="CPUExecutionProvider")
    # THEN it runs `session.run` (binding pays off where inputs cross to an accelerator); asked for, it binds
    assert default.binding_device is None
    assert _load(package, io_binding=True).runtime.binding_device == "cpu"


def test_bound_answers_equal_plain_run_answers(package: Path) -> None:
    # GIVEN the same model run with and without IO binding
    bound, plain = _load(package, io_binding=True), _load(package, io_binding=False)
    dtype = bound.manifest.inputs[0].numpy_dtype
    rows = np.random.default_rng(3).normal(size=(257, FEATURES)).astype(dtype)
    # WHEN a whole batch runs through each
    with_binding = bound.runtime.predict({"x": rows})
    without = plain.runtime.predict({"x": rows})
    # THEN the answers are identical, bit for bit, in the model's own dtypes
    assert list(with_binding) == ["scores", "label"]
    for name in ("scores", "label"):
        assert with_binding[name].dtype == without[name].dtype
        np.testing.assert_array_equal(with_binding[name], without[name])
    assert with_binding["scores"].dtype == dtype


def test_json_floats_are_cast_to_the_models_dtype_and_answer_alike(package: Path) -> None:
    # GIVEN a JSON request of Python floats (a float16 model's too: JSON has no float16)
    bound, plain = _load(package, io_binding=True), _load(package, io_binding=False)
    body = json.dumps({"instances": [[0.5, -1.25, 2.0, 0.1], [1.0, 0.0, -0.3, 3.3]]}).encode()
    # WHEN it is decoded: the inputs take the manifest's dtype
    arrays = bound.decode(body, media_types.JSON)
    assert arrays["x"].dtype == bound.manifest.inputs[0].numpy_dtype
    # THEN the whole request answers the same, bound or not
    answers = [
        json.loads(model.infer(body, media_types.JSON, media_types.JSON).body)["predictions"]
        for model in (bound, plain)
    ]
    assert answers[0] == answers[1]
    assert answers[0] == plain.runtime.predict(arrays)["label"].tolist()


def test_a_model_with_string_tensors_runs_unbound_and_answers_alike() -> None:
    # GIVEN the zoo's pipeline (a string column in, string labels out), asked to bind: onnxruntime binds no string
    # tensor, on the CPU or on CUDA ("Only binding non-string Tensors is currently supported": on a GPU this model
    # failed its warm-up, and the endpoint never became ready)
    from tests.pipeline_model import pipeline_model

    pipeline = pipeline_model()
    settings = ServingSettings(model_dir=pipeline.root, default_model="flowers", providers="CPUExecutionProvider")
    model = ServedModel.load(pipeline.package, settings)
    bound = ModelRuntime(model.manifest, pipeline.package / model.manifest.file, io_binding=True)
    # THEN it runs `session.run`, and answers as the estimator does
    assert bound.binding_device is None
    arrays = {
        spec.name: np.asarray(pipeline.rows[spec.name], dtype=object if spec.dtype == "string" else np.float32).reshape(
            -1, 1
        )
        for spec in model.manifest.inputs
    }
    assert bound.predict(arrays)["label"].tolist() == pipeline.expected
