"""The optimized model files of `servestack models optimize`, built with onnxruntime's own tools, and what they
hold. Only this offline step imports `onnxruntime.quantization` and `onnx`; the serving code never does."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy as np

    from servestack.optimize.rows import Rows

Method = Literal["graph", "dynamic-int8", "static-int8"]
METHODS: tuple[Method, ...] = ("dynamic-int8", "static-int8", "graph")
LOSSY: frozenset[str] = frozenset({"dynamic-int8", "static-int8"})
# Rows per calibration batch fed to onnxruntime's calibrator.
CALIBRATION_BATCH = 32
# The `ai.onnx` opset imported into a graph that has none (see `_one_default_domain`); onnxruntime's int8
# operators need at least opset 10, and 13 is what skl2onnx targets by default for the operators it writes.
DEFAULT_DOMAIN_OPSET = 13


def _quiet_session_options() -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # onnxruntime's notes about removed initializers are not the user's concern
    return options


def save_graph_optimized(source: Path, destination: Path) -> None:
    """onnxruntime's *basic* graph optimizations (constant folding, redundant node removal), saved offline.

    Basic rewrites keep standard ONNX operators, so the file runs on every execution provider; the extended
    and layout levels write fused, provider-specific operators, which the serving runtime applies at load
    time anyway (`ORT_ENABLE_ALL`)."""
    import onnxruntime as ort

    options = _quiet_session_options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(destination)
    ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])


class _CalibrationReader:
    """`onnxruntime.quantization.CalibrationDataReader`: the calibration rows in batches."""

    def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
        self._batches: Iterator[dict[str, np.ndarray]] = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)

    def rewind(self) -> None:  # part of the reader interface; one pass is all the MinMax calibrator takes
        return None


def build_optimized(source: Path, method: Method, workdir: Path, calibration: Rows | None) -> Path:
    """The optimized model file for `method`, written under `workdir`."""
    output = workdir / "model.onnx"
    if method == "graph":
        save_graph_optimized(source, output)
        return output
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quant_pre_process, quantize_dynamic, quantize_static

    # Shape inference only: symbolic inference stops at ai.onnx.ml operators (Scaler, TreeEnsemble...), and
    # onnxruntime's pre-quantization rewrites can drop the Cast whose output type the quantizer needs after
    # such an operator. The graph optimizations run after quantization instead.
    inferred = workdir / "inferred.onnx"
    quant_pre_process(source, inferred, skip_optimization=True, skip_symbolic_shape=True)
    _one_default_domain(onnx, inferred)
    quantized = workdir / "quantized.onnx"
    # Tensors that follow an ai.onnx.ml operator have no inferred type; in these models they are float.
    extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    if method == "dynamic-int8":
        quantize_dynamic(inferred, quantized, weight_type=QuantType.QInt8, extra_options=extra)
    else:
        if calibration is None:
            raise ValueError("static-int8 needs calibration rows")
        batches = [
            {name: values[start : start + CALIBRATION_BATCH] for name, values in chunk.items()}
            for chunk in calibration.chunks
            for start in range(0, len(next(iter(chunk.values()))), CALIBRATION_BATCH)
        ]
        quantize_static(
            inferred,
            quantized,
            _CalibrationReader(batches),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            extra_options=extra,
        )
    save_graph_optimized(quantized, output)
    return output


def _one_default_domain(onnx: Any, path: Path) -> None:
    """The quantizer reads the model's `ai.onnx` opset and refuses a graph that imports it twice (skl2onnx 1.20
    writes a tree ensemble's graph so) or not at all (a graph of `ai.onnx.ml` operators alone may). One import,
    at the highest version listed, changes nothing for the nodes and lets the quantizer through."""
    model = onnx.load(str(path))
    default = [opset for opset in model.opset_import if opset.domain in ("", "ai.onnx")]
    if len(default) == 1:
        return
    version = max((opset.version for opset in default), default=DEFAULT_DOMAIN_OPSET)
    kept = [opset for opset in model.opset_import if opset.domain not in ("", "ai.onnx")]
    del model.opset_import[:]
    model.opset_import.extend([*kept, onnx.helper.make_opsetid("", version)])
    onnx.save(model, str(path))


def int8_weights(model_path: Path) -> tuple[int, list[str]]:
    """How many weight tensors (more than one element) are stored as int8/uint8, and the graph's operators."""
    import onnx

    model = onnx.load(str(model_path))
    eight_bit = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}
    count = sum(1 for t in model.graph.initializer if t.data_type in eight_bit and _elements(t.dims) > 1)
    return count, sorted({node.op_type for node in model.graph.node})


def _elements(dims: Sequence[int]) -> int:
    total = 1
    for size in dims:
        total *= size
    return total
