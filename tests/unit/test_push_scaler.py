"""`models push` rewrites skl2onnx's float32 `Scaler` as `Sub` and `Mul` (servestack/inference/push_scaler.py):
the same answers bit for bit, where onnxruntime ran the Scaler as a scalar loop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from servestack.inference.packaging import build_package


def _scaler_model(path: Path, element: int, offset: list[float], scale: list[float]) -> Path:
    nodes = [
        helper.make_node("Scaler", ["x"], ["scaled"], domain="ai.onnx.ml", offset=offset, scale=scale),
        helper.make_node("ReduceSum", ["scaled"], ["total"], keepdims=1),
    ]
    graph = helper.make_graph(
        nodes,
        "scaled",
        [helper.make_tensor_value_info("x", element, ["batch", 3])],
        [helper.make_tensor_value_info("scaled", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch", 1])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(("offset", "scale"), [([0.5, -2.0, 1e6], [3.0, 0.1, 1e-6]), ([1.5], [0.25])])
def test_a_float_scaler_becomes_sub_and_mul_with_the_same_answers_bit_for_bit(
    tmp_path: Path, offset: list[float], scale: list[float]
) -> None:
    # GIVEN a float32 Scaler, per feature or one value for all
    source = _scaler_model(tmp_path / "source.onnx", TensorProto.FLOAT, offset, scale)
    # WHEN it is pushed
    package = build_package(source, tmp_path / "package", name="scaled", version="1")
    # THEN the packaged graph has no Scaler, the change is said, and every answer is the original's, bit for bit
    graph = onnx.load(str(package.directory / "model.onnx")).graph
    assert [node.op_type for node in graph.node] == ["Sub", "Mul", "ReduceSum"]
    assert any("Scaler rewritten as Sub and Mul" in change for change in package.changes)
    rows = np.random.default_rng(5).normal(scale=1e3, size=(257, 3)).astype(np.float32)
    before = _session(source).run(None, {"x": rows})
    after = _session(package.directory / "model.onnx").run(None, {"x": rows})
    for old, new in zip(before, after, strict=True):
        np.testing.assert_array_equal(old, new)


def test_a_scaler_of_another_input_type_is_left_as_it_is(tmp_path: Path) -> None:
    # GIVEN a Scaler on doubles (it casts them to float first: Sub and Mul would not)
    source = _scaler_model(tmp_path / "source.onnx", TensorProto.DOUBLE, [1.0], [2.0])
    package = build_package(source, tmp_path / "package", name="scaled", version="1")
    # THEN the graph keeps it
    graph = onnx.load(str(package.directory / "model.onnx")).graph
    assert [node.op_type for node in graph.node] == ["Scaler", "ReduceSum"]
