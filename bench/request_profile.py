"""One prediction request's cost in process, for profilers: `RSGIApp.__rsgi__` itself (the RSGI glue, the app,
the batcher, the model, the answer) driven by 64 coroutines with a stand-in for granian's protocol (the body
handed over at once, the answer kept), on the digits model or the pipeline, no HTTP. What granian's Rust does
per request (parsing, the socket, waking the loop) is left out: this is the Python side of a request.

`--body split32` serves the scikit-learn pipeline (tests/pipeline_model.py) as the default model with the bench's
32-row `dataframe_split` body (bench/subjects.py `split_payload`).

Per request, as the difference between two run lengths (start-up, the first batches and the run's own set-up
cancel out):

    valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no --toggle-collect=functools_reduce \
        .venv/bin/python -m bench.request_profile --body npy32 --requests 2560 --callgrind

callgrind sees C functions only, not Python's, so `--callgrind` runs the measured requests inside
`functools.reduce` (its C function, `functools_reduce`, is what `--toggle-collect` names; nothing on the request
path calls it) and turns callgrind's instrumentation on only after the start-up and the warm-up (callgrind_control
on this process), which otherwise take minutes under valgrind.

or without valgrind, the CPU time per request (`--cpu`, the minimum of `--repeat` runs of each length).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import io
import json
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from bench.subjects import ARTIFACT

CONCURRENCY = 64


class StandInProtocol:
    """What `RSGIApp` uses of granian's `RSGIHTTPProtocol`: the body in one await, the answer in one call."""

    __slots__ = ("answer", "body")

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.answer: tuple[int, Any, bytes] | None = None

    async def __call__(self) -> bytes:
        return self.body

    def response_bytes(self, status: int, headers: Any, body: bytes) -> None:
        self.answer = (status, headers, body)


def bodies() -> dict[str, tuple[bytes, str, str]]:
    """The bench's bodies (bench/subjects.py `payloads`): name -> (body, content type, accept)."""
    rows = np.asarray(json.loads((ARTIFACT / "sample-request.json").read_text())["instances"], dtype=np.float32)
    batch = np.tile(rows, (8, 1))[:32]
    buffer = io.BytesIO()
    np.save(buffer, batch)
    return {
        "json1": (json.dumps({"instances": rows[:1].tolist()}).encode(), "application/json", "application/json"),
        "npy32": (buffer.getvalue(), "application/x-npy", "application/x-npy"),
    }


def split_body() -> tuple[bytes, str, str]:
    """The bench's 32-row `dataframe_split` body; the pipeline becomes the default model of `build_app`'s app."""
    from bench.subjects import split_payload

    with tempfile.TemporaryDirectory(prefix="request-profile-") as scratch:
        payload, model_dir, _, _ = split_payload(Path(scratch))
        body = payload.body_file.read_bytes()
    os.environ["SERVESTACK_MODEL_DIR"] = str(model_dir)  # as bench/subjects.py `pipeline_server` serves it
    os.environ["SERVESTACK_DEFAULT_MODEL"] = "flowers"
    return body, "application/json", "application/json"


def build_app() -> Any:
    """The app `serve` builds (bench/subjects.py `ours`: the bundled models, the digits model the default)."""
    from servestack.adapters.app import create_app
    from servestack.adapters.realtime import tune_collector
    from servestack.adapters.rsgi import RSGIApp
    from servestack.inference.service import ModelRepository
    from servestack.inference.settings import ServingSettings

    tune_collector()
    repository = ModelRepository(ServingSettings.from_environment())
    repository.load_all()
    return RSGIApp(create_app(repository))


async def serve(app: Any, body: bytes, content_type: str, accept: str, requests: int) -> None:
    """`requests` requests from CONCURRENCY coroutines, each sending its next request once answered."""
    headers = {"content-type": content_type, "accept": accept, "content-length": str(len(body))}
    scope = SimpleNamespace(proto="http", method="POST", path="/invocations", headers=headers)
    left = [requests]

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            protocol = StandInProtocol(body)
            await app.__rsgi__(scope, protocol)
            if protocol.answer is None or protocol.answer[0] != 200:
                raise RuntimeError(f"the app answered {protocol.answer}")

    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))


def measured(loop: asyncio.AbstractEventLoop, app: Any, body: bytes, content_type: str, accept: str, n: int) -> None:
    """The run callgrind collects (`--toggle-collect`)."""
    loop.run_until_complete(serve(app, body, content_type, accept, n))


def instrument_from_now() -> None:
    """Turn on callgrind's instrumentation of this process (started with `--instr-atstart=no`) and wait until
    callgrind has done it (it reads the command while this process runs, so wait without blocking in one call)."""
    control = subprocess.Popen(["callgrind_control", "--instr=on", str(os.getpid())], stdout=subprocess.DEVNULL)
    while control.poll() is None:
        time.sleep(0.01)
    if control.returncode != 0:
        raise RuntimeError(f"callgrind_control failed ({control.returncode}): is this run under callgrind?")


class _Constant:
    """The ceiling's app (bench/ceiling_server.py) in the driver's place: what the driver itself costs."""

    def __init__(self, app: Any, serving: Any) -> None:
        self.app, self.serving = app, serving

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.serving.__rsgi_init__(loop)

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        await self.app(scope, protocol)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--body", choices=("json1", "npy32", "split32"), default="json1")
    parser.add_argument("--requests", type=int, default=2560)
    parser.add_argument("--cpu", action="store_true", help="print CPU µs per request (difference of two lengths)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop, as granian's workers do")
    parser.add_argument(
        "--callgrind", action="store_true", help="under callgrind: instrument from the measured run on (see above)"
    )
    parser.add_argument("--ceiling", action="store_true", help="the constant app of bench/ceiling_server.py instead")
    args = parser.parse_args()
    body, content_type, accept = split_body() if args.body == "split32" else bodies()[args.body]
    app = build_app()
    if args.ceiling:
        from bench.ceiling_server import rsgi_app

        app = _Constant(rsgi_app, app)
    loop: asyncio.AbstractEventLoop
    if args.uvloop:
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    app.__rsgi_init__(loop)
    loop.run_until_complete(serve(app, body, content_type, accept, 512))  # warm: memos, first batches
    if args.callgrind:
        instrument_from_now()
        functools.reduce(lambda _, __: measured(loop, app, body, content_type, accept, args.requests), (0,), None)
        return
    if not args.cpu:
        measured(loop, app, body, content_type, accept, args.requests)
        return
    short, long = args.requests // 5, args.requests

    def cpu(n: int) -> float:
        before = resource.getrusage(resource.RUSAGE_SELF)
        measured(loop, app, body, content_type, accept, n)
        after = resource.getrusage(resource.RUSAGE_SELF)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    best = {short: float("inf"), long: float("inf")}
    started = time.perf_counter()
    for _ in range(args.repeat):
        for n in (short, long):
            best[n] = min(best[n], cpu(n))
    per_request = (best[long] - best[short]) / (long - short) * 1e6
    took = time.perf_counter() - started
    print(f"{args.body}: {per_request:.2f} CPU µs per request (min of {args.repeat}; {took:.1f} s)")


if __name__ == "__main__":
    main()
