"""Multi-model cache hit vs single-model serving: what the cache costs on the hot path.

    .venv/bin/python -m bench.multi_model --runs 3 --duration-sec 5

Same container entry, same digits model, same 4-row sample request, server pinned to core 0
and wrk to core 1, 64 connections (bench/realtime.py's method). Single-model: `SERVESTACK_MODEL_DIR` is the
digits package, requests carry no target. Multi-model: a registry of 50 models (copies of digits), a budget
that fits 10, and requests that name a pre-warmed model in `X-Amzn-SageMaker-Target-Model` (all hits), or
rotate over a hot set of 5 resident models. Prints req/s and p99 per case, the median of --runs runs, and the
ratio; the goal is a cost of at most 5%. It never passes or fails on time.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import httpx

from bench.pairs import LoadResult, Payload, PinnedServer, median, wrk
from bench.subjects import ARTIFACT
from servestack.inference.registry import DirectoryStore, ModelRegistry
from servestack.local.hosting.processes import free_port

HOT_SET_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open(os.getenv("BODY_FILE"), "rb"); wrk.body = f:read("*a"); f:close()
local targets = {%s}
local i = 0
request = function()
  i = i + 1
  wrk.headers["X-Amzn-SageMaker-Target-Model"] = targets[(i %% #targets) + 1]
  return wrk.format()
end
"""


def server(port: int, env: dict[str, str]) -> PinnedServer:
    base = {"SAGEMAKER_BIND_TO_PORT": str(port), "SERVESTACK_HOST": "127.0.0.1", "SERVESTACK_WORKERS": "1"}
    return PinnedServer([".venv/bin/python", "-m", "servestack.adapters.realtime", "serve"], {**base, **env}, port)


def run_case(env: dict[str, str], script: Path, payload: Payload, runs: int, seconds: float) -> LoadResult:
    results = []
    for _ in range(runs):
        port = free_port()
        started = server(port, env)
        try:
            for name in ("m00", "m01", "m02", "m03", "m04"):  # make the hot set resident (no-op single-model)
                httpx.post(
                    f"http://127.0.0.1:{port}/invocations",
                    content=payload.body_file.read_bytes(),
                    headers={"Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": name},
                )
            wrk(f"http://127.0.0.1:{port}/invocations", 64, 1, payload, script)  # warm-up
            results.append(wrk(f"http://127.0.0.1:{port}/invocations", 64, seconds, payload, script))
        finally:
            started.stop()
    return LoadResult(
        median([r.requests_per_sec for r in results]),
        median([r.p50_ms for r in results]),
        median([r.p99_ms for r in results]),
        sum(r.non_2xx for r in results),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration-sec", type=float, default=5)
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-mme-") as tmp:
        scratch = Path(tmp)
        registry = ModelRegistry(DirectoryStore(scratch / "registry"))
        for index in range(50):
            registry.push(ARTIFACT / "model.onnx", name=f"m{index:02d}", version="1")
        payload = Payload("sample", ARTIFACT / "sample-request.json", "application/json", 4)
        plain = scratch / "plain.lua"
        plain.write_text(HOT_SET_SCRIPT % '"m00"')
        hot = scratch / "hot.lua"
        hot.write_text(HOT_SET_SCRIPT % ", ".join(f'"m0{i}"' for i in range(5)))
        single_script = scratch / "single.lua"
        single_script.write_text(
            'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            'local f = io.open(os.getenv("BODY_FILE"), "rb"); wrk.body = f:read("*a"); f:close()\n'
        )
        per_model = (ARTIFACT / "model.onnx").stat().st_size + 256 * 1024
        multi = {
            "SERVESTACK_REGISTRY_URI": str(scratch / "registry"),
            "SERVESTACK_CACHE_DIR": str(scratch / "cache"),
            "SERVESTACK_CACHE_BUDGET_BYTES": str(10 * per_model),
            "SERVESTACK_DEFAULT_MODEL": "m00",
            "SERVESTACK_PREWARM": "m00",
        }
        single = {"SERVESTACK_MODEL_DIR": str(ARTIFACT)}
        cases = {
            "single-model (no target)": run_case(single, single_script, payload, options.runs, options.duration_sec),
            "multi-model hit (1 target)": run_case(multi, plain, payload, options.runs, options.duration_sec),
            "multi-model hit (hot set of 5)": run_case(multi, hot, payload, options.runs, options.duration_sec),
        }
    baseline = cases["single-model (no target)"].requests_per_sec
    print(f"{'case':<34} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8} {'vs single':>10}")
    for name, result in cases.items():
        ratio = result.requests_per_sec / baseline
        print(
            f"{name:<34} {result.requests_per_sec:>9.0f} {result.p50_ms:>8.2f} {result.p99_ms:>8.2f} "
            f"{result.non_2xx:>8} {ratio:>9.1%}"
        )


if __name__ == "__main__":
    main()
