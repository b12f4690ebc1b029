"""A ResNet-18-shaped ONNX model (torchvision's layers and shapes, random weights, batch norm folded into the
convolutions as an export for inference leaves it), written with onnx.helper so that the image bench can weigh
decoding against a model of the size users serve, with no torch: input `image` [N, 3, 224, 224], output
`logits` [N, 1000], about 11.7 M parameters (45 MB)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # channels, first block's stride


class _Graph:
    def __init__(self, seed: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"

    def conv(self, x: str, channels_in: int, channels_out: int, kernel: int, stride: int, relu: bool = True) -> str:
        weight, bias, out = self.name("w"), self.name("b"), self.name("conv")
        scale = np.sqrt(2.0 / (channels_in * kernel * kernel))  # He: activations keep their scale through depth
        shape = (channels_out, channels_in, kernel, kernel)
        self.weights.append(numpy_helper.from_array(self.rng.normal(0, scale, shape).astype(np.float32), weight))
        self.weights.append(numpy_helper.from_array(np.zeros(channels_out, np.float32), bias))
        pad = kernel // 2
        self.nodes.append(helper.make_node("Conv", [x, weight, bias], [out], kernel_shape=[kernel, kernel],
                                           strides=[stride, stride], pads=[pad] * 4))  # fmt: skip
        return self.relu(out) if relu else out

    def relu(self, x: str) -> str:
        out = self.name("relu")
        self.nodes.append(helper.make_node("Relu", [x], [out]))
        return out

    def block(self, x: str, channels_in: int, channels_out: int, stride: int) -> str:
        branch = self.conv(self.conv(x, channels_in, channels_out, 3, stride), channels_out, channels_out, 3, 1, False)
        shortcut = (
            x
            if stride == 1 and channels_in == channels_out
            else self.conv(x, channels_in, channels_out, 1, stride, relu=False)
        )
        added = self.name("add")
        self.nodes.append(helper.make_node("Add", [branch, shortcut], [added]))
        return self.relu(added)


def write_resnet18(path: Path, seed: int = 0) -> Path:
    graph = _Graph(seed)
    x = graph.conv("image", 3, 64, 7, 2)
    pooled = graph.name("pool")
    graph.nodes.append(helper.make_node("MaxPool", [x], [pooled], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))
    x, channels = pooled, 64
    for width, stride in STAGES:
        x = graph.block(x, channels, width, stride)
        x = graph.block(x, width, width, 1)
        channels = width
    graph.nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    graph.nodes.append(helper.make_node("Flatten", ["gap"], ["features"]))
    fc = graph.rng.normal(0, np.sqrt(1.0 / 512), (1000, 512)).astype(np.float32)
    graph.weights += [numpy_helper.from_array(fc, "fc_w"), numpy_helper.from_array(np.zeros(1000, np.float32), "fc_b")]
    graph.nodes.append(helper.make_node("Gemm", ["features", "fc_w", "fc_b"], ["logits"], transB=1))
    model = helper.make_model(
        helper.make_graph(
            graph.nodes,
            "resnet18",
            [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 224, 224])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1000])],
            graph.weights,
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 9  # one every onnxruntime the runtime extra allows reads
    onnx.save_model(model, str(path))
    return path
