"""skl2onnx's `Scaler` (a scikit-learn StandardScaler, MinMaxScaler...) rewritten at `models push` as the `Sub` and
`Mul` of its own offset and scale: the same float32 arithmetic, `(x - offset) * scale`, so the same answers bit for
bit, but onnxruntime runs `ai.onnx.ml.Scaler` as a loop of a modulo and an indirect call per element, and
`Sub`/`Mul` as vectorized kernels. On the digits MLP (a StandardScaler before two MatMuls) the Scaler was 63 of
the ~150 µs of a 352-row batch, more than both MatMuls; rewritten, the batch ran in 74 µs instead of 126
(docs/performance.md, "The third look of 2026-12-04")."""

from __future__ import annotations

from typing import Any

import numpy as np

SCALER = ("ai.onnx.ml", "Scaler")
# Sub and Mul with numpy-style broadcasting: ONNX opset 7 and later.
MIN_OPSET = 7


def split_scalers(onnx: Any, model: Any) -> list[str]:
    """Rewrite each top-level float32 `Scaler` of `model` in place; what changed, one line a node."""
    graph = model.graph
    scalers = [node for node in graph.node if (node.domain, node.op_type) == SCALER]
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0)
    if not scalers or opset < MIN_OPSET:
        return []
    float32 = _float32_values(onnx, model)
    changes: list[str] = []
    for node in scalers:
        if len(node.input) != 1 or len(node.output) != 1 or node.input[0] not in float32:
            continue  # another input type: Scaler casts it to float first; left as it is
        attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
        offset = np.asarray(attributes.get("offset", [0.0]), dtype=np.float32)
        scale = np.asarray(attributes.get("scale", [1.0]), dtype=np.float32)
        name = node.name or node.output[0]
        offset_name, scale_name, centred = f"{name}__offset", f"{name}__scale", f"{name}__centred"
        graph.initializer.extend(
            [onnx.numpy_helper.from_array(offset, offset_name), onnx.numpy_helper.from_array(scale, scale_name)]
        )
        replacement = [
            onnx.helper.make_node("Sub", [node.input[0], offset_name], [centred], name=f"{name}__sub"),
            onnx.helper.make_node("Mul", [centred, scale_name], [node.output[0]], name=f"{name}__mul"),
        ]
        position = list(graph.node).index(node)
        graph.node.remove(node)
        for offset_index, new_node in enumerate(replacement):
            graph.node.insert(position + offset_index, new_node)
        changes.append(
            f"node {name!r}: skl2onnx's Scaler rewritten as Sub and Mul of its offset and scale (the same float32 "
            "arithmetic, faster in onnxruntime)"
        )
    return changes


def _float32_values(onnx: Any, model: Any) -> set[str]:
    """The names of the graph's float32 tensors, as shape inference sees them (the model's own types kept)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # a graph shape inference cannot read: nothing is rewritten
        return set()
    values = [*inferred.input, *inferred.value_info, *inferred.output]
    return {value.name for value in values if value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
