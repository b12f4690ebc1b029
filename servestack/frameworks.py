"""Deep learning models for `servestack.models.push`: a PyTorch `nn.Module` exported with `torch.onnx.export`, a
Keras model converted with tf2onnx, each with a free batch axis, and their ONNX answers checked against the
framework's own on the sample (servestack/models.py pushes what passes).

Nothing here imports torch or TensorFlow at module level: `models.push` asks `framework_of` which framework a
model is from by its classes' modules, then imports that one, or names the pip install that brings it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from servestack.conversion import TOLERANCE_TEXT, Mismatch, worst_row
from servestack.inference.errors import InvalidInput

Framework = Literal["torch", "keras"]
# What each framework's conversion needs beyond servestack's own dependencies.
INSTALL = {
    "torch": "pip install torch onnx onnxscript (torch.onnx.export's dynamo exporter needs onnxscript)",
    "keras": "pip install tensorflow tf2onnx",
}
# The ONNX opset both exporters are asked for: onnxruntime 1.2x runs it, torch's dynamo exporter starts there.
OPSET = 18


@dataclass(frozen=True)
class Converted:
    """An ONNX model from a framework, and the sample it was checked on, as named numpy inputs."""

    onnx_model: bytes
    inputs: dict[str, np.ndarray]


def framework_of(model: Any) -> Framework | None:
    """Which deep learning framework `model` is from, read from its classes' modules (importing neither)."""
    for cls in type(model).__mro__:
        module = cls.__module__
        if module.startswith("torch.nn") and cls.__name__ == "Module":
            return "torch"
        if module.split(".")[0] in ("keras", "tf_keras") and cls.__name__ == "Model":
            return "keras"
        if module.startswith("tensorflow.python.keras") and cls.__name__ == "Model":
            return "keras"
    return None


def require(framework: Framework, modules: tuple[str, ...], model: Any) -> None:
    """The one-line error naming the pip install, when a module the conversion needs is missing."""
    import importlib.util

    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        raise InvalidInput(
            f"servestack.models.push converts a {framework} model with {', '.join(modules)}: "
            f"{', '.join(missing)} is not installed",
            field="estimator",
            value=type(model).__name__,
            allowed=INSTALL[framework],
        )


def convert(model: Any, sample: Any, framework: Framework) -> Converted:
    """Export `model` to ONNX with `sample`'s names and a free batch axis, then check its answers against the
    framework's own on the sample; refused (nothing written) when they differ."""
    if framework == "torch":
        require("torch", ("torch", "onnx", "onnxscript"), model)
        converted, expected = _from_torch(model, sample)
    else:
        require("keras", ("tensorflow", "tf2onnx"), model)
        converted, expected = _from_keras(model, sample)
    mismatches = _compare(converted, expected)
    if mismatches:
        worst = max(mismatches, key=lambda mismatch: mismatch.excess)
        raise InvalidInput(
            f"the ONNX export of {type(model).__name__} does not answer as {framework} does: "
            f"{worst.describe().replace('the estimator', framework)}; nothing was written",
            field="estimator",
            value=f"{worst.output} row {worst.row}",
            allowed=f"an export whose answers match the model's on every sample row ({TOLERANCE_TEXT})",
        )
    return converted


def _compare(converted: Converted, expected: dict[str, np.ndarray]) -> list[Mismatch]:
    import onnxruntime as ort

    session = ort.InferenceSession(converted.onnx_model, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    answers = dict(zip(names, session.run(names, converted.inputs), strict=True))
    if list(expected) != names:  # the framework's outputs, named as the export names them
        expected = dict(zip(names, expected.values(), strict=True))
    found = [worst_row(name, want, answers[name]) for name, want in expected.items()]
    return [mismatch for mismatch in found if mismatch is not None]


def _numpy(value: Any) -> np.ndarray:
    """A tensor's values on the host (torch's through `.detach().cpu()`, TensorFlow's through `.numpy()`)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu()
    if hasattr(value, "numpy"):
        return np.asarray(value.numpy())
    return np.asarray(value)


def _named_outputs(result: Any) -> dict[str, np.ndarray]:
    """A model's answer as named arrays: a tensor is `output`, a tuple or list `output_0`..., a dict its keys."""
    if isinstance(result, Mapping):
        return {str(name): _numpy(value) for name, value in result.items()}
    if isinstance(result, tuple | list):
        return {f"output_{i}": _numpy(value) for i, value in enumerate(result)}
    return {"output": _numpy(result)}


def _sample_inputs(sample: Any, framework: Framework) -> dict[str, Any]:
    """The sample as named inputs: one tensor (or array) is `input`, a dict of them keeps its keys."""
    if isinstance(sample, Mapping):
        if not sample:
            raise InvalidInput("the sample has no inputs", field="sample", value="{}", allowed="a tensor or a dict")
        return {str(name): value for name, value in sample.items()}
    if hasattr(sample, "shape"):
        return {"input": sample}
    raise InvalidInput(
        f"a {framework} model's sample must be a tensor or a dict of tensors, not {type(sample).__name__}",
        field="sample",
        value=type(sample).__name__,
        allowed=f"a {framework} tensor or numpy array (the input `input`), or a dict of them (one input each)",
    )


def _from_torch(module: Any, sample: Any) -> tuple[Converted, dict[str, np.ndarray]]:
    """torch.onnx.export (the dynamo exporter) with dim 0 of every input free: the batch axis. A dict sample is
    passed as keyword arguments (`forward(input_ids=..., attention_mask=...)`), its keys the ONNX inputs' names."""
    import torch

    named = {
        name: value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
        for name, value in _sample_inputs(sample, "torch").items()
    }
    small = [name for name, value in named.items() if value.dim() == 0 or value.shape[0] < 2]
    if small:
        raise InvalidInput(
            f"the sample's input {small[0]!r} has fewer than 2 rows: torch.export fixes a dimension of size 0 or 1, "
            "so the batch axis would not stay free",
            field=f"sample.{small[0]}",
            value=list(named[small[0]].shape),
            allowed="a sample of 2 or more rows in every input (dim 0 is the batch axis)",
        )
    module.eval()
    with torch.no_grad():
        expected = _named_outputs(module(**named) if isinstance(sample, Mapping) else module(named["input"]))
    batch = torch.export.Dim("batch")
    dynamic = {name: {0: batch} for name in named}
    args, kwargs = ((), named) if isinstance(sample, Mapping) else ((named["input"],), {})
    program = torch.onnx.export(
        module,
        args,
        kwargs=kwargs,
        input_names=list(named),
        output_names=list(expected),
        dynamic_shapes=dynamic if isinstance(sample, Mapping) else (dynamic["input"],),
        opset_version=OPSET,
        dynamo=True,
        verbose=False,
    )
    assert program is not None  # the dynamo exporter always returns its program
    inputs = {name: _numpy(value) for name, value in named.items()}
    return Converted(program.model_proto.SerializeToString(), inputs), expected


def _from_keras(model: Any, sample: Any) -> tuple[Converted, dict[str, np.ndarray]]:
    """tf2onnx with a signature whose batch dimension is None. A dict sample feeds a model with named inputs
    (Keras's `Input(name=...)`), its keys the ONNX inputs' names. The model is converted as a `tf.function`
    calling it (`tf2onnx.convert.from_function`): tf2onnx 1.17's `from_keras` looks a Keras 3 model's outputs up
    by their symbolic tensors' names and fails (`KeyError: 'keras_tensor_2'`); the function returns the outputs
    by the names `push` gives them, which become the ONNX outputs' names."""
    import tensorflow as tf
    import tf2onnx

    named = {name: np.asarray(_numpy(value)) for name, value in _sample_inputs(sample, "keras").items()}
    by_name = isinstance(sample, Mapping)
    expected = _named_outputs(model(named if by_name else named["input"], training=False))
    signature = [
        tf.TensorSpec((None, *array.shape[1:]), tf.as_dtype(array.dtype), name=name) for name, array in named.items()
    ]

    def call(*tensors: Any) -> dict[str, Any]:
        answer = model(dict(zip(named, tensors, strict=True)) if by_name else tensors[0], training=False)
        if isinstance(answer, Mapping):
            return dict(answer)
        if isinstance(answer, tuple | list):
            return {f"output_{i}": value for i, value in enumerate(answer)}
        return {"output": answer}

    function = tf.function(call, input_signature=signature)
    onnx_model, _ = tf2onnx.convert.from_function(function, input_signature=signature, opset=OPSET)
    return Converted(onnx_model.SerializeToString(), named), expected
