"""A large SageMaker async job through the container as SageMaker runs it (`serve`: granian, one worker), with the
environment the async construct gives it (servestack/cdk/realtime.py `engine_environment`), and the serving
worker's peak memory (VmHWM: the most resident memory it ever held, file-backed pages of the spooled body
included) read from /proc when the answer is in.

    .venv/bin/python bench/async_large_job.py --megabytes 200
"""

from __future__ import annotations

import argparse
import http.client
import io
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from servestack.aws_rules import SAGEMAKER_ASYNC
from servestack.cdk.realtime import engine_environment

REPO = Path(__file__).resolve().parents[1]
FEATURES = 30  # breast-cancer: float32 x 30 per row


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise LookupError(field)


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--megabytes", type=int, default=200)
    options = parser.parse_args()
    rows = options.megabytes * 1_000_000 // (4 * FEATURES)
    features = np.random.default_rng(38).normal(10.0, 5.0, size=(rows, FEATURES)).astype(np.float32)
    stream = io.BytesIO()
    np.save(stream, features)
    body = stream.getvalue()
    del features, stream
    port = free_port()
    env = (
        os.environ
        | engine_environment(SAGEMAKER_ASYNC, SAGEMAKER_ASYNC.max_payload_bytes)
        | {
            "SERVESTACK_MODEL_DIR": str(REPO / "models" / "artifacts"),
            "SERVESTACK_DEFAULT_MODEL": "breast-cancer",
            "SERVESTACK_PROVIDERS": "CPUExecutionProvider",
            "SAGEMAKER_BIND_TO_PORT": str(port),
            "SAGEMAKER_MODEL_SERVER_WORKERS": "1",
            "SERVESTACK_LOG_LEVEL": "warning",
        }
    )
    server = subprocess.Popen([sys.executable, "-m", "servestack.adapters.realtime"], env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/ping")
                if connection.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the container did not become ready")
            time.sleep(0.2)
        (worker,) = children(server.pid)
        ready_kib = memory_kib(worker, "VmHWM")
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=SAGEMAKER_ASYNC.timeout_sec)
        started = time.perf_counter()
        connection.request(
            "POST", "/invocations", body=body,
            headers={"Content-Type": "application/x-npy", "Accept": "application/x-npy"},
        )  # fmt: skip
        answer = connection.getresponse()
        content = answer.read()
        elapsed = time.perf_counter() - started
        peak_kib = memory_kib(worker, "VmHWM")
        labels = np.load(io.BytesIO(content)) if answer.status == 200 else None
        print(f"payload: {len(body):,} bytes ({rows:,} rows of {FEATURES} float32), .npy")
        shape = getattr(labels, "shape", None)
        print(f"answer: {answer.status}, {len(content):,} bytes, {elapsed:.1f} s, labels {shape}")
        print(f"serving worker {worker}: VmHWM {ready_kib / 1024:.0f} MiB when ready, {peak_kib / 1024:.0f} MiB peak")
        print(f"peak / payload: {peak_kib * 1024 / len(body):.2f}")
        return 0 if answer.status == 200 and peak_kib * 1024 < 3 * len(body) else 1
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
