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


def counting_model(path: Path) -> Path:
    """One int64 input `x` of shape [N, 3] -> `total` [N, 1] float32, the sum of each row: integer columns."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["counts"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["counts", "axes"], ["total"], keepdims=1),
        ],
        "counting",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [None, 3])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def counting_package(model_dir: Path) -> ServedModel:
    """The counting model pushed with `--columns a,b,c` into `model_dir/counting/1` (so `model_dir` serves it as
    SERVESTACK_MODEL_DIR with SERVESTACK_DEFAULT_MODEL=counting), loaded as every mode loads it."""
    model_dir.mkdir(parents=True, exist_ok=True)
    source = counting_model(model_dir / "counting.onnx")
    package = model_dir / "counting" / "1"
    build_package(source, package, name="counting", version="1", columns=("a", "b", "c"))
    settings = ServingSettings(model_dir=model_dir, default_model="counting", providers="CPUExecutionProvider")
    return ServedModel.load(package, settings)


SITES = ("north", "south", "east")


def site_model(path: Path) -> Path:
    """One string column `site` ([N, 1]) -> `score` [N, 1] float32: 1, 2 or 3 for a known site, 0 for any other
    text (ONNX-ML's LabelEncoder with a default), so every string is a row the model takes."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node(
                "LabelEncoder",
                ["site"],
                ["score"],
                domain="ai.onnx.ml",
                keys_strings=list(SITES),
                values_floats=[1.0, 2.0, 3.0],
                default_float=0.0,
            )
        ],
        "sites",
        [helper.make_tensor_value_info("site", TensorProto.STRING, [None, 1])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, [None, 1])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 2)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def site_package(model_dir: Path) -> ServedModel:
    """The site model in `model_dir/sites/1` (SERVESTACK_DEFAULT_MODEL=sites), loaded as every mode loads it."""
    model_dir.mkdir(parents=True, exist_ok=True)
    source = site_model(model_dir / "sites.onnx")
    package = model_dir / "sites" / "1"
    build_package(source, package, name="sites", version="1")
    settings = ServingSettings(model_dir=model_dir, default_model="sites", providers="CPUExecutionProvider")
    return ServedModel.load(package, settings)


# One [N, 1] input per column dtype a request can carry: every kind of column, for the codecs' property tests.
EVERY_TYPE = {"f32": "FLOAT", "f64": "DOUBLE", "i64": "INT64", "i32": "INT32", "u8": "UINT8", "flag": "BOOL",
              "name": "STRING"}  # fmt: skip


def every_type_package(model_dir: Path, *, allow_nan: Sequence[str] = ("f64",)) -> ServedModel:
    """A model with one column of each of EVERY_TYPE's dtypes (`f64` may hold NaN), answering `out`, its `f32`
    column: a model of every kind of column, in `model_dir/every-type/1`."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["f32"], ["out"])],
        "every_type",
        [
            helper.make_tensor_value_info(name, getattr(TensorProto, kind), [None, 1])
            for name, kind in EVERY_TYPE.items()
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    model_dir.mkdir(parents=True, exist_ok=True)
    source = model_dir / "every-type.onnx"
    source.write_bytes(model.SerializeToString())
    package = model_dir / "every-type" / "1"
    build_package(source, package, name="every-type", version="1", allow_nan=allow_nan)
    settings = ServingSettings(model_dir=model_dir, default_model="every-type", providers="CPUExecutionProvider")
    return ServedModel.load(package, settings)
