"""What data capture costs a request: the HTTP app (servestack/adapters/app.py) in process, driven by raw ASGI
calls (no client, no socket: what is left is the app's own work), with capture off, at 100% (one log line per
request, written to /dev/null with the same single write(2) as to stdout) and at 10%.

    .venv/bin/python -m bench.capture_cost [--requests 5000] [--rows 1]

Prints the median and p99 time per request of each, and the difference; it never passes or fails on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

from servestack.adapters.app import ServingApp
from servestack.inference.service import ModelRepository
from servestack.inference.settings import BUNDLED_ARTIFACTS, ServingSettings


def make_app(capture: dict[str, Any] | None) -> ServingApp:
    setting = "" if capture is None else json.dumps({"deployment": "bench", "mode": "realtime"} | capture)
    repository = ModelRepository(ServingSettings(model_dir=BUNDLED_ARTIFACTS, capture=setting, reject_pause_ms=0))
    repository.load_all()
    app = ServingApp(repository)
    if app.capturer is not None:
        null = os.open(os.devnull, os.O_WRONLY)

        def write(line: bytes) -> None:
            os.write(null, line)

        app.capturer.write = write
    return app


async def timings(app: ServingApp, body: bytes, requests: int) -> list[float]:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/invocations",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    out: list[float] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200, message

    for _ in range(requests):
        start = time.perf_counter()
        await app(scope, receive, send)
        out.append(time.perf_counter() - start)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rows", type=int, default=1)
    args = parser.parse_args(argv)
    row = json.loads((BUNDLED_ARTIFACTS / "digits" / "1" / "sample-request.json").read_text())["instances"][0]
    body = json.dumps({"instances": [row] * args.rows}).encode()
    cases = {"off": None, "100%": {"sample_percent": 100}, "10%": {"sample_percent": 10}}
    apps = {name: make_app(capture) for name, capture in cases.items()}
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(3):  # interleaved rounds, so that drift of the machine touches every case alike
        for name, app in apps.items():
            results[name] += asyncio.run(timings(app, body, args.requests // 3))
    off = statistics.median(results["off"])
    for name, values in results.items():
        values.sort()
        median, p99 = statistics.median(values), values[int(len(values) * 0.99)]
        extra = (median - off) * 1e6
        print(f"capture {name:>4}: median {median * 1e6:7.1f} µs  p99 {p99 * 1e6:7.1f} µs  (+{extra:5.1f} µs)")


if __name__ == "__main__":
    main()
