"""The baseline a team writes on day one: FastAPI + pydantic request model + onnxruntime per request.

Run: uvicorn bench.naive_server:app (the benchmark starts it on its own core).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI
from pydantic import BaseModel

MODEL = Path(__file__).resolve().parent.parent / "models" / "artifacts" / "digits" / "1" / "model.onnx"

options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(str(MODEL), sess_options=options, providers=["CPUExecutionProvider"])
app = FastAPI()


class Request(BaseModel):
    instances: list[list[float]]


class Response(BaseModel):
    predictions: list[int]
    probabilities: list[list[float]]


@app.post("/invocations")
async def invocations(request: Request) -> Response:
    labels, probabilities = session.run(None, {"input": np.asarray(request.instances, dtype=np.float32)})
    return Response(predictions=labels.tolist(), probabilities=probabilities.tolist())
