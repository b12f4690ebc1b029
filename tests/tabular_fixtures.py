"""Small real ONNX models with named columns, built with onnx.helper into a package that `build_package` writes,
as `servestack models push` does: no hand-written manifest."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from servestack.inference.packaging import build_package
from servestack.inference.service import ServedModel
from servestack.inference.settings import ServingSettings


def summing_model(path: Path) -> Path:
    """One float32 input `x` of shape [N, 3] -> `total` [N, 1], the sum of each row (a one-target regressor)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=1)],
        "summing",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def summing_package(
    directory: Path, *, columns: Sequence[str] = ("a", "b", "c"), allow_nan: bool | Sequence[str] = False
) -> ServedModel:
    """The summing model pushed with `--columns a,b,c` (and `--allow-nan`), loaded as every mode loads it."""
    source = summing_model(directory / "summing.onnx")
    package = directory / "summing" / "1"
    build_package(source, package, name="summing", version="1", columns=columns, allow_nan=allow_nan)
    settings = ServingSettings(model_dir=package, default_model="summing", providers="CPUExecutionProvider")
    return ServedModel.load(package, settings)
