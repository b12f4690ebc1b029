"""A BERT-like classifier for tests: `input_ids` and `attention_mask` (int64, dynamic batch and sequence axes),
a Gather on a word embedding of `VOCAB` rows and one on a position table of `POSITIONS` rows (indexed by a
Range over the sequence's length), masked and summed into `CLASSES` logits. Built with the onnx helper API."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB = 50
POSITIONS = 8
CLASSES = 3


def write_token_model(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    generator = np.random.default_rng(0)
    constants = [
        numpy_helper.from_array(generator.random((VOCAB, CLASSES)).astype(np.float32), "word_embedding"),
        numpy_helper.from_array(generator.random((POSITIONS, CLASSES)).astype(np.float32), "position_table"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([2], np.int64), "last_axis"),
        numpy_helper.from_array(np.array([1], np.int64), "sequence_axis"),
    ]
    nodes = [
        helper.make_node("Gather", ["word_embedding", "input_ids"], ["words"]),
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["length"]),
        helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
        helper.make_node("Gather", ["position_table", "positions"], ["placed"]),
        helper.make_node("Add", ["words", "placed"], ["embedded"]),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask", "last_axis"], ["mask3"]),
        helper.make_node("Mul", ["embedded", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "sequence_axis"], ["logits"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "token-classifier",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return path
