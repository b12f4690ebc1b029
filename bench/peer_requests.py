"""The V2 inference protocol's requests and answers for the peers bench (bench/peers.py), and the feeds its
MLServer runtime (bench/mlserver_runtime.py) hands onnxruntime: plain Python and numpy, so that servestack's
environment builds and tests them without MLServer installed.

- `v2_tensor_request`: rows of one float input as one FP32 tensor (MLServer's default numpy codec).
- `v2_pandas_request`: rows by column under MLServer's pandas codec (`content_type` "pd"): one input per
  column, FP32 for numbers, BYTES for strings, as `PandasCodec.encode_request` writes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

PANDAS_CONTENT_TYPE = "pd"


def v2_tensor_request(rows: np.ndarray, name: str = "input") -> dict[str, Any]:
    return {"inputs": [{"name": name, "shape": list(rows.shape), "datatype": "FP32", "data": rows.ravel().tolist()}]}


def v2_pandas_request(columns: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    inputs = []
    for name, values in columns.items():
        strings = all(isinstance(value, str) for value in values)
        inputs.append(
            {"name": name, "shape": [len(values), 1], "datatype": "BYTES" if strings else "FP32", "data": list(values)}
        )
    return {"parameters": {"content_type": PANDAS_CONTENT_TYPE}, "inputs": inputs}


def v2_first_output(answer: Mapping[str, Any]) -> list[Any]:
    """The data of a V2 answer's first output (the runtime answers the model's first output alone)."""
    return list(answer["outputs"][0]["data"])


def column_feeds(inputs: Iterable[tuple[str, str]], columns: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """onnxruntime's feeds for a model with one `[None, 1]` input per column (skl2onnx's form of a
    ColumnTransformer): `inputs` are the session's (name, type) pairs; strings stay Python objects, as
    onnxruntime takes them, and numbers become float32."""
    return {
        name: np.asarray(columns[name], dtype=object if kind == "tensor(string)" else np.float32).reshape(-1, 1)
        for name, kind in inputs
    }
