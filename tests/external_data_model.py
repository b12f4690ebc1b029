"""An ONNX model whose weights live in external data, as `torch.onnx.export` (torch 2.15's default) and every model
over 2 GB write it: `model.onnx` holds the graph, `model.onnx.data` beside it the tensors.

The graph is `y = x @ W + b` (MatMul + Add), float32. The weights are small integers (seeded random rows of W,
at most 80 of them, the others zero), so that numpy's answer is the model's exactly (every sum is an integer far below
2**24, exact in float32 in any order) and the data file compresses fast in the registry's archive. The data file
is written straight from the arrays (each tensor's `external_data` names its location, offset and length), so a
100 MB model costs one copy of its weights in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA_SUFFIX = ".data"


@dataclass(frozen=True)
class ExternalDataModel:
    onnx_file: Path
    data_file: Path
    weights: np.ndarray
    bias: np.ndarray

    def expected(self, rows: np.ndarray) -> np.ndarray:
        """What the model answers, computed by numpy."""
        return rows.astype(np.float32) @ self.weights + self.bias

    def rows(self, count: int = 2) -> np.ndarray:
        """Requests rows of small integers: `count` rows of the model's width."""
        return np.random.default_rng(1).integers(0, 4, size=(count, self.weights.shape[0])).astype(np.float32)


def write_external_data_model(folder: Path, *, width: int = 64, name: str = "model.onnx") -> ExternalDataModel:
    """`folder/name` and `folder/name.data`: a `[N, width] -> [N, width]` model whose W is `width x width` float32
    (width 5120: 105 MB of external data)."""
    import onnx
    from onnx import TensorProto, helper

    folder.mkdir(parents=True, exist_ok=True)
    weights = np.zeros((width, width), np.float32)
    rng = np.random.default_rng(0)
    step = max(1, width // 80)  # at most 80 rows of W are not zero
    weights[::step] = rng.integers(-2, 3, size=weights[::step].shape)
    bias = rng.integers(-3, 4, size=width).astype(np.float32)
    location = name + DATA_SUFFIX
    tensors = []
    with (folder / location).open("wb") as data:
        for tensor_name, array in (("W", weights), ("b", bias)):
            offset = data.tell()
            data.write(array.tobytes())
            tensor = TensorProto(name=tensor_name, data_type=TensorProto.FLOAT, dims=array.shape)
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(array.nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            tensors.append(tensor)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, width])],
        tensors,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # what onnxruntime 1.20 and later read (onnx writes its newest, which they may not)
    onnx.save_model(model, str(folder / name))
    return ExternalDataModel(folder / name, folder / location, weights, bias)
