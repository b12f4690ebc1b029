"""What the realtime benches load: the servers (ours, the HTTP ceiling on the same server and interface, a naive
FastAPI server), each pinned to the server core, their payloads, and raw onnxruntime on the same arrays.

Two models: the digits MLP (models/artifacts/digits/1, one float input of 64 columns), and a scikit-learn
pipeline with a string column (tests/pipeline_model.py: a ColumnTransformer of four scaled numbers and a
one-hot `site`, string labels), which takes 32-row `dataframe_split` requests.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import IO

import numpy as np

from bench.pairs import SERVER_CORE, Payload, PinnedServer
from servestack.local.hosting.processes import REPO_ROOT

ARTIFACT = REPO_ROOT / "models" / "artifacts" / "digits" / "1"


def raw_onnxruntime_rows_per_sec(batch: int, seconds: float) -> float:
    """Rows/s of `session.run` alone, in a child pinned to the server core."""
    code = f"""
import time, numpy as np, onnxruntime as ort
o = ort.SessionOptions(); o.intra_op_num_threads = 1
s = ort.InferenceSession({str(ARTIFACT / "model.onnx")!r}, sess_options=o, providers=["CPUExecutionProvider"])
x = np.random.default_rng(0).random(({batch}, 64), dtype=np.float32) * 16
for _ in range(200): s.run(None, {{"input": x}})
n = 0; t = time.perf_counter()
while time.perf_counter() - t < {seconds}:
    s.run(None, {{"input": x}}); n += 1
print(n * {batch} / (time.perf_counter() - t))
"""
    out = subprocess.run(["taskset", "-c", SERVER_CORE, sys.executable, "-c", code], capture_output=True, text=True)
    return float(out.stdout.strip())


# The HTTP servers `serve` can run on (SERVESTACK_HTTP_SERVER); the first is its default.
HTTP_SERVERS = ("granian", "uvicorn")
DEFAULT_SERVER = HTTP_SERVERS[0]


def uvicorn_argv(app: str, port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", app, "--port", str(port), "--log-level", "warning", "--no-access-log"]


def granian_argv(app: str, port: int, interface: str = "rsgi") -> list[str]:
    """granian as `serve` runs it (servestack/adapters/realtime.py): RSGI, HTTP/1.1, no websockets, uvloop."""
    return [
        sys.executable, "-m", "granian", "--interface", interface, "--http", "1", "--no-ws", "--loop", "uvloop",
        "--port", str(port), "--log-level", "warning", app,
    ]  # fmt: skip


def interface(http_server: str) -> str:
    """How `serve` runs the app on `http_server` (servestack/adapters/realtime.py)."""
    return "granian RSGI" if http_server == "granian" else f"{http_server} ASGI"


def ours(
    port: int,
    http_server: str = DEFAULT_SERVER,
    extra_env: dict[str, str] | None = None,
    stdout: IO[bytes] | None = None,
) -> PinnedServer:
    env = {
        "SAGEMAKER_BIND_TO_PORT": str(port),
        "SERVESTACK_HOST": "127.0.0.1",
        "SERVESTACK_WORKERS": "1",
        "SERVESTACK_LOG_LEVEL": "warning",
        "SERVESTACK_HTTP_SERVER": http_server,
        **(extra_env or {}),
    }
    return PinnedServer([sys.executable, "-m", "servestack.adapters.realtime", "serve"], env, port, stdout=stdout)


def naive(port: int) -> PinnedServer:
    return PinnedServer(uvicorn_argv("bench.naive_server:app", port), {}, port)


def ceiling(port: int, http_server: str = DEFAULT_SERVER) -> PinnedServer:
    """The raw ceiling on the server and interface `serve` runs the app on: granian's RSGI, or uvicorn's ASGI."""
    if http_server == "granian":
        return PinnedServer(granian_argv("bench.ceiling_server:rsgi_app", port), {}, port)
    return PinnedServer(uvicorn_argv("bench.ceiling_server:app", port), {}, port)


def granian_asgi_ceiling(port: int) -> PinnedServer:
    """The raw ceiling of granian's ASGI interface: what the interface change is worth."""
    return PinnedServer(granian_argv("bench.ceiling_server:app", port, "asgi"), {}, port)


def payloads(scratch: Path) -> dict[str, Payload]:
    rows = np.asarray(json.loads((ARTIFACT / "sample-request.json").read_text())["instances"], dtype=np.float32)
    batch = np.tile(rows, (8, 1))[:32]
    single = scratch / "single.json"
    single.write_text(json.dumps({"instances": rows[:1].tolist()}))
    many = scratch / "batch32.json"
    many.write_text(json.dumps({"instances": batch.tolist()}))
    npy = scratch / "batch32.npy"
    buffer = io.BytesIO()
    np.save(buffer, batch)
    npy.write_bytes(buffer.getvalue())
    return {
        "single": Payload("1-row JSON", single, "application/json", 1),
        "json32": Payload("32-row JSON", many, "application/json", 32),
        "npy32": Payload("32-row npy", npy, "application/x-npy", 32),
    }


# 32-row `dataframe_split` requests to the pipeline, against raw onnxruntime on the same arrays at batch 32.
SPLIT_ROWS = 32


def split_payload(scratch: Path) -> tuple[Payload, Path, Path, Path]:
    """The request body, the pipeline's model directory and ONNX file, and its 32 rows by column (for the raw
    run), all from the same rows."""
    from tests.pipeline_model import COLUMNS, pipeline_model

    model = pipeline_model()
    columns = {name: (values * SPLIT_ROWS)[:SPLIT_ROWS] for name, values in model.rows.items()}
    body = scratch / "split32.json"
    data = [[columns[name][row] for name in COLUMNS] for row in range(SPLIT_ROWS)]
    body.write_text(json.dumps({"dataframe_split": {"columns": list(COLUMNS), "data": data}}))
    arrays = scratch / "split32-columns.json"
    arrays.write_text(json.dumps(columns))
    payload = Payload(f"{SPLIT_ROWS}-row split", body, "application/json", SPLIT_ROWS)
    return payload, model.root, model.onnx_file, arrays


def raw_pipeline_rows_per_sec(onnx_file: Path, columns_file: Path, seconds: float) -> float:
    """Rows/s of `session.run` on the pipeline's arrays (float32 and string `[32, 1]` columns), pinned as
    `raw_onnxruntime_rows_per_sec` is."""
    code = f"""
import json, time, numpy as np, onnxruntime as ort
o = ort.SessionOptions(); o.intra_op_num_threads = 1
s = ort.InferenceSession({str(onnx_file)!r}, sess_options=o, providers=["CPUExecutionProvider"])
columns = json.load(open({str(columns_file)!r}))
x = {{i.name: np.array(columns[i.name], dtype=object if i.type == "tensor(string)" else np.float32).reshape(-1, 1)
     for i in s.get_inputs()}}
for _ in range(200): s.run(None, x)
n = 0; t = time.perf_counter()
while time.perf_counter() - t < {seconds}:
    s.run(None, x); n += 1
print(n * {SPLIT_ROWS} / (time.perf_counter() - t))
"""
    out = subprocess.run(["taskset", "-c", SERVER_CORE, sys.executable, "-c", code], capture_output=True, text=True)
    return float(out.stdout.strip())


def pipeline_server(port: int, http_server: str, model_dir: Path) -> PinnedServer:
    """`ours`, serving the pipeline as its default model."""
    return ours(port, http_server, {"SERVESTACK_MODEL_DIR": str(model_dir), "SERVESTACK_DEFAULT_MODEL": "flowers"})
