"""Realtime benchmark, one run, same model and payloads: raw onnxruntime, the HTTP ceiling (a raw app
returning a constant, on the same HTTP server and interface as ours: granian's RSGI, or uvicorn's ASGI), a
naive FastAPI + onnxruntime server (uvicorn, as its users run it), and ours; then overload and Lambda init;
last, issue 13's table with its ratios, and issue 23's row (32-row `dataframe_split` requests to a pipeline
with a string column, against raw onnxruntime on the same arrays). The HTTP server comparison (uvicorn vs
granian) is bench/servers.py. Every request asks for its answer in its own media type (`Accept` =
`Content-Type`): `.npy` in, `.npy` out.

    make bench            (or: .venv/bin/python -m bench.realtime --runs 3 --duration-sec 5)

Servers are pinned to core 0, load generators to core 1 (taskset); onnxruntime uses one intra-op thread.
Throughput and latency come from wrk; the overload run uses servestack's own load generator, which splits
latency by status. Every figure is the median of --runs runs. The two ratios against a ceiling (ours vs the
raw HTTP ceiling, `.npy` vs raw onnxruntime) are also measured in --pairs interleaved pairs of short slices,
which a noisy machine disturbs less. It prints figures and ratios; it never passes or fails on time.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servestack.local.hosting.processes import REPO_ROOT, free_port, http_status

ARTIFACT = REPO_ROOT / "models" / "artifacts" / "digits" / "1"
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


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = os.getenv("CONTENT_TYPE")
wrk.headers["Accept"] = os.getenv("CONTENT_TYPE")
local f = io.open(os.getenv("BODY_FILE"), "rb"); wrk.body = f:read("*a"); f:close()
"""


@dataclass(frozen=True)
class Payload:
    name: str
    body_file: Path
    content_type: str
    rows: int


# After each wrk run, before the next phase: wrk closes its connections with requests still queued in the worker,
# which finishes them (nobody reads the answers). Those count against the worker's 64 request slots, so a phase
# started at once met a full worker: a few 429s after a 1 s pause, which made the next phase's p99 about 1 s.
SETTLE_SEC = 0.3


def wrk(url: str, connections: int, seconds: float, payload: Payload, script: Path) -> LoadResult:
    """One wrk run of `seconds` on the load core, then `SETTLE_SEC` for the worker to finish what it left."""
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
        check=True,
        env={**os.environ, "BODY_FILE": str(payload.body_file), "CONTENT_TYPE": payload.content_type},
    ).stdout
    time.sleep(SETTLE_SEC)

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

    def rss_mib(self) -> float:
        # taskset execs the server, so the pid is the server's own.
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        match = re.search(r"VmRSS:\s+(\d+) kB", status)
        return int(match.group(1)) / 1024 if match else float("nan")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)


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


def ours(port: int, http_server: str = DEFAULT_SERVER, extra_env: dict[str, str] | None = None) -> PinnedServer:
    env = {
        "SAGEMAKER_BIND_TO_PORT": str(port),
        "SERVESTACK_HOST": "127.0.0.1",
        "SERVESTACK_WORKERS": "1",
        "SERVESTACK_LOG_LEVEL": "warning",
        "SERVESTACK_HTTP_SERVER": http_server,
        **(extra_env or {}),
    }
    return PinnedServer([sys.executable, "-m", "servestack.adapters.realtime", "serve"], env, port)


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


def measure(
    name: str,
    start: Callable[[int], PinnedServer],
    cases: list[tuple[Payload, int]],
    path: str,
    runs: int,
    seconds: float,
    script: Path,
) -> dict[tuple[str, int], LoadResult]:
    samples: dict[tuple[str, int], list[LoadResult]] = {(p.name, c): [] for p, c in cases}
    for _ in range(runs):
        port = free_port()
        server = start(port)
        try:
            url = f"http://127.0.0.1:{port}{path}"
            wrk(url, 8, 1, cases[0][0], script)  # warm up
            for payload, connections in cases:
                samples[(payload.name, connections)].append(wrk(url, connections, seconds, payload, script))
        finally:
            server.stop()
    results = {}
    for (payload_name, connections), found in samples.items():
        result = LoadResult(
            median([r.requests_per_sec for r in found]),
            median([r.p50_ms for r in found]),
            median([r.p99_ms for r in found]),
            sum(r.non_2xx for r in found),
        )
        results[(payload_name, connections)] = result
        rows = next(p.rows for p, _ in cases if p.name == payload_name)
        print(
            f"  {name:<20} {payload_name:<16} c={connections:<3} {result.requests_per_sec:>8.0f} req/s "
            f"{result.requests_per_sec * rows:>9.0f} rows/s  p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms"
            f"  non-2xx {result.non_2xx}",
            flush=True,
        )
    return results


def ok_per_sec(result: LoadResult, seconds: float) -> float:
    """wrk's 2xx rate: all requests per second less the non-2xx ones (wrk counts those over whole seconds)."""
    return result.requests_per_sec - result.non_2xx / max(1, round(seconds))


def overload(
    payload: Payload, seconds: float, http_server: str = DEFAULT_SERVER, script: Path | None = None
) -> dict[str, Any]:
    """512 connections for `seconds` against one worker, measured by servestack's load generator on core 1
    (which splits latency by status); then, with `script`, the same with wrk, a C client that does not itself
    become the bottleneck: its connections retry at once, and 2xx/s = all/s - non-2xx/s."""
    port = free_port()
    server = ours(port, http_server)
    code = (
        "import json, sys; from servestack.loadtest.driver import Target, run; "
        f"t = Target.from_url('http://127.0.0.1:{port}/invocations', open({str(payload.body_file)!r}, 'rb').read(), "
        f"{payload.content_type!r}); "
        "warm, _ = run(t, duration_sec=3, concurrency=8); "
        f"base, _ = run(t, duration_sec={seconds / 2}, concurrency=64); "
        f"over, _ = run(t, duration_sec={seconds}, concurrency=512, timeout_sec=10); "
        f"polite, _ = run(t, duration_sec={seconds / 2}, concurrency=512, timeout_sec=10, honour_retry_after=True); "
        f"after, _ = run(t, duration_sec={seconds / 2}, concurrency=64); "
        "print(json.dumps({'base': base.__dict__, 'over': over.__dict__, 'polite': polite.__dict__, "
        "'after': after.__dict__}))"
    )
    rss: list[float] = []
    stop = threading.Event()

    def sample_rss() -> None:
        while not stop.wait(0.5):
            rss.append(server.rss_mib())

    try:
        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        out = subprocess.run(
            ["taskset", "-c", LOAD_CORE, sys.executable, "-c", code],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        stop.set()
        sampler.join()
        if script is not None:
            url = f"http://127.0.0.1:{port}/invocations"
            wrk_base = wrk(url, 64, seconds / 2, payload, script)
            wrk_over = wrk(url, 512, seconds, payload, script)
            wrk_after = wrk(url, 64, seconds / 2, payload, script)
    finally:
        server.stop()
    figures = json.loads(out.strip().splitlines()[-1])
    base, over, polite, after = figures["base"], figures["over"], figures["polite"], figures["after"]
    # Nominal is measured just before and again just after the overload phases, and the two averaged: on a
    # shared machine the rate drifts by several percent within a minute, and one side alone would charge
    # that drift to the overload.
    nominal_qps = (base["ok_qps"] + after["ok_qps"]) / 2
    nominal_p99 = (base["ok_latency_ms"]["p99"] + after["ok_latency_ms"]["p99"]) / 2
    # RSS at the end of the first 64-connection phase vs the range seen during the overload phases.
    phases = (3, seconds / 2, seconds, seconds / 2, seconds / 2)  # warm-up, base, over, polite, after
    split = max(1, int(len(rss) * sum(phases[:2]) / sum(phases)))
    end = max(split + 1, int(len(rss) * sum(phases[:4]) / sum(phases)))
    before = rss[split - 1]
    during = rss[split:end] or [before]
    wrk_figures = (
        {
            "wrk_base_qps": sum(ok_per_sec(result, seconds / 2) for result in (wrk_base, wrk_after)) / 2,
            "wrk_over_ok_qps": ok_per_sec(wrk_over, seconds),
            "wrk_over_non_2xx_per_sec": wrk_over.non_2xx / max(1, round(seconds)),
        }
        if script is not None
        else {}
    )
    shares = {  # this run's own ratios; overload_median reports their medians
        "over_share": over["ok_qps"] / nominal_qps,
        "over_p99x": over["ok_latency_ms"].get("p99", float("nan")) / nominal_p99,
        "polite_share": polite["ok_qps"] / nominal_qps,
        "polite_p99x": polite["ok_latency_ms"].get("p99", float("nan")) / nominal_p99,
    }
    if wrk_figures:
        shares["wrk_share"] = wrk_figures["wrk_over_ok_qps"] / wrk_figures["wrk_base_qps"]
    return {
        **wrk_figures,
        **shares,
        "base_qps": nominal_qps,
        "base_p99_ms": nominal_p99,
        "base_before_qps": base["ok_qps"],
        "base_after_qps": after["ok_qps"],
        "over_ok_qps": over["ok_qps"],
        "over_ok_p99_ms": over["ok_latency_ms"].get("p99", float("nan")),
        "over_statuses": over["statuses"],
        "over_errors": over["errors"],
        "retry_after_seen": over["retry_after_seen"],
        "rss_before_mib": before,
        "rss_min_mib": min(during),
        "rss_max_mib": max(during),
        "polite_ok_qps": polite["ok_qps"],
        "polite_ok_p99_ms": polite["ok_latency_ms"].get("p99", float("nan")),
        "polite_statuses": polite["statuses"],
        "polite_errors": polite["errors"],
    }


def overload_median(
    payload: Payload, seconds: float, runs: int, http_server: str = DEFAULT_SERVER, script: Path | None = None
) -> dict[str, Any]:
    """`overload` `runs` times: the median of every figure, the statuses and errors of all runs summed."""
    samples = [overload(payload, seconds, http_server, script) for _ in range(runs)]
    merged: dict[str, Any] = {}
    for key, first in samples[0].items():
        if isinstance(first, dict):
            total: dict[str, int] = {}
            for sample in samples:
                for name, count in (sample[key] or {}).items():
                    total[name] = total.get(name, 0) + count
            merged[key] = total
        else:
            merged[key] = median([float(sample[key]) for sample in samples])
    return merged


@dataclass(frozen=True)
class RunFigures:
    """One run's figures, all measured back to back."""

    raw: dict[int, float]
    ceil: dict[tuple[str, int], LoadResult]
    asgi: dict[tuple[str, int], LoadResult]
    base: dict[tuple[str, int], LoadResult]
    mine: dict[tuple[str, int], LoadResult]


def merged(results: list[dict[tuple[str, int], LoadResult]]) -> dict[tuple[str, int], LoadResult]:
    """Per case, the median of each figure over the runs (non-2xx summed)."""
    out = {}
    for key in results[0]:
        found = [r[key] for r in results]
        out[key] = LoadResult(
            median([r.requests_per_sec for r in found]),
            median([r.p50_ms for r in found]),
            median([r.p99_ms for r in found]),
            sum(r.non_2xx for r in found),
        )
    return out


INTERLEAVED_SLICE_SEC = 2.0


def interleaved_ratios(
    single: Payload, npy: Payload, http_server: str, script: Path, pairs: int, slice_sec: float = INTERLEAVED_SLICE_SEC
) -> dict[str, list[float]]:
    """The two ratios against a ceiling, measured in short interleaved slices with both servers up: on a shared
    machine the rate moves by a fifth from one second to the next, so figures taken half a minute apart (as in
    a run) carry that noise into their ratio. Each pair puts one slice of ours next to one of the ceiling (the
    order alternating, so a trend within a pair favours neither) and one `.npy` slice next to raw onnxruntime."""
    ports = free_port(), free_port()
    servers = ceiling(ports[0], http_server), ours(ports[1], http_server)
    ratios: dict[str, list[float]] = {"ceiling": [], "npy_raw": []}
    try:
        ceiling_url, ours_url = (f"http://127.0.0.1:{port}/invocations" for port in ports)
        for url in (ceiling_url, ours_url):
            wrk(url, 8, 1, single, script)  # warm up
        for pair in range(pairs):
            order = (ceiling_url, ours_url) if pair % 2 == 0 else (ours_url, ceiling_url)
            rates = {url: wrk(url, 64, slice_sec, single, script).requests_per_sec for url in order}
            ratios["ceiling"].append(rates[ours_url] / rates[ceiling_url])
            measures: dict[str, Callable[[], float]] = {
                "raw": lambda: raw_onnxruntime_rows_per_sec(32, slice_sec),
                "ours": lambda: wrk(ours_url, 64, slice_sec, npy, script).requests_per_sec * npy.rows,
            }
            slices = {name: measures[name]() for name in (("raw", "ours") if pair % 2 == 0 else ("ours", "raw"))}
            raw, rows = slices["raw"], slices["ours"]
            ratios["npy_raw"].append(rows / raw)
            print(
                f"  pair {pair + 1}: 1-row {rates[ours_url]:.0f} vs ceiling {rates[ceiling_url]:.0f} req/s = "
                f"{ratios['ceiling'][-1]:.2f}; .npy {rows:.0f} vs raw {raw:.0f} rows/s = {ratios['npy_raw'][-1]:.2f}",
                flush=True,
            )
    finally:
        for server in servers:
            server.stop()
    return ratios


def median_ratios(runs: list[RunFigures]) -> dict[str, float]:
    """Each ratio taken within a run, then the median over the runs."""
    single = ("1-row JSON", 64)
    per_run: dict[str, list[float]] = {"naive": [], "ceiling": [], "npy_raw": [], "asgi_ceiling": []}
    for run in runs:
        ours_qps = run.mine[single].requests_per_sec
        per_run["naive"].append(ours_qps / run.base[single].requests_per_sec)
        per_run["ceiling"].append(ours_qps / run.ceil[single].requests_per_sec)
        per_run["npy_raw"].append(run.mine[("32-row npy", 64)].requests_per_sec * 32 / run.raw[32])
        if run.asgi:
            per_run["asgi_ceiling"].append(ours_qps / run.asgi[single].requests_per_sec)
    return {name: median(values) for name, values in per_run.items() if values}


def print_issue13_table(
    raw: dict[int, float],
    mine: dict[tuple[str, int], LoadResult],
    ratios: dict[str, float],
    over: dict[str, Any],
    http_server: str = DEFAULT_SERVER,
) -> None:
    """Issue 13's table: figures are medians over the runs, ratios the medians of each run's own ratios
    (targets in brackets; the bench never passes or fails)."""
    s64 = mine[("1-row JSON", 64)]
    npy_rows = mine[("32-row npy", 64)].requests_per_sec * 32
    print(f"issue 13 table (servestack on {interface(http_server)}, one server core; targets in brackets):")
    print("| path | this run |")
    print("| --- | --- |")
    asgi = f" ({ratios['asgi_ceiling']:.2f} of granian's ASGI ceiling)" if "asgi_ceiling" in ratios else ""
    print(
        f"| 1-row JSON, 64 connections | {s64.requests_per_sec:.0f} req/s = {ratios['naive']:.2f}x naive FastAPI "
        f"[>= 3x]; {ratios['ceiling']:.2f} of the raw ceiling on {interface(http_server)}{asgi} "
        f"(interleaved: {ratios['ceiling_interleaved']:.2f}) [>= 0.6]; "
        f"p99 {s64.p99_ms:.2f} ms |"
    )
    print(
        f"| 32-row `.npy` per request, 64 connections | {npy_rows:.0f} rows/s = {ratios['npy_raw']:.2f} of raw "
        f"onnxruntime at batch 32 ({raw[32]:.0f} rows/s; interleaved: {ratios['npy_raw_interleaved']:.2f}) "
        "[>= 0.4] |"
    )
    for label, prefix in (("retrying at once", "over"), ("honouring Retry-After", "polite")):
        statuses = over[f"{prefix}_statuses"]
        fives = sum(count for status, count in statuses.items() if status.startswith("5"))
        print(
            f"| 512 connections {label} (8x overload) | 2xx throughput "
            f"{over[f'{prefix}_share']:.2f} of nominal [>= 0.9]; admitted p99 "
            f"{over[f'{prefix}_p99x']:.2f}x nominal [<= 3]; 5xx {fives}, "
            f"errors/timeouts {sum((over[f'{prefix}_errors'] or {}).values())} |"
        )
    if "wrk_base_qps" in over:
        print(
            f"| 512 wrk connections retrying at once (C client) | 2xx throughput "
            f"{over['wrk_share']:.2f} of nominal (wrk, 64 connections) [>= 0.9]; "
            f"{over['wrk_over_non_2xx_per_sec']:.0f} refusals/s |"
        )
    print("| batch job, 1M rows | printed by bench/batch_job.py (next in `make bench`) |")
    print(
        "  nominal = the same worker at 64 connections, just before and just after (their mean); "
        "bench/servers.py compares HTTP servers"
    )


def lambda_init_sec(module: str, runs: int) -> list[float]:
    """Import of a Lambda handler module (model load included) in a fresh interpreter, .pyc present."""
    code = f"import time; t = time.perf_counter(); import {module}; print('INIT', time.perf_counter() - t)"
    subprocess.run([sys.executable, "-m", "compileall", "-q", "servestack", "bench"], cwd=REPO_ROOT, check=True)
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, check=True)  # warm the FS cache
    outputs = [
        subprocess.run(
            ["taskset", "-c", SERVER_CORE, sys.executable, "-c", code],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for _ in range(runs)
    ]
    return [float(out.rsplit("INIT ", 1)[1]) for out in outputs]


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


# ------------------------------------------------------------------------------------------ issue 23's row
# 32-row `dataframe_split` requests to a scikit-learn pipeline with a string column (tests/pipeline_model.py: four
# scaled numbers and a one-hot `site`, string labels), against raw onnxruntime on the same arrays at batch 32.
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


def split_row(scratch: Path, script: Path, runs: int, seconds: float, http_server: str) -> dict[str, Any]:
    """Per run, raw onnxruntime on the arrays, the HTTP stack's ceiling on the same body (the constant app of
    bench/ceiling_server.py: the most any app on this server and interface could show), then ours, each at 64
    connections (the two servers up for every run); the ratios of each run, and their medians. A server that
    refuses the form (a tree without the tabular request forms) is reported, not measured."""
    import httpx

    payload, model_dir, onnx_file, columns_file = split_payload(scratch)
    port, ceiling_port = free_port(), free_port()
    server = pipeline_server(port, http_server, model_dir)
    constant = ceiling(ceiling_port, http_server)
    try:
        url = f"http://127.0.0.1:{port}/invocations"
        ceiling_url = f"http://127.0.0.1:{ceiling_port}/invocations"
        probe = httpx.post(url, content=payload.body_file.read_bytes(), headers={"Content-Type": payload.content_type})
        if probe.status_code != 200:
            return {"refused": f"{probe.status_code} {probe.text[:300]}"}
        wrk(url, 8, 1, payload, script)  # warm up
        wrk(ceiling_url, 8, 1, payload, script)
        raw, top, ours_rows, non_2xx = [], [], [], 0
        for run in range(runs):
            raw.append(raw_pipeline_rows_per_sec(onnx_file, columns_file, 2.0))
            top.append(wrk(ceiling_url, 64, seconds, payload, script).requests_per_sec * SPLIT_ROWS)
            result = wrk(url, 64, seconds, payload, script)
            ours_rows.append(result.requests_per_sec * SPLIT_ROWS)
            non_2xx += result.non_2xx
            print(
                f"  run {run + 1}: {payload.name} {ours_rows[-1]:.0f} rows/s (p50 {result.p50_ms:.2f} ms, "
                f"p99 {result.p99_ms:.2f} ms) vs raw onnxruntime {raw[-1]:.0f} rows/s = "
                f"{ours_rows[-1] / raw[-1]:.2f}; the HTTP ceiling {top[-1]:.0f} rows/s = {top[-1] / raw[-1]:.2f} "
                f"of raw, ours {ours_rows[-1] / top[-1]:.2f} of it",
                flush=True,
            )
    finally:
        server.stop()
        constant.stop()
    ratios = [mine / base for mine, base in zip(ours_rows, raw, strict=True)]
    bound = [most / base for most, base in zip(top, raw, strict=True)]
    of_ceiling = [mine / most for mine, most in zip(ours_rows, top, strict=True)]
    return {
        "raw": raw, "ceiling": top, "ours": ours_rows, "ratios": ratios, "ratio": median(ratios),
        "ceiling_ratios": bound, "ceiling_ratio": median(bound), "of_ceiling": median(of_ceiling), "non_2xx": non_2xx,
    }  # fmt: skip


def print_split_row(row: dict[str, Any]) -> None:
    """Issue 23's row, in the table's style (the median of the runs' own ratios; target in brackets), and the
    HTTP stack's own bound on it: the constant app's rows/s on the same body, as a ratio of raw."""
    print("| path | this run |")
    print("| --- | --- |")
    if "refused" in row:
        print(f"| 32-row `dataframe_split`, pipeline with a string column | not measured: the server answers "
              f"{row['refused']} |")  # fmt: skip
        return
    print(
        f"| 32-row `dataframe_split` per request (pipeline with a string column), 64 connections | "
        f"{median(row['ours']):.0f} rows/s = {row['ratio']:.2f} of raw onnxruntime at batch 32 on the same "
        f"arrays ({median(row['raw']):.0f} rows/s) [>= 0.35]; {row['of_ceiling']:.2f} of the HTTP ceiling; "
        f"non-2xx {row['non_2xx']} |"
    )
    print(
        f"| the HTTP ceiling: a constant answer to the same 32-row body, 64 connections | "
        f"{median(row['ceiling']):.0f} rows/s = {row['ceiling_ratio']:.2f} of raw: no app on this server can "
        "show more |"
    )


def split_only(scratch: Path, script: Path, args: argparse.Namespace) -> None:
    """`--only split`: issue 23's row alone (and in `--json`, its figures alone)."""
    print(
        f"{SPLIT_ROWS}-row dataframe_split to a pipeline with a string column (one server, {args.runs} runs, "
        "raw onnxruntime on the same arrays before each):"
    )
    split = split_row(scratch, script, args.runs, args.duration_sec, args.http_server)
    print(f"issue 23 row (servestack on {interface(args.http_server)}, one server core; target in brackets):")
    print_split_row(split)
    if args.json:
        args.json.write_text(json.dumps({"dataframe_split_32": split}, indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration-sec", type=float, default=5.0)
    parser.add_argument("--overload-sec", type=float, default=10.0, help="each overload phase; --runs of them")
    parser.add_argument(
        "--pairs", type=int, default=7, help="interleaved slice pairs for the ratios against the ceilings"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--http-server",
        choices=HTTP_SERVERS,
        default=DEFAULT_SERVER,
        help="the server for ours and the ceiling (serve's SERVESTACK_HTTP_SERVER); naive FastAPI stays on uvicorn",
    )
    parser.add_argument(
        "--only",
        choices=("all", "split"),
        default="all",
        help="'split': only issue 23's row (32-row dataframe_split to the pipeline), for work on that path",
    )
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        sys.exit("bench needs wrk and taskset: apt-get install wrk util-linux")
    if len(os.sched_getaffinity(0)) < 2:
        print("warning: fewer than 2 cores; server and load generator will share a core", file=sys.stderr)

    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        script = scratch / "post.lua"
        script.write_text(WRK_SCRIPT)
        if args.only == "split":
            split_only(scratch, script, args)
            return
        p = payloads(scratch)
        print(
            f"runs={args.runs} duration={args.duration_sec}s; servers on core {SERVER_CORE}, load on core {LOAD_CORE}"
        )
        single = p["single"]
        # Each run measures everything back to back (raw onnxruntime, the ceilings, naive, ours), so a ratio is
        # taken between figures of one moment, and the ratios reported are medians over the runs: a shared
        # machine's load drifts over minutes.
        runs: list[RunFigures] = []
        for run in range(args.runs):
            print(f"run {run + 1} of {args.runs}:", flush=True)
            raw_run = {b: raw_onnxruntime_rows_per_sec(b, 2.0) for b in (1, 32, 128)}
            print("  raw onnxruntime (one thread, one core): " + ", ".join(
                f"batch {b} {rows:.0f} rows/s" for b, rows in raw_run.items()
            ), flush=True)  # fmt: skip
            ceil_run = measure(
                f"raw constant ({interface(args.http_server)})",
                lambda port: ceiling(port, args.http_server),
                [(single, 64)],
                "/invocations",
                1,
                args.duration_sec,
                script,
            )
            asgi_run = (  # what RSGI is worth against granian's own ASGI
                measure("raw constant (granian ASGI)", granian_asgi_ceiling, [(single, 64)], "/invocations", 1,
                        args.duration_sec, script)
                if args.http_server == "granian"
                else {}
            )  # fmt: skip
            base_run = measure(
                "naive FastAPI", naive, [(single, 1), (single, 64)], "/invocations", 1, args.duration_sec, script
            )
            mine_run = measure(
                "servestack",
                lambda port: ours(port, args.http_server),
                [(single, 1), (single, 64), (p["json32"], 64), (p["npy32"], 64)],
                "/invocations",
                1,
                args.duration_sec,
                script,
            )
            runs.append(RunFigures(raw_run, ceil_run, asgi_run, base_run, mine_run))
        raw = {b: median([r.raw[b] for r in runs]) for b in (1, 32, 128)}
        ceil, base, mine = (merged([getattr(r, part) for r in runs]) for part in ("ceil", "base", "mine"))
        print(f"medians of {args.runs} runs:")
        print("  raw onnxruntime: " + ", ".join(f"batch {b} {rows:.0f} rows/s" for b, rows in raw.items()))
        for name, results in (("ceiling", ceil), ("naive FastAPI", base), ("servestack", mine)):
            for (payload_name, connections), result in results.items():
                print(
                    f"  {name:<20} {payload_name:<16} c={connections:<3} {result.requests_per_sec:>8.0f} req/s  "
                    f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  non-2xx {result.non_2xx}"
                )
        print(
            f"interleaved ({args.pairs} pairs of {INTERLEAVED_SLICE_SEC:g}s slices, the ceiling and ours both up, "
            "order alternating):"
        )
        paired = interleaved_ratios(single, p["npy32"], args.http_server, script, args.pairs)
        print(
            f"overload (servestack load generator, 512 connections for {args.overload_sec:g}s, one worker, "
            f"median of {args.runs}):"
        )
        over = overload_median(single, args.overload_sec, args.runs, args.http_server, script)
        print(f"  64 connections first: {over['base_qps']:.0f} req/s 2xx, p99 {over['base_p99_ms']:.2f} ms")
        print(
            f"  512 connections: {over['over_ok_qps']:.0f} req/s 2xx, 2xx p99 {over['over_ok_p99_ms']:.2f} ms; "
            f"statuses {over['over_statuses']}; errors/timeouts {over['over_errors'] or 0}; "
            f"429s with Retry-After {over['retry_after_seen']}"
        )
        print(
            f"  512 connections honouring Retry-After: {over['polite_ok_qps']:.0f} req/s 2xx, "
            f"2xx p99 {over['polite_ok_p99_ms']:.2f} ms; statuses {over['polite_statuses']}; "
            f"errors/timeouts {over['polite_errors'] or 0}"
        )
        print(
            f"  RSS {over['rss_before_mib']:.1f} MiB before, {over['rss_min_mib']:.1f}..{over['rss_max_mib']:.1f} "
            "MiB during"
        )
        print(
            f"{SPLIT_ROWS}-row dataframe_split to a pipeline with a string column (one server, {args.runs} runs, "
            "raw onnxruntime on the same arrays before each):"
        )
        split = split_row(scratch, script, args.runs, args.duration_sec, args.http_server)

    ours_init = lambda_init_sec("servestack.adapters.serverless", max(args.runs, 5))
    naive_init = lambda_init_sec("bench.naive_lambda", max(args.runs, 5))
    print("Lambda init (import + model load, .pyc present), median:")
    print(f"  servestack {median(ours_init) * 1000:.0f} ms; naive FastAPI + Mangum {median(naive_init) * 1000:.0f} ms")

    ratios = median_ratios(runs)
    print(f"ratios (each the median of the {args.runs} runs' own ratios):")
    print(
        f"  ours / naive FastAPI, 1-row JSON at 64 connections: {ratios['naive']:.2f}x "
        f"(p99 {mine[('1-row JSON', 64)].p99_ms:.2f} ms vs {base[('1-row JSON', 64)].p99_ms:.2f} ms)"
    )
    print(f"  ours / raw ceiling ({interface(args.http_server)}) at 64 connections: {ratios['ceiling']:.2f}")
    if "asgi_ceiling" in ratios:
        print(f"  ours / granian's raw ASGI ceiling at 64 connections: {ratios['asgi_ceiling']:.2f}")
    print(f"  ours 1-connection p50: {mine[('1-row JSON', 1)].p50_ms:.2f} ms")
    print(f"  ours 32-row npy rows/s / raw onnxruntime at batch 32: {ratios['npy_raw']:.2f}")
    ratios["ceiling_interleaved"], ratios["npy_raw_interleaved"] = (median(paired[k]) for k in ("ceiling", "npy_raw"))
    print(
        f"  the same two, interleaved (median of {args.pairs} pairs): ours / raw ceiling "
        f"{ratios['ceiling_interleaved']:.2f}; 32-row npy / raw onnxruntime {ratios['npy_raw_interleaved']:.2f}"
    )
    print(
        f"  overload 2xx p99 / 64-connection p99: {over['over_p99x']:.2f}x immediate retries, "
        f"{over['polite_p99x']:.2f}x honouring Retry-After; "
        f"RSS change {100 * (over['rss_max_mib'] / over['rss_before_mib'] - 1):+.1f}% max, "
        f"{100 * (over['rss_min_mib'] / over['rss_before_mib'] - 1):+.1f}% min"
    )
    print(f"  Lambda init ours / naive: {median(ours_init) / median(naive_init):.2f}")
    print_issue13_table(raw, mine, ratios, over, args.http_server)
    print(f"issue 23 row (servestack on {interface(args.http_server)}, one server core; target in brackets):")
    print_split_row(split)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "raw_rows_per_sec": raw,
                    "http": {
                        f"{name} {payload} c={c}": vars(r)
                        for name, results in (("ceiling", ceil), ("naive", base), ("ours", mine))
                        for (payload, c), r in results.items()
                    },
                    "overload": over,
                    "ratios": ratios,
                    "interleaved": paired,
                    "lambda_init_sec": {"ours": ours_init, "naive": naive_init},
                    "dataframe_split_32": split,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
