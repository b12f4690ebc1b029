"""Realtime benchmark: raw onnxruntime vs our realtime server vs a naive FastAPI server, plus Lambda init.

    make bench            (or: .venv/bin/python -m bench.realtime --runs 3 --duration-sec 5)

The server is pinned to core 0 and wrk to core 1 (taskset); onnxruntime uses one intra-op thread. Every
figure is the median of --runs runs. Prints figures and ratios; it never passes or fails on time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servestack.local.processes import REPO_ROOT, free_port, http_status

SAMPLE = REPO_ROOT / "models" / "artifacts" / "digits" / "1" / "sample-request.json"
SERVER_CORE, LOAD_CORE = "0", "1"


@dataclass
class LoadResult:
    requests_per_sec: float
    p50_ms: float
    p99_ms: float
    non_2xx: int


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def raw_onnxruntime_rows_per_sec(batch: int, seconds: float) -> float:
    """Rows/s of `session.run` alone, in a child pinned to the server core."""
    code = f"""
import time, numpy as np, onnxruntime as ort
o = ort.SessionOptions(); o.intra_op_num_threads = 1
s = ort.InferenceSession({str(SAMPLE.parent / "model.onnx")!r}, sess_options=o, providers=["CPUExecutionProvider"])
x = np.random.default_rng(0).random(({batch}, 64), dtype=np.float32) * 16
for _ in range(200): s.run(None, {{"input": x}})
n = 0; t = time.perf_counter()
while time.perf_counter() - t < {seconds}:
    s.run(None, {{"input": x}}); n += 1
print(n * {batch} / (time.perf_counter() - t))
"""
    out = subprocess.run(["taskset", "-c", SERVER_CORE, sys.executable, "-c", code], capture_output=True, text=True)
    return float(out.stdout.strip())


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open(os.getenv("BODY_FILE"), "rb"); wrk.body = f:read("*a"); f:close()
"""


def wrk(url: str, connections: int, seconds: float, body_file: Path, script: Path) -> LoadResult:
    out = subprocess.run(
        [
            "taskset",
            "-c",
            LOAD_CORE,
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "BODY_FILE": str(body_file)},
        check=True,
    ).stdout

    def latency_ms(label: str) -> float:
        match = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
        assert match, out
        value, unit = float(match.group(1)), match.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    assert rps, out
    return LoadResult(float(rps.group(1)), latency_ms("50"), latency_ms("99"), int(non_2xx.group(1)) if non_2xx else 0)


class PinnedServer:
    def __init__(self, argv: list[str], env: dict[str, str], port: int) -> None:
        self.port = port
        self.process = subprocess.Popen(
            ["taskset", "-c", SERVER_CORE, *argv],
            cwd=REPO_ROOT,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while http_status(f"http://127.0.0.1:{port}/ping") not in (200, 404, 405):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"server {argv} did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)


def ours(port: int) -> PinnedServer:
    env = {
        "SAGEMAKER_BIND_TO_PORT": str(port),
        "SERVESTACK_HOST": "127.0.0.1",
        "SERVESTACK_WORKERS": "1",
        "SERVESTACK_LOG_LEVEL": "warning",
    }
    return PinnedServer([sys.executable, "-m", "handlers.realtime", "serve"], env, port)


def naive(port: int) -> PinnedServer:
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "bench.naive_server:app",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    return PinnedServer(argv, {}, port)


def lambda_init_sec(runs: int) -> list[float]:
    """Import of handlers.serverless (FastAPI app + Mangum + model load) in a fresh interpreter, .pyc present."""
    code = "import time; t = time.perf_counter(); import handlers.serverless; print('INIT', time.perf_counter() - t)"
    subprocess.run([sys.executable, "-m", "compileall", "-q", "handlers", "models"], cwd=REPO_ROOT, check=True)
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, check=True)  # warm the pyc/FS
    outputs = [
        (
            subprocess.run(
                ["taskset", "-c", SERVER_CORE, sys.executable, "-c", code],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        for _ in range(runs)
    ]
    return [float(out.rsplit("INIT ", 1)[1]) for out in outputs]


def measure(
    name: str,
    start: Callable[[int], PinnedServer],
    connections: list[int],
    runs: int,
    seconds: float,
    body_file: Path,
    script: Path,
) -> dict[int, LoadResult]:
    samples: dict[int, list[LoadResult]] = {c: [] for c in connections}
    for _ in range(runs):
        port = free_port()
        server = start(port)
        try:
            url = f"http://127.0.0.1:{port}/invocations"
            wrk(url, 8, 1, body_file, script)  # warm up
            for c in connections:
                samples[c].append(wrk(url, c, seconds, body_file, script))
        finally:
            server.stop()
    results = {
        c: LoadResult(
            median([r.requests_per_sec for r in rs]),
            median([r.p50_ms for r in rs]),
            median([r.p99_ms for r in rs]),
            sum(r.non_2xx for r in rs),
        )
        for c, rs in samples.items()
    }
    for c, r in results.items():
        print(
            f"  {name:<22} c={c:<3} {r.requests_per_sec:>9.0f} req/s  p50 {r.p50_ms:6.2f} ms  p99 {r.p99_ms:6.2f} ms"
            f"  non-2xx {r.non_2xx}",
            flush=True,
        )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration-sec", type=float, default=5.0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        sys.exit("bench needs wrk and taskset: apt-get install wrk util-linux")
    if len(os.sched_getaffinity(0)) < 2:
        print("warning: fewer than 2 cores; server and load generator will share a core", file=sys.stderr)

    row = json.loads(SAMPLE.read_text())["instances"][:1]
    with tempfile.TemporaryDirectory() as scratch:
        body_file, script = Path(scratch) / "body.json", Path(scratch) / "post.lua"
        body_file.write_text(json.dumps({"instances": row}))
        script.write_text(WRK_SCRIPT)

        print(f"runs={args.runs} duration={args.duration_sec}s; server on core {SERVER_CORE}, wrk on core {LOAD_CORE}")
        print("raw onnxruntime (one thread, one core):")
        raw = {b: median([raw_onnxruntime_rows_per_sec(b, 2.0) for _ in range(args.runs)]) for b in (1, 32, 128)}
        for batch, rows in raw.items():
            print(f"  batch {batch:<4} {rows:>10.0f} rows/s")
        print("HTTP, single-row JSON to /invocations:")
        ours_results = measure("servestack realtime", ours, [1, 64], args.runs, args.duration_sec, body_file, script)
        naive_results = measure("naive FastAPI", naive, [1, 64], args.runs, args.duration_sec, body_file, script)

    init = lambda_init_sec(max(args.runs, 5))
    print(
        f"Lambda init (import handlers.serverless + model load, .pyc present): median {median(init) * 1000:.0f} ms "
        f"over {len(init)} runs"
    )
    ratio = ours_results[64].requests_per_sec / naive_results[64].requests_per_sec
    print("ratios:")
    print(f"  ours / naive FastAPI at 64 connections: {ratio:.2f}x")
    print(
        f"  ours at 64 connections / raw onnxruntime batch 1: "
        f"{ours_results[64].requests_per_sec / raw[1]:.3f} (HTTP + codec cost dominates a small model)"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "raw_rows_per_sec": raw,
                    "ours": {c: vars(r) for c, r in ours_results.items()},
                    "naive": {c: vars(r) for c, r in naive_results.items()},
                    "lambda_init_sec": init,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
